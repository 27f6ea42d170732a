"""One watched PostgreSQL server: its kept connection and its collections, shared by every
target that reads it, and how two names that reach one server are told to be one."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

import psycopg

from pg_advisory_exporter import logs
from pg_advisory_exporter.config.settings import TargetSettings
from pg_advisory_exporter.keys.registry import Registry
from pg_advisory_exporter.sharing import Shared, Turn

from .capacity import FULL_TABLE_REFUSAL, refused_for_full_table
from .collection import Collection, Reading, ReadThrough
from .connection import ServerConnection, ServerIdentity, Unanswered
from .directory import Directory, View
from .holds import HoldTracker
from .kept_connection import CannotCollect
from .pg_stat_statements import Statements, StatementsRead
from .poolers import Poolers
from .scheduling import CollectionPool, Priority, Task, Watchdog
from .snapshot import ServerSnapshot, grant_read_all_stats, read_snapshot

log = logging.getLogger(__name__)

T = TypeVar("T")


class Server:
    """Collections of one server, shared by every target (and scrape) that reads it.

    A scrape that finds a collection running waits for it; one that comes within
    `min_interval` of the last collection gets that collection. So any number of targets,
    Prometheus replicas and dashboards cause at most one read of pg_locks per interval.
    Each collection runs on the pool, one at a time, within a deadline the watchdog keeps.
    A server whose connection turns out to reach a running server that a server of its
    `directory` first in rank reads, closes it and reads through that one (directory.py).
    """

    def __init__(
        self,
        config: TargetSettings,
        pool: CollectionPool,
        watchdog: Watchdog,
        directory: Directory[Server],
        clock: Callable[[], float] = time.monotonic,
        *,
        announce: bool = True,
    ) -> None:
        self.name = config.name
        self.config = config
        self.settings = config.collection
        self._pool = pool
        self._watchdog = watchdog
        self._directory = directory
        self._clock = clock
        # `announce` off: a one-shot command's connection logs no "connected".
        self._connection = ServerConnection(config, announce=announce)
        self._poolers = Poolers(config.poolers, self.settings, name=config.name)
        self._statements = Statements(config, watchdog)
        # The collections, shared by the scrapes that come within min_interval of each other.
        self._collections: Shared[Collection] = Shared(self.settings.min_interval, clock)
        # Shared between scrapes, the collection and the watchdog; guarded by _state.
        self._state = threading.Lock()
        self._task: Task[Collection] | None = None  # the last one queued
        self._last_success_unix: float | None = None
        self._databases: frozenset[str] | None = None  # the last successful collection saw
        self._last_collection_unix: float | None = None
        self._errors_total = 0
        self._closed = False
        # Held by each use of the connection: a collection, or a read between collections.
        self._uses = threading.Lock()
        # Used by the collection only, and collections of one server never overlap.
        self._claimed: ServerIdentity | None = None
        self._holds = HoldTracker()
        # Whether the lock table had room for the exporter to take an entry for a moment, at
        # the last collection (snapshot.room_to_read): what the next one may read beside it.
        self._room = True
        # The entries the lock table held when the server refused this connection's read of
        # its databases for the full table (snapshot.refused_at); a new connection forgets it.
        self._refused_at: int | None = None
        self._said = logs.Changes()

    # -- who reads it ------------------------------------------------------------------------

    def reading_server(self) -> Server:
        """The server whose collections this one's targets get: itself, or the one first in
        rank of those found to reach the same running server (directory.py)."""
        return self._directory.reading_server(self)

    @property
    def directory(self) -> Directory[Server]:
        return self._directory

    @property
    def registry(self) -> Registry:
        """The key registry resolved on its connection."""
        return self._connection.registry

    @property
    def role(self) -> str:
        """The role its connection logged in as (empty before it connected)."""
        return self._connection.role

    @property
    def closed(self) -> bool:
        with self._state:
            return self._closed

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
        reader = self.reading_server()
        if reader is not self and not self._connection.is_open():
            # One read through the other; an open connection of its own is closed first, in
            # a collection of its own (_read), never under a collection running on it.
            return reader.begin(urgent, queue)
        now = self._clock()
        asked = self._collections.ask(fresh=lambda _: self._connection.backing_off(now))
        if isinstance(asked, Future):
            with self._state:
                task = self._task
            if urgent and task is not None:
                self._pool.expedite(task)
            return asked
        if not isinstance(asked, Turn):
            return asked
        last = self._collections.last()
        if urgent:
            priority = Priority.URGENT
        elif last is None:
            priority = Priority.NEW
        elif not last.ok:
            priority = Priority.SUSPECT
        else:
            priority = Priority.ROUTINE
        task = Task(self._collect, asked.future)
        with self._state:
            self._task = task
        if queue is None:
            self._pool.enqueue([(task, priority)])
        else:
            queue.append((task, priority))
        return asked.future

    def late(self) -> Collection:
        """What a scrape reports when the collection is not done in time (it is not recorded:
        the collection goes on, and is recorded when it ends or its deadline passes)."""
        now = self._clock()
        errors, last_collection, last_success = self._counters()
        return Collection(
            now,
            now - self._collections.started(),
            error="collection timed out",
            answering=self._directory.answering(self, self.databases()),
            registry=self.registry,
            errors_total=errors,
            last_collection_unix=last_collection,
            last_success_unix=last_success,
        )

    def last(self) -> Collection | None:
        return self._collections.last()

    def statements(self) -> StatementsRead | None:
        """The last rare read of its pg_stat_statements, if one was made."""
        return self._statements.last()

    def databases(self) -> frozenset[str] | None:
        """The databases its last successful collection saw (templates left out), or None
        before one succeeded."""
        with self._state:
            return self._databases

    def _counters(self) -> tuple[int, float | None, float | None]:
        """Failed collections so far, and the Unix times of the last collection and of the
        last successful one."""
        with self._state:
            return self._errors_total, self._last_collection_unix, self._last_success_unix

    def close(self) -> None:
        """Close the connection; one in use is interrupted, and its collection closes it."""
        with self._state:
            self._closed = True
        self._directory.forget(self)
        self._connection.close()
        self._poolers.close()

    # -- collection (one at a time, on the pool) -------------------------------------------

    def _collect(self) -> Collection:
        started = self._clock()
        wait = self.settings.collection_deadline
        expired = threading.Event()  # the deadline's own, once it is armed
        try:
            with (
                self._uses,
                self._connection.deadline(self._watchdog, wait, self._expiring) as expired,
                self._connection.use(),
            ):
                collection = self._read(started, expired)
        except ReadThrough as through:  # another server's collection, as it is
            return through.collection
        except Exception:  # never let one server's bug take the exporter down
            log.exception("collection failed unexpectedly", extra={"target": self.name})
            collection = self._failed(started, "internal error, see the exporter's log")
        if expired.is_set():  # an interrupted connection is never used again
            self._connection.drop()
        with self._state:
            self._last_collection_unix = time.time()
            if collection.ok:
                self._last_success_unix = self._last_collection_unix
            if collection.snapshot is not None:
                self._databases = collection.snapshot.databases
            counters = (self._errors_total, self._last_collection_unix, self._last_success_unix)
        errors, last_collection, last_success = counters
        return dataclasses.replace(
            collection,
            registry=self.registry,
            errors_total=errors,
            last_collection_unix=last_collection,
            last_success_unix=last_success,
        )

    def between_collections(self, read: Callable[[Reading], T], seconds: float) -> T:
        """`read` run on the connection this server keeps (opened if it is not), between two
        collections, within `seconds` in all: a /locks read, which must never need a new
        connection, since none can start while the lock table is full. Unanswered if not."""
        reader = self.reading_server()
        if reader is not self:
            return reader.between_collections(read, seconds)
        started = self._clock()
        expired = threading.Event()  # the deadline's own, once it is armed
        if not self._uses.acquire(timeout=seconds):
            raise Unanswered(f"the collection running did not end within {seconds:g}s")
        try:
            left = max(seconds - (self._clock() - started), 0.0)
            with (
                self._connection.deadline(self._watchdog, left) as expired,
                self._connection.use(),
            ):
                try:
                    conn = self._connection.connection()
                    return read(
                        Reading(conn, self._connection.registry, self._connection.databases)
                    )
                except (psycopg.Error, CannotCollect) as exc:
                    if isinstance(exc, CannotCollect) or self._connection_lost(expired):
                        self._connection.drop()  # the next collection connects again
                    if expired.is_set():
                        error = self._connection.unanswered(left)
                    elif refused_for_full_table(exc):
                        error = FULL_TABLE_REFUSAL + str(exc).strip()
                    else:
                        error = str(exc).strip()
                    raise Unanswered(self._connection.redact(error)) from None
        finally:
            if expired.is_set():
                self._connection.drop()
            self._uses.release()

    def _expiring(self) -> None:
        """The watchdog's word when a collection passes its deadline."""
        log.warning(
            "collection passed its deadline; cancelling it and closing the connection",
            extra={"target": self.name, "deadline_seconds": self.settings.collection_deadline},
        )

    def _read(self, started: float, expired: threading.Event) -> Collection:
        """This server's collection (ReadThrough: another's, which reads it)."""
        reused = self._connection.is_open()
        try:
            try:
                snapshot = self._snapshot()
            except psycopg.Error as exc:
                if not (reused and self._connection_lost(expired)):
                    raise
                # A server restart or a terminated backend leaves a dead connection behind;
                # the first collection after it reconnects at once instead of reporting
                # the target down.
                log.info(
                    "the connection was lost; reconnecting",
                    extra={"target": self.name, "error": self._connection.redact(str(exc).strip())},
                )
                self._connection.drop()
                snapshot = self._snapshot()
        except CannotCollect as exc:
            self._connection.drop()
            self._directory.forget(self)  # it reaches no server: another may read that one
            return self._failed(started, str(exc))
        except psycopg.Error as exc:
            return self._refused(exc, started, expired, reused)
        self._check_privilege(snapshot)
        holds = self._holds.update(snapshot, self._connection.registry)
        poolers = self._poolers.read_after_server(
            self._watchdog, self.settings.collection_deadline, self._clock() - started
        )
        self._statements.due()
        finished = self._clock()
        if self._said.changed("collection", None):
            log.info("collection succeeded again", extra={"target": self.name})
        return Collection(
            finished,
            finished - started,
            snapshot,
            poolers,
            statements=self._statements.last(),
            holds=holds,
            answering=self._answering(snapshot.databases),
        )

    def _refused(
        self, exc: psycopg.Error, started: float, expired: threading.Event, reused: bool
    ) -> Collection:
        """The server's error as the collection's (ReadThrough where a recheck that the full
        table refused goes on reading through the server first in rank)."""
        full = refused_for_full_table(exc)
        if full and not reused and self._directory.renew(self):
            self._connection.drop()  # the full table pages once, on that one
            raise self._read_through() from None
        if self._connection_lost(expired):
            self._connection.drop()
            if not full:  # a full table's refusal says nothing of which server this is
                self._directory.forget(self)
        if not full:
            return self._failed(started, self._describe(exc, expired))
        # The read on a kept connection takes no lock-table entry (snapshot.py); one refused
        # is a new connection's, or a session whose caches had to read a shared catalog
        # again: the full table, not the exporter, is the news.
        self._room = False
        error = FULL_TABLE_REFUSAL + self._connection.redact(str(exc).strip())
        return self._failed(started, error, refused_for_full_table=True)

    def _snapshot(self) -> ServerSnapshot:
        if self.reading_server() is not self:
            # Found to be a server that another, first in rank, reads: since this one last
            # read it, or since that one connected. One connection to a server.
            self._connection.drop()
            raise self._read_through()
        conn = self._connection.connection()
        self._claim(self._connection.identity)
        self._said.changed("reads through", None)  # it reads on its own (again)
        refused = self._connection.list_databases(conn, self._room)
        last = self._collections.last()
        if last is not None and last.snapshot is not None:
            self._connection.warm_up(conn, last.snapshot.lock_table_entries)
        snapshot = read_snapshot(conn, self._connection.registry, self._connection.databases)
        if refused:  # full at what this read counts
            self._refused_at = snapshot.lock_table_entries
        snapshot = dataclasses.replace(snapshot, refused_at=self._refused_at)
        self._room = snapshot.room_to_read
        return snapshot

    def _claim(self, identity: ServerIdentity | None) -> None:
        """At each new connection: tell the directory which running server it reached; if a
        server first in rank reads that one, close it and read through that one (raises
        ReadThrough)."""
        # `is`, not ==: each new connection makes a new identity, so that a reconnect claims
        # again (and a server reading through another checks again after SAME_SERVER_RECHECK).
        if identity is None or identity is self._claimed:
            return
        self._claimed, self._refused_at = identity, None
        if self._directory.claim(self, identity) is not self:
            self._connection.drop()
            raise self._read_through()

    def _read_through(self) -> ReadThrough:
        """Its answer while another server reads the one it reaches: that one's last
        collection. Said once each time it comes to read through another."""
        reader = self.reading_server()
        if self._said.changed("reads through", reader.name):
            log.warning(
                "the same server as another target, first in the file; reading it through that one",
                extra={"target": self.name, "same_as": reader.name, "server": str(self._claimed)},
            )
        last = reader.last()
        if last is not None:
            return ReadThrough(last)
        now = self._clock()
        error = f"the same server as {reader.name}, not read yet"
        answering = self._directory.answering(reader, None)
        return ReadThrough(Collection(now, 0.0, error=error, answering=answering))

    def _answering(self, databases: frozenset[str] | None) -> View | None:
        """The target that answers for the server, logged when it changes."""
        found = self._directory.answering(self, databases)
        if found is not None and self._said.changed("answering", found.name):
            log.info("answers for its server", extra={"target": found.name, "server": self.name})
        return found

    def _connection_lost(self, expired: threading.Event) -> bool:
        return not expired.is_set() and self._connection.lost()

    def _describe(self, exc: psycopg.Error, expired: threading.Event) -> str:
        if expired.is_set():
            unanswered = self._connection.unanswered(self.settings.collection_deadline)
            return (
                f"{unanswered} (the collection's deadline); the statement was cancelled and the "
                "connection closed"
            )
        return self._connection.redact(str(exc).strip())

    def _failed(
        self, started: float, error: str, *, refused_for_full_table: bool = False
    ) -> Collection:
        with self._state:
            self._errors_total += 1
        if self._said.changed("collection", error):
            log.error("collection failed", extra={"target": self.name, "error": error})
        else:
            log.debug("collection failed again", extra={"target": self.name, "error": error})
        finished = self._clock()
        return Collection(
            finished,
            finished - started,
            error=error,
            answering=self._answering(self.databases()),
            refused_for_full_table=refused_for_full_table,
        )

    def _check_privilege(self, snapshot: ServerSnapshot) -> None:
        can_read = snapshot.can_read_all_stats
        if self._said.changed("privilege", can_read, initial=True) and not can_read:
            role = self._connection.role
            log.warning(
                "the monitoring role cannot see other sessions' state: states are reported "
                "as unknown and idle holders' ages are missing; fix with "
                + grant_read_all_stats(role),
                extra={"target": self.name, "role": role},
            )
