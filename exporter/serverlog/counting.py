"""A target's server log, read between scrapes: a thread follows it, finds the advisory-lock
events in its records and counts them; the counts are series of the target (a collection
reads pg_locks; this, what happened between two of them)."""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from pg_advisory_exporter import logs
from pg_advisory_exporter.keys.appnames import OTHER, RewriteRule, rewrite
from pg_advisory_exporter.keys.registry import Registry
from pg_advisory_exporter.metrics import Sample

from . import events
from .follower import Follower, Status
from .records import Format, parser

log = logging.getLogger(__name__)

# Seconds between two reads of a log that had nothing new; a log that has more is read on
# at once, a chunk at a time, so a burst is caught up with as fast as it can be parsed.
POLL = 1.0
# The files each format makes in the server's log_directory.
SUFFIXES = {"jsonlog": ".json", "csvlog": ".csv", "stderr": ".log"}
# What a record does not say (a format without the database, say).
UNKNOWN = "unknown"
# The waits logged as begun and not yet as ended, by the waiting process (a backend awaits one
# lock at a time), whose repeated "still waiting" (a waiter woken before its lock is granted
# logs it again) is not another wait; the oldest forgotten past this many. A wait given up
# with an error (lock_timeout, statement_timeout, a cancel) logs no end: the process's next
# error ends it.
_OPEN_WAITS = 10_000
_ENDS_A_WAIT = frozenset({"ERROR", "FATAL", "PANIC"})

# The counter each event adds to; waits by key too.
_COUNTERS = {
    events.Kind.UNLOCK_NOT_HELD: "pg_advisory_log_unlocks_not_held_total",
    events.Kind.OUT_OF_SHARED_MEMORY: "pg_advisory_log_out_of_shared_memory_total",
    events.Kind.DEADLOCK: "pg_advisory_log_deadlocks_total",
    events.Kind.LOCK_WAIT: "pg_advisory_log_lock_waits_total",
    events.Kind.LOCK_WAIT_ENDED: "pg_advisory_log_lock_wait_seconds_total",
}
_BY_KEY = frozenset({events.Kind.LOCK_WAIT, events.Kind.LOCK_WAIT_ENDED})
# A wait for an extension's own lock (keys/extension_tags.py) counts here, by extension, and
# its duration nowhere: it is none of the application's waits.
_EXTENSION_WAITS = "pg_advisory_log_extension_lock_waits_total"
_NONE = object()  # no open wait for a process (a wait's lock may itself be None)


class LogSource(Protocol):
    """Where a server's log is and how it is written (the configuration's server_log)."""

    @property
    def path(self) -> Path | None: ...

    @property
    def format(self) -> Format: ...

    @property
    def line_prefix(self) -> str: ...


class StableLabels:
    """Label values as they come, up to `limit` distinct with OTHER among them (as the
    snapshot's cap counts), then OTHER for every new one,
    for good: a counter's label set must never change under it, and nothing a log line says
    can raise the series' cardinality past the cap."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._kept: set[str] = set()

    def label(self, value: str) -> str:
        if value in self._kept:
            return value
        if len(self._kept) < self._limit - 1:
            self._kept.add(value)
            return value
        return OTHER


class ServerLog:
    """One target's server log: followed on a thread of its own from its end (counters start
    at zero), its events counted by database, application_name (rewritten and capped as the
    snapshot's series are) and, for waits, the registry's key name ("" for a key it lacks)."""

    def __init__(
        self,
        target: str,
        settings: LogSource,
        rules: Sequence[RewriteRule],
        limit: int,
        registry: Callable[[], Registry],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        assert settings.path is not None, "a server log is read where it has a path"
        self._target = target
        self._rules = rules
        self._registry = registry
        self._follower = Follower(settings.path, suffix=SUFFIXES[settings.format], clock=clock)
        self._parser = parser(settings.format, settings.line_prefix)
        self._applications = StableLabels(limit)
        self._databases = StableLabels(limit)
        self._lock = threading.Lock()  # guards the counts, read by scrapes
        self._counts: dict[tuple[str, tuple[str, ...]], float] = defaultdict(float)
        self._open_waits: dict[int | None, events.LockTag | None] = {}
        self._lines = 0
        self._unparsed = 0
        self._said = logs.Changes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"server-log {target}", daemon=True)

    def start(self) -> None:
        """Read on a thread of its own from now on (tests call read() instead)."""
        self._thread.start()

    def samples(self) -> list[Sample]:
        """The counts, and whether the log can be read."""
        status = self._follower.status()
        name = (self._target,)
        with self._lock:
            samples = [
                Sample("pg_advisory_log_up", name, status.readable),
                Sample("pg_advisory_log_lines_total", name, self._lines),
                Sample("pg_advisory_log_unparsed_lines_total", name, self._unparsed),
            ]
            samples += [Sample(metric, labels, v) for (metric, labels), v in self._counts.items()]
        return samples

    def close(self) -> None:
        self._stop.set()
        self._follower.close()

    def read(self) -> int:
        """Read what is new in the log, once; the lines read. One caller at a time: the
        thread start() starts, or a test."""
        lines = self._follower.lines()
        records = [found for line in lines for found in self._parser.feed(line)]
        if not lines:
            records += self._parser.flush()  # a quiet log: its last record is complete
        # Labels (rewrites, the registry) worked out before the lock that scrapes wait on.
        found = [
            (record, [(event, self._labels(event)) for event in events.events(record)])
            for record in records
        ]
        with self._lock:
            self._lines += len(lines)
            self._unparsed = self._parser.unparsed
            for record, counted in found:
                for event, labels in counted:
                    self._count(event, record.pid, labels)
                if record.severity in _ENDS_A_WAIT:
                    self._open_waits.pop(record.pid, None)
        self._say(self._follower.status())
        return len(lines)

    def _labels(self, event: events.Event) -> tuple[str, ...]:
        """An event's labels: the target, database, application and, for waits, key."""
        given = event.application_name
        application = UNKNOWN if given is None else rewrite(given, self._rules)
        database = event.database or UNKNOWN
        labels = (
            self._target,
            self._databases.label(database),
            self._applications.label(application),
        )
        if event.kind not in _BY_KEY:
            return labels
        extension = None if event.lock is None else event.lock.extension
        return (*labels, extension if extension is not None else self._key_name(event, database))

    def _count(self, event: events.Event, pid: int | None, labels: tuple[str, ...]) -> None:
        """With the lock held: add one event to its counter. A wait counts once, at the first
        of its lines seen: its beginning, or its end where the beginning came before the
        exporter started (or the victim of a deadlock, which logs only its end)."""
        if event.kind not in _BY_KEY:
            self._counts[_COUNTERS[event.kind], labels] += 1
            return
        begun = self._open_waits.get(pid, _NONE) == event.lock
        extension = event.lock is not None and event.lock.extension is not None
        if event.kind is events.Kind.LOCK_WAIT_ENDED:
            self._open_waits.pop(pid, None)
            if not extension:
                self._counts[_COUNTERS[event.kind], labels] += event.seconds or 0.0
        elif not begun:
            self._open_waits.pop(pid, None)  # re-inserted last: the oldest go first
            self._open_waits[pid] = event.lock
            if len(self._open_waits) > _OPEN_WAITS:
                del self._open_waits[next(iter(self._open_waits))]
        if not begun:
            waits = _EXTENSION_WAITS if extension else _COUNTERS[events.Kind.LOCK_WAIT]
            self._counts[waits, labels] += 1

    def _key_name(self, event: events.Event, database: str) -> str:
        """The registry's name of the awaited key ("" where it has none)."""
        if event.lock is None:
            return ""
        tag = event.lock
        key = self._registry().lookup(tag.objsubid, tag.classid, tag.objid, database)
        return "" if key is None else key.name

    def _say(self, status: Status) -> None:
        """A line when the log becomes readable or not, not at every read."""
        error = status.error
        if not self._said.changed("server log", error):
            return
        if error is None:
            log.info("reading the server's log", extra={"target": self._target})
        else:
            log.warning(
                "cannot read the server's log", extra={"target": self._target, "error": error}
            )

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                read = self.read()
            except Exception:  # a bug must not end the reading for good, nor the exporter
                log.exception("reading the server's log failed", extra={"target": self._target})
                read = 0
            if not read:
                self._stop.wait(POLL)
