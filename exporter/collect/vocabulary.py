"""The words for a backend and its advisory locks, one spelling wherever they are shown
(metric labels, `check`, /locks, the demo): lock modes, states, ages, and the rules for
when its locks are certainly session-level and when they are stranded."""

from __future__ import annotations

import functools
import re

from pg_advisory_exporter.durations import format_duration

# pg_locks.mode of an advisory lock (an advisory lock takes no other mode), and its word.
EXCLUSIVE_LOCK, SHARE_LOCK = "ExclusiveLock", "ShareLock"
MODES = {EXCLUSIVE_LOCK: "exclusive", SHARE_LOCK: "share"}
EXCLUSIVE, SHARE = MODES[EXCLUSIVE_LOCK], MODES[SHARE_LOCK]

# What privileges hide (without pg_read_all_stats): the state of a backend inside a
# transaction, where it could be in any state, and the time it has been in it.
UNKNOWN = "unknown"
NOTHING = "-"  # where a value is missing, hidden or empty
# The states of a backend that finished its work: a lock it still holds may be leaked.
IDLE_STATES = frozenset({"idle", "idle_in_transaction", "idle_in_transaction_aborted"})


def mode_word(mode: str) -> str:
    """The word for a pg_locks mode: "ExclusiveLock" -> "exclusive", "ShareLock" -> "share"."""
    return MODES.get(mode, mode)


def certainly_session_level(outside_transaction: bool, state: str | None) -> bool:
    """Whether every advisory lock a backend holds is session-level: outside any transaction
    (no virtualxid lock of its own, its locks' virtual transaction "n/0"; or idle) it can hold
    no other kind. Inside one, pg_locks cannot tell the two kinds apart."""
    return outside_transaction or state == "idle"


def state_word(state: str | None, outside_transaction: bool) -> str:
    """pg_stat_activity.state in snake_case ("idle in transaction (aborted)" ->
    "idle_in_transaction_aborted"), the `state` label's value.

    Where privileges hide it: "idle" for a backend outside any transaction (every statement
    runs in one, and pg_locks shows that to any role), else "unknown".
    """
    if state is not None:
        return _snake_case(state)
    return "idle" if outside_transaction else UNKNOWN


@functools.lru_cache(maxsize=64)  # a handful of states, met at every collection per backend
def _snake_case(state: str) -> str:
    return "_".join(re.findall(r"[a-z0-9]+", state.lower()))


def level_word(session_level: bool) -> str:
    """The kind of a backend's locks, as far as pg_locks tells."""
    return "session" if session_level else "session or transaction"


def stranded(held: int, session_level: bool, shared: bool) -> bool:
    """Whether a backend's locks are stranded: session locks on a pooled connection that
    passes from client to client (`shared`), so that they outlive the client that took them."""
    return held > 0 and session_level and shared


def format_age(seconds: float | None) -> str:
    """How long something has lasted, measured on a server, for people, in one format
    wherever it is shown (`check`, /locks, the demo): to a tenth of a second under a minute
    ("4.2s", "0.3s"), to the second from there as Prometheus writes a duration ("1m30s",
    "1h2m5s"); "unknown" where privileges hide it."""
    if seconds is None:
        return UNKNOWN
    tenths = round(seconds * 10)
    if abs(tenths) < 600:
        return f"{tenths / 10:g}s"
    return format_duration(seconds, 1.0)


def format_held(seconds: float | None, at_least: bool) -> str:
    """How long a lock has been held (collect/holds.py), "at least" where the exporter did
    not see the hold begin."""
    if seconds is None:
        return NOTHING
    return ("at least " if at_least else "") + format_age(seconds)
