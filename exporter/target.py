"""One watched server: its collections, shared by the scrapes that ask for them, and what the
last one found."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import partial
from urllib.parse import quote

import psycopg

from .config import TargetSettings
from .connection import ServerConnection
from .endpoints import LOCKS_PATH
from .forensics import Answer, on_demand
from .kept_connection import CannotCollect
from .metrics import Sample, locks_page_info, server_samples, target_series
from .poolers import Poolers, PoolerView
from .scheduling import CollectionPool, Priority, Task, Watchdog
from .snapshot import ServerSnapshot, read_snapshot

log = logging.getLogger(__name__)

# Seconds of a collection's deadline kept back from its poolers' reads, so that a pooler that
# does not answer never makes the server's series late.
_POOLER_MARGIN = 0.5
# The most a collection waits for its poolers, in all, after the server's read: 0.5s, and at
# most a quarter of the deadline. A console answers SHOW from memory in milliseconds; one
# that does not answer would otherwise hold a collection worker, and a fleet behind hung
# poolers would starve the pool (docs/forensics.md, "Session locks stranded in a pool").
POOLER_WAIT = 0.5
_POOLER_SHARE = 0.25


@dataclass(frozen=True)
class Collection:
    """The outcome of one collection from one server."""

    finished_at: float  # monotonic clock
    duration: float
    samples: list[Sample] = field(default_factory=list)  # server series; empty on failure
    error: str | None = None
    insufficient_privilege: bool | None = None
    folded_application_names: int = 0

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class Health:
    target: str
    up: bool
    last_collection_unix: float | None
    last_success_unix: float | None
    duration_seconds: float | None
    error: str | None


class Target:
    """Collections for one server, shared by every scrape that arrives close together.

    A scrape that finds a collection running waits for it; one that comes within
    `min_interval` of the last collection gets that collection. So any number of
    Prometheus replicas and dashboards cause at most one read of pg_locks per interval.
    Each collection runs on the pool, one at a time, within a deadline the watchdog keeps.
    """

    def __init__(
        self,
        config: TargetSettings,
        pool: CollectionPool,
        watchdog: Watchdog,
        external_url: str | None = None,
    ) -> None:
        self.name = config.name
        # Where the target's /locks page is, where the exporter knows its own URL: a series
        # for alert descriptions to link to, made once here rather than at every scrape.
        self._locks_page = (
            []
            if external_url is None
            else [
                locks_page_info(self.name, f"{external_url}{LOCKS_PATH}?target={quote(self.name)}")
            ]
        )
        # The /locks answers, read on request only; a reload that changes the target makes a
        # new Target, and with it new answers.
        self._locks = on_demand(config, watchdog)
        self.config = config
        self.settings = config.collection
        self._pool = pool
        self._watchdog = watchdog
        self._server = ServerConnection(config)
        self._poolers = Poolers(config.poolers, self.settings)
        self._rules = [rule.rule() for rule in self.settings.application_name_rewrites]
        # Shared between scrapes, the collection and the watchdog; guarded by _state.
        self._state = threading.Lock()
        self._task: Task[Collection] | None = None  # queued or running
        self._task_submitted = 0.0
        self._generation = 0  # which collection a deadline belongs to
        self._expired = False  # the running collection passed its deadline
        self._last: Collection | None = None
        self._last_success_unix: float | None = None
        self._last_collection_unix: float | None = None
        self._errors_total = 0
        # Used by the collection only, and collections of one target never overlap.
        self._warned_privilege = False
        self._logged_error: str | None = None
        self._pooler_errors: dict[str, str | None] = {}

    # -- scrapes ---------------------------------------------------------------------------

    def begin(
        self, urgent: bool = False, queue: list[tuple[Task[Collection], Priority]] | None = None
    ) -> Collection | Future[Collection]:
        """The last collection if it is recent enough, else the running (or a new) one.

        While a failed connection waits out its backoff, the failure is the answer: no
        worker is needed for it, so a fleet of unreachable servers costs next to nothing.
        A new collection goes to the pool at once, or onto `queue` for the caller to
        enqueue with the rest of a fleet's.
        """
        now = time.monotonic()
        with self._state:
            if self._task is not None:
                if urgent:
                    self._pool.expedite(self._task)
                return self._task.future
            last = self._last
            if last is not None and (
                now - last.finished_at < self.settings.min_interval or self._server.backing_off(now)
            ):
                return last
            self._generation += 1
            self._task_submitted = now
            if urgent:
                priority = Priority.URGENT
            elif last is None:
                priority = Priority.NEW
            elif not last.ok:
                priority = Priority.SUSPECT
            else:
                priority = Priority.ROUTINE
            self._task = Task(partial(self._collect, self._generation))
            if queue is None:
                self._pool.enqueue([(self._task, priority)])
            else:
                queue.append((self._task, priority))
            return self._task.future

    def late(self) -> Collection:
        """What a scrape reports when the collection is not done in time (it is not recorded:
        the collection goes on, and is recorded when it ends or its deadline passes)."""
        now = time.monotonic()
        with self._state:
            submitted = self._task_submitted
        return Collection(now, now - submitted, error="collection timed out")

    def series(self, collection: Collection) -> list[Sample]:
        """All series of this target for one scrape."""
        with self._state:
            errors, last_success = self._errors_total, self._last_success_unix
        return (
            target_series(
                self.name,
                collection.samples,
                duration=collection.duration,
                errors_total=errors,
                last_success_unix=last_success,
                insufficient_privilege=collection.insufficient_privilege,
                folded_application_names=collection.folded_application_names,
            )
            + self._locks_page
        )

    def locks(self) -> tuple[Answer, float]:
        """Who holds and awaits advisory locks now, and the answer's age (forensics.OnDemand):
        read in the caller's thread (a /locks request's), never on the collection pool."""
        return self._locks.get()

    def health(self) -> Health:
        with self._state:
            last = self._last
            return Health(
                target=self.name,
                up=last is not None and last.ok,
                last_collection_unix=self._last_collection_unix,
                last_success_unix=self._last_success_unix,
                duration_seconds=None if last is None else last.duration,
                error=None if last is None else last.error,
            )

    def close(self) -> None:
        """Close the connection; one in use is interrupted, and its collection closes it."""
        self._server.close()
        self._poolers.close()

    # -- collection (one at a time, on the pool) -------------------------------------------

    def _collect(self, generation: int) -> Collection:
        started = time.monotonic()
        alarm = self._watchdog.arm(self.settings.scrape_wait, partial(self._expire, generation))
        try:
            with self._server.use():
                collection = self._read(started)
        except Exception:  # never let one target's bug take the exporter down
            log.exception("collection failed unexpectedly", extra={"target": self.name})
            collection = self._failed(started, "internal error, see the exporter's log")
        finally:
            self._watchdog.disarm(alarm)
        with self._state:
            expired = self._expired
            self._expired = False
        if expired:  # an interrupted connection is never used again
            self._server.drop()
        with self._state:
            self._last = collection
            self._task = None
            self._last_collection_unix = time.time()
            if collection.ok:
                self._last_success_unix = self._last_collection_unix
        return collection

    def _expire(self, generation: int) -> None:
        """The watchdog's call when a collection passes its deadline."""
        with self._state:
            if self._generation != generation or self._task is None:
                return  # that collection has ended
            self._expired = True
        log.warning(
            "collection passed its deadline; cancelling it and closing the connection",
            extra={"target": self.name, "deadline_seconds": self.settings.scrape_wait},
        )
        self._server.interrupt()

    def _read(self, started: float) -> Collection:
        reused = self._server.is_open()
        try:
            try:
                snapshot = self._snapshot()
            except psycopg.Error as exc:
                if not (reused and self._connection_lost()):
                    raise
                # A server restart or a terminated backend leaves a dead connection behind;
                # the first collection after it reconnects at once instead of reporting
                # the target down.
                log.info(
                    "the connection was lost; reconnecting",
                    extra={"target": self.name, "error": self._server.redact(str(exc).strip())},
                )
                self._server.drop()
                snapshot = self._snapshot()
        except CannotCollect as exc:
            self._server.drop()
            return self._failed(started, str(exc))
        except psycopg.Error as exc:
            if self._connection_lost():
                self._server.drop()
            return self._failed(started, self._describe(exc))
        return self._succeeded(started, snapshot, self._read_poolers(started))

    def _read_poolers(self, started: float) -> tuple[PoolerView, ...]:
        """The poolers, read after the server (so that they know its backends) for at most
        POOLER_WAIT of what is left of the collection's time: a pooler never fails the
        server's series, nor holds its worker for long."""
        if not self._poolers:
            return ()
        left = self.settings.scrape_wait - _POOLER_MARGIN - (time.monotonic() - started)
        budget = min(left, POOLER_WAIT, self.settings.scrape_wait * _POOLER_SHARE)
        try:
            views = self._poolers.read(self._watchdog, budget)
        except Exception as exc:  # no thread to read them in, say: theirs, not the server's
            error = f"cannot read: {type(exc).__name__}: {exc}"
            views = tuple(PoolerView(c.name, error) for c in self.config.poolers)
        for view in views:  # once per distinct error, as for the server
            if view.error != self._pooler_errors.get(view.name):
                if view.error is None:
                    log.info("pooler read again", extra={"target": self.name, "pooler": view.name})
                else:
                    log.warning(
                        "cannot read the pooler",
                        extra={"target": self.name, "pooler": view.name, "error": view.error},
                    )
            self._pooler_errors[view.name] = view.error
        return views

    def _snapshot(self) -> ServerSnapshot:
        conn = self._server.connection()
        snapshot = read_snapshot(conn, self._server.registry)
        self._server.saw_databases(snapshot.deadlocks)  # a new one: catalog keys next time
        return snapshot

    def _connection_lost(self) -> bool:
        with self._state:
            expired = self._expired
        return not expired and self._server.lost()

    def _describe(self, exc: psycopg.Error) -> str:
        with self._state:
            expired = self._expired
        if expired:
            return (
                f"{self._server.unanswered(self.settings.scrape_wait)} (the collection's "
                "deadline); the statement was cancelled and the connection closed"
            )
        return self._server.redact(str(exc).strip())

    def _succeeded(
        self, started: float, snapshot: ServerSnapshot, poolers: tuple[PoolerView, ...]
    ) -> Collection:
        self._check_privilege(snapshot)
        mapped = server_samples(
            self.name,
            snapshot,
            self._rules,
            self.settings.application_name_limit,
            self._server.registry,
            poolers=poolers,
        )
        finished = time.monotonic()
        if self._logged_error is not None:
            log.info("collection succeeded again", extra={"target": self.name})
            self._logged_error = None
        return Collection(
            finished_at=finished,
            duration=finished - started,
            samples=mapped.samples,
            insufficient_privilege=not snapshot.can_read_all_stats,
            folded_application_names=mapped.folded_application_names,
        )

    def _failed(self, started: float, error: str) -> Collection:
        with self._state:
            self._errors_total += 1
        # Once per distinct error: a fleet of servers that stay down must not flood the log.
        if error != self._logged_error:
            log.error("collection failed", extra={"target": self.name, "error": error})
            self._logged_error = error
        else:
            log.debug("collection failed again", extra={"target": self.name, "error": error})
        finished = time.monotonic()
        return Collection(finished, finished - started, error=error)

    def _check_privilege(self, snapshot: ServerSnapshot) -> None:
        if snapshot.can_read_all_stats:
            self._warned_privilege = False
        elif not self._warned_privilege:
            self._warned_privilege = True
            role = self._server.role
            log.warning(
                "the monitoring role cannot see other sessions' state: states are reported "
                "as unknown and idle holders' ages are missing; fix with "
                f'GRANT pg_read_all_stats TO "{role}"',
                extra={"target": self.name, "role": role},
            )
