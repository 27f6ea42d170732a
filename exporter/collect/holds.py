"""How long each advisory lock has been held.

PostgreSQL records when a backend started, when its transaction started and when it entered
its current state, but not when it took a lock. So the time a lock has been held is bounded
from what the exporter has seen and what the server says:

- at least since the first collection that saw the backend (its pid and start) hold it, each
  collection since seeing it hold it still (a collection that sees it without the lock ends
  the hold);
- at least since the backend went idle, when it is idle: a lock is only taken by a statement;
- never before the backend started, and, for a lock taken at transaction level (the key's
  `level`), never before its transaction started: seen again in a newer transaction, such a
  lock was taken anew.

Time in the current state (`state_change`) starts over at every statement: a migration of
many short statements, or a job that works for hours, shows a few seconds there. That time
stays the leak signal (how long a session has sat idle on its lock); this is the hold time.

"Any advisory lock" is tracked per backend too (the holder's hold time in `check` and /locks):
the backend has held at least one advisory lock at every collection since. A backend that takes
a new transaction-level lock in every transaction, and is seen holding one each time, counts as
holding throughout.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from pg_advisory_exporter.keys.key_config import Level
from pg_advisory_exporter.keys.registry import Registry

from .snapshot import BackendLocks, ServerSnapshot, counted_uses
from .vocabulary import IDLE_STATES, certainly_session_level, state_word

# The most holds tracked per server: about 200 bytes each, so at most about 10 MB. A server
# past it (thousands of backends, each holding many registered keys) keeps the holds it
# tracked already; the others are bounded from the server's timestamps alone at each
# collection, and counted (pg_advisory_exporter_untracked_holds).
MAX_TRACKED = 50_000

# A backend across collections: its pid and when it started (Unix time; None where privileges
# hide it, and then a pid reused by a new backend is taken for the old one).
Identity = tuple[int, float | None]
# What is held: a registered key's name, or None for "any advisory lock".
HoldKey = tuple[int, float | None, str | None]


@dataclass(frozen=True)
class Hold:
    """Since when something has been held (Unix time, on the server's clock), and whether the
    exporter saw it begin (within one collection) or only found it held when it started
    watching the server (then it may have been held longer)."""

    since: float
    seen_begin: bool
    # The holder's transaction when the hold began (Unix time; None outside one): a
    # transaction-level lock seen in a newer transaction was taken anew.
    transaction: float | None = None

    def seconds(self, now: float) -> float:
        return max(now - self.since, 0.0)


@dataclass(frozen=True)
class Holder:
    """What the server says of a backend that bounds its holds."""

    pid: int
    backend_start: float | None  # Unix time; None where privileges hide it
    xact_start: float | None  # None outside a transaction, or where privileges hide it
    state: str | None  # pg_stat_activity.state ("idle in transaction")
    state_seconds: float | None  # time in that state; None where privileges hide it
    in_transaction: bool

    @property
    def identity(self) -> Identity:
        return self.pid, self.backend_start

    @property
    def session_level(self) -> bool:
        """Whether every lock it holds is certainly session-level."""
        return certainly_session_level(not self.in_transaction, self.state)

    @classmethod
    def of(cls, backend: BackendLocks) -> Holder:
        return cls(
            backend.pid,
            backend.backend_start,
            backend.xact_start,
            backend.state,
            backend.state_seconds,
            backend.in_transaction,
        )


def hold_of(
    holder: Holder, now: float, level: Level | None, tracked: Hold | None, watching: bool
) -> Hold:
    """The hold of one lock (or of any lock) of `holder` at `now`: `tracked` is what the
    collections before saw (None: not held then), `watching` whether one did see the server
    (then a hold it did not see began since)."""
    transaction = holder.xact_start if holder.in_transaction else None
    # A transaction-level lock goes with its transaction: in another one, it is a new hold.
    retaken = (
        tracked is not None
        and level == "transaction"
        and transaction is not None
        and tracked.transaction != transaction
    )
    if tracked is None or retaken:
        since, seen_begin, began_in = now, watching, transaction
    else:
        since, seen_begin, began_in = tracked.since, tracked.seen_begin, tracked.transaction
    idle = state_word(holder.state, not holder.in_transaction) in IDLE_STATES
    if idle and holder.state_seconds is not None:
        since = min(since, now - holder.state_seconds)  # held since before it went idle
    floor = holder.backend_start
    if level == "transaction" and transaction is not None:
        floor = transaction if floor is None else max(floor, transaction)
    if floor is not None and since < floor:
        since = floor
    return Hold(since, seen_begin, began_in)


@dataclass(frozen=True)
class Holds:
    """The holds of one collection: of each backend holding advisory locks, and of each
    registered key it holds."""

    now: float  # the server's clock when the collection read pg_locks (Unix time)
    by_key: Mapping[HoldKey, Hold]
    untracked: int = 0  # holds that MAX_TRACKED kept from being tracked

    def get(self, identity: Identity, name: str | None = None) -> Hold | None:
        return self.by_key.get((*identity, name))


NO_HOLDS = Holds(0.0, {})


def _held(
    snapshot: ServerSnapshot, registry: Registry
) -> Iterator[tuple[Holder, str | None, Level | None]]:
    """Each backend holding advisory locks (its name None), and each registered key it holds."""
    for backend in snapshot.backends:
        if not backend.held:
            continue
        holder = Holder.of(backend)
        yield holder, None, None
        for key, use in counted_uses(backend, registry):
            if use.held:
                yield holder, key.name, key.config.level


class HoldTracker:
    """The holds of one server from one collection to the next (a collection at a time)."""

    def __init__(self, cap: int = MAX_TRACKED) -> None:
        self._cap = cap
        self._holds: dict[HoldKey, Hold] = {}
        self._watching = False  # a collection has seen the server

    def update(self, snapshot: ServerSnapshot, registry: Registry) -> Holds:
        """The holds as this collection sees them; those it does not see are over. The holds
        tracked already are kept first, so that reaching the cap never ends one."""
        now = snapshot.read_at
        found: dict[HoldKey, Hold] = {}
        new: list[tuple[HoldKey, Holder, Level | None]] = []
        for holder, name, level in _held(snapshot, registry):
            key = (*holder.identity, name)
            tracked = self._holds.get(key)
            if tracked is None:
                new.append((key, holder, level))
            else:
                found[key] = hold_of(holder, now, level, tracked, self._watching)
        untracked = 0
        kept = dict(found)
        for key, holder, level in new:
            hold = hold_of(holder, now, level, None, self._watching)
            found[key] = hold
            if len(kept) < self._cap:
                kept[key] = hold
            else:
                untracked += 1
        self._holds, self._watching = kept, True
        return Holds(now, found, untracked)
