"""One /locks read as a model: backends and their advisory locks, waiters, contended keys."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from pg_advisory_exporter.alerting.rules import Thresholds
from pg_advisory_exporter.collect import vocabulary
from pg_advisory_exporter.collect.pg_stat_statements import StatementsRead
from pg_advisory_exporter.collect.poolers import PooledBackend, PoolerView
from pg_advisory_exporter.hygiene.callers import Caller
from pg_advisory_exporter.keys.idle_by_design import BY_DESIGN_STATE
from pg_advisory_exporter.keys.key import AdvisoryKey

# When an idle holder is marked as the leak alert's (PgAdvisoryLockLeaked's default threshold):
# the page cannot know the thresholds of the rules a shop deploys.
LEAK_AFTER = Thresholds().leaked_lock_after


@dataclass(frozen=True)
class LockEntry:
    """One pg_locks row of a backend: a key in a database, in one mode, held or awaited."""

    database: int  # the oid: with the key, what two backends must share to conflict
    key: AdvisoryKey
    mode: str  # the word of its mode: vocabulary.EXCLUSIVE or SHARE
    granted: bool
    wait_start: datetime | None = None  # awaited only; NULL for a moment after a wait begins
    wait_seconds: float | None = None  # awaited only
    key_name: str | None = None  # from the key registry or the catalog, or packed in the key
    catalog: bool = False  # the name is the built-in catalog's
    packed: bool = False  # the name was read from the key itself (keys/packed_names.py)
    held_seconds: float | None = None  # held, of a named key: how long (collect/holds.py)
    long_lived: bool = False  # the key's holder is idle on purpose (a leader, a migration)

    @property
    def lock(self) -> tuple[int, AdvisoryKey]:
        return self.database, self.key


@dataclass(frozen=True)
class Backend:
    """One backend that holds or awaits advisory locks."""

    pid: int
    datname: str
    application_name: str  # raw: as the client set it
    client_addr: str | None  # None for a Unix socket, or where privileges hide it
    client_port: int | None
    backend_start: datetime | None
    state: str | None  # None where privileges hide it
    state_seconds: float | None
    xact_start: datetime | None
    session_level: bool  # every advisory lock it holds is certainly session-level
    lock_entries: int  # all of them, held and awaited, listed or not
    locks: tuple[LockEntry, ...]  # those listed: the awaited one and contended keys first
    query: str | None = None  # only where the target's locks_page.query_text is on
    # What the annotations of its last statement name (hygiene/callers.py), whatever
    # query_text says: shown, never a label.
    caller: Caller | None = None
    pooled: PooledBackend | None = None
    # How long it has held advisory locks (collect/holds.py); None if it holds none. At least
    # that long where the exporter did not see the hold begin (it found it held).
    held_seconds: float | None = None
    held_at_least: bool = False
    # The name the series give it (the target's rewrites applied); "" where none was made.
    rewritten_name: str = ""
    # The entry idle by design that names its application (keys/idle_by_design.py); "" for
    # none: its idle holds are judged by that entry's max_hold, not as a leak.
    idle_by_design: str = ""

    @property
    def series_name(self) -> str:
        """Its application_name as the series and alerts show it."""
        return self.rewritten_name or self.application_name

    @property
    def leak_suspect(self) -> bool:
        """Idle (or idle in a transaction) holding locks longer than PgAdvisoryLockLeaked's
        default threshold, and not all of them long-lived keys' (a leader's, a migration's):
        the holder the leak alert would be about (an application idle by design, idle, is not)."""
        if self.state_seconds is None or self.state_seconds < LEAK_AFTER or not self.held:
            return False
        if self.idle_by_design and self.state_word == BY_DESIGN_STATE:
            return False
        exempt = not self.held_left_out and all(lock.long_lived for lock in self.held)
        return self.state_word in vocabulary.IDLE_STATES and not exempt

    @property
    def awaited(self) -> LockEntry | None:
        return next((lock for lock in self.locks if not lock.granted), None)

    @property
    def held_entries(self) -> int:
        return self.lock_entries - (self.awaited is not None)

    @property
    def held(self) -> tuple[LockEntry, ...]:
        return tuple(lock for lock in self.locks if lock.granted)

    @property
    def held_left_out(self) -> int:
        return self.held_entries - len(self.held)

    @property
    def stranded(self) -> bool:
        shared = self.pooled is not None and self.pooled.shared
        return vocabulary.stranded(self.held_entries, self.session_level, shared)

    @property
    def level(self) -> str:
        return vocabulary.level_word(self.session_level)

    @property
    def state_word(self) -> str:
        """Its state as the metrics' `state` label names it. Where privileges hide the
        state, session_level says whether it is outside any transaction."""
        return vocabulary.state_word(self.state, self.session_level)

    @property
    def client(self) -> str | None:
        """addr:port (addr alone where the port is hidden); None for a Unix socket."""
        if self.client_addr is None:
            return None
        port = "" if self.client_port is None else f":{self.client_port}"
        return self.client_addr + port

    @property
    def pool(self) -> str | None:
        """The pooler, its pool and the pool's mode, in words; None if no pooler owns it."""
        pooled = self.pooled
        if pooled is None:
            return None
        return " ".join(filter(None, (pooled.pooler, pooled.pool, pooled.pool_mode)))

    @property
    def terminate(self) -> str | None:
        """The statement that would end the backend and release what it holds; shown, never
        run. None for a backend that holds nothing: ending it releases nothing."""
        if not self.held_entries:
            return None
        return f"SELECT pg_terminate_backend({self.pid})"


@dataclass(frozen=True)
class Waiter:
    """A backend waiting for a lock, what holds it back, and who queues ahead of it."""

    backend: Backend
    lock: LockEntry
    blocked_by: tuple[int, ...]  # pids holding the key in a conflicting mode
    queued_behind: tuple[int, ...]  # pids awaiting it in a conflicting mode since earlier


@dataclass(frozen=True)
class ContendedKey:
    """A key somebody waits for, with every holder and waiter of it."""

    datname: str
    key: AdvisoryKey
    key_name: str | None
    holders: tuple[tuple[int, str], ...]  # (pid, mode)
    waiters: tuple[tuple[int, str], ...]  # (pid, mode), the longest waiting first


@dataclass(frozen=True)
class TableHolder:
    """A backend among those holding the most entries of the shared lock table, of every lock
    type: who fills it, with advisory locks or a query's locks on thousands of relations."""

    pid: int
    entries: int
    datname: str
    application_name: str  # raw: as the client set it
    state: str | None  # None where privileges hide it

    @property
    def terminate(self) -> str:
        """The statement that would end it and release its entries; shown, never run."""
        return f"SELECT pg_terminate_backend({self.pid})"


@dataclass(frozen=True)
class Forensics:
    """One read of one server: its advisory lock holders and waiters."""

    target: str
    read_at: float  # unix time
    backends: tuple[Backend, ...]  # waiters, holders of contended keys, the rest
    backends_total: int  # listed or not
    waiters: tuple[Waiter, ...]
    contended: tuple[ContendedKey, ...]
    query_text: bool  # whether query text was asked for
    poolers: tuple[PoolerView, ...] = ()
    # The risky statements of the server's last rare read of pg_stat_statements, if any.
    statements: StatementsRead | None = None
    # Those holding the most of the shared lock table, the most first (read.TABLE_HOLDERS).
    table_holders: tuple[TableHolder, ...] = ()

    @property
    def holders(self) -> tuple[Backend, ...]:
        return tuple(b for b in self.backends if b.held_entries > 0)

    @property
    def backends_left_out(self) -> int:
        return self.backends_total - len(self.backends)
