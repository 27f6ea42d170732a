"""The advisory lock events in the server log's records: what happened between two scrapes
that a snapshot of pg_locks cannot show.

Each is matched whole (fullmatch) against PostgreSQL's English wording (lc_messages = 'C' or
an English locale; ereport's messages are translated, elog's are not), from the source of
14 to 18 and checked against servers of each:

- storage/lmgr/lock.c, LockRelease: elog(WARNING, "you don't own a lock of type %s"), the
  SQLSTATE an elog WARNING gets, 01000.
- lock.c: ERROR 53200 "out of shared memory", hint "You might need to increase
  max_locks_per_transaction." (14, 15; 16 spells it through %s), `... increase
  "max_locks_per_transaction".` (17, 18). The predicate lock table's 53200 names
  max_pred_locks_per_transaction instead, and does not count.
- storage/lmgr/proc.c, ProcSleep (log_lock_waits, after deadlock_timeout): LOG "process %d
  still waiting for %s on %s after %ld.%03d ms", then "acquired", "failed to acquire" or
  "detected deadlock while waiting for" with the same ending. "avoided deadlock for %s on %s
  by rearranging queue order" is followed by one of those within the same check, and is not
  counted apart.
- storage/lmgr/deadlock.c, DeadLockReport: ERROR 40P01 "deadlock detected", its detail a
  line "Process %d waits for %s on %s; blocked by process %d." per process in the cycle,
  then, in the log only, a line "Process %d: <query>" each.

A lock is DescribeLockTag's "advisory lock [%u,%u,%u,%u]": the database OID, the key's high
32 bits (or first int4), its low 32 bits (or second int4), 1 for a bigint key or 2 for two
int4 keys; it is read only where the wording puts a lock, never from a query's text. Any
other fourth number is an extension's own lock (keys/extension_tags.py): its waits are
events of their own (counted by extension), and a deadlock over it alone is the extension's,
not the application's.

A client can RAISE any message, SQLSTATE, detail and hint. Only the location tells its
report from the server's: with log_error_verbosity = verbose a record carries it, and a
record raised anywhere but the file above is no event.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable
from dataclasses import dataclass

from pg_advisory_exporter.keys.extension_tags import extension_of, is_application_key
from pg_advisory_exporter.keys.key import AdvisoryKey

from .records import Record


class Kind(enum.Enum):
    UNLOCK_NOT_HELD = "unlock_not_held"  # an advisory unlock of a lock the session did not hold
    OUT_OF_SHARED_MEMORY = "out_of_shared_memory"  # the lock table was full
    DEADLOCK = "deadlock"  # a deadlock whose cycle has an advisory lock
    LOCK_WAIT = "lock_wait"  # a wait for an advisory lock passed deadlock_timeout
    LOCK_WAIT_ENDED = "lock_wait_ended"  # ... and ended (acquired, or failed), after `seconds`


@dataclass(frozen=True)
class LockTag:
    """An advisory lock as DescribeLockTag writes it: pg_locks' database, classid, objid and
    objsubid."""

    database_oid: int
    classid: int
    objid: int
    objsubid: int

    def key(self) -> AdvisoryKey:
        """The key the application passed."""
        return AdvisoryKey.from_oids(self.classid, self.objid, self.objsubid)

    @property
    def extension(self) -> str | None:
        """The extension whose own lock this is; None for an application's key."""
        return None if is_application_key(self.objsubid) else extension_of(self.objsubid)


@dataclass(frozen=True)
class Event:
    kind: Kind
    database: str | None
    application_name: str | None
    lock: LockTag | None = None  # the advisory lock, for waits and deadlocks
    seconds: float | None = None  # LOCK_WAIT_ENDED: the wait's logged duration


_OID = r"(\d{1,10})"
_ADVISORY = re.compile(rf"advisory lock \[{_OID},{_OID},{_OID},{_OID}\]", re.ASCII)
_MODE = r"[A-Za-z]+"  # a lock mode's name, as GetLockmodeName gives it
_AFTER = r" after (\d{1,15})\.(\d{3}) ms"
_UNLOCK = re.compile(r"you don't own a lock of type (?:ExclusiveLock|ShareLock)")
_WAITING = re.compile(rf"process \d+ still waiting for {_MODE} on (.+){_AFTER}", re.ASCII)
_ENDED = re.compile(
    rf"process \d+ (?:acquired|failed to acquire|detected deadlock while waiting for)"
    rf" {_MODE} on (.+){_AFTER}",
    re.ASCII,
)
_WAITS_FOR = re.compile(
    rf"Process \d+ waits for {_MODE} on (.+); blocked by process \d+\.", re.ASCII
)
# The setting's name, which no translation changes, and which max_pred_locks_per_transaction
# (the predicate lock table's hint) does not contain.
_LOCK_TABLE_HINT = re.compile(r"(?<![A-Za-z0-9_])max_locks_per_transaction(?![A-Za-z0-9_])")
_LOCATION = re.compile(r"(?:.*, )?([^ ,:]+):\d+", re.ASCII)
_ERRORS = frozenset({"ERROR", "FATAL", "PANIC"})  # an ERROR can be promoted where it happens


def events(record: Record) -> list[Event]:
    """The events a record tells of: none, or one."""
    for kind, match, file in _MATCHERS:
        if (found := match(record)) is not None and _raised_in(record, file):
            lock, seconds = found
            return [Event(kind, record.database, record.application_name, lock, seconds)]
    return []


_Found = tuple[LockTag | None, float | None]


def _unlock_not_held(record: Record) -> _Found | None:
    """By its SQLSTATE where the format carries it (the severity's name is translated, this
    message never is), else by the severity."""
    warned = record.sqlstate == "01000" if record.sqlstate else record.severity == "WARNING"
    return (None, None) if warned and _UNLOCK.fullmatch(record.message) else None


def _out_of_shared_memory(record: Record) -> _Found | None:
    """By SQLSTATE where the format carries it (the message is translated), else by the
    English message; by the hint's setting in both."""
    if record.hint is None or not _LOCK_TABLE_HINT.search(record.hint):
        return None
    if record.sqlstate is not None:
        return (None, None) if record.sqlstate == "53200" else None
    if record.severity in _ERRORS and record.message == "out of shared memory":
        return None, None
    return None


def _deadlock(record: Record) -> _Found | None:
    """A deadlock whose cycle waits for an advisory lock: the first the detail names."""
    if record.sqlstate not in (None, "40P01") or record.severity not in _ERRORS:
        return None
    if record.message != "deadlock detected" or record.detail is None:
        return None
    for line in record.detail.split("\n"):
        waits = _WAITS_FOR.fullmatch(line)
        if waits is None:  # past the cycle: the queries, which could say anything
            return None
        if (lock := _lock(waits.group(1))) is not None and lock.extension is None:
            return lock, None
    return None


def _lock_wait(record: Record) -> _Found | None:
    if (waiting := _log(record, _WAITING)) is None:
        return None
    lock = _lock(waiting.group(1))
    return None if lock is None else (lock, None)


def _lock_wait_ended(record: Record) -> _Found | None:
    if (ended := _log(record, _ENDED)) is None:
        return None
    lock = _lock(ended.group(1))
    milliseconds, microseconds = int(ended.group(2)), int(ended.group(3))
    return None if lock is None else (lock, (milliseconds * 1000 + microseconds) / 1e6)


def _log(record: Record, pattern: re.Pattern[str]) -> re.Match[str] | None:
    if record.sqlstate not in (None, "00000") or record.severity != "LOG":
        return None
    return pattern.fullmatch(record.message)


def _lock(description: str) -> LockTag | None:
    """The advisory lock a lock description names, or None for any other lock."""
    found = _ADVISORY.fullmatch(description)
    if found is None:
        return None
    database, classid, objid, objsubid = (int(part) for part in found.groups())
    # The tag's fourth field is a uint16 (lock.h, locktag_field4).
    if max(database, classid, objid) >= 1 << 32 or objsubid >= 1 << 16:
        return None
    return LockTag(database, classid, objid, objsubid)


def _raised_in(record: Record, file: str) -> bool:
    """Whether the record may come from `file`: it does where it carries no location."""
    if record.location is None:
        return True
    found = _LOCATION.fullmatch(record.location)
    return found is not None and found.group(1) == file


_MATCHERS: tuple[tuple[Kind, Callable[[Record], _Found | None], str], ...] = (
    (Kind.UNLOCK_NOT_HELD, _unlock_not_held, "lock.c"),
    (Kind.OUT_OF_SHARED_MEMORY, _out_of_shared_memory, "lock.c"),
    (Kind.DEADLOCK, _deadlock, "deadlock.c"),
    (Kind.LOCK_WAIT, _lock_wait, "proc.c"),
    (Kind.LOCK_WAIT_ENDED, _lock_wait_ended, "proc.c"),
)
