"""One watched server: its connection, its collections, and what the last one found."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import CancelledError, Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import psycopg

from .capacity import MIN_SERVER_VERSION
from .config import CollectionSettings, TargetConfig, redact
from .metrics import Sample, server_samples
from .registry import HASH_TEXTS_SQL, NO_KEYS, KeyConfig, Registry
from .scheduling import CollectionPool, Priority, Task, Watchdog
from .snapshot import SESSION_SQL, ServerSnapshot, read_snapshot

log = logging.getLogger(__name__)

APPLICATION_NAME = "pg-advisory-exporter"
_FIRST_BACKOFF = 1.0
_CANCEL_TIMEOUT = 1.0  # seconds a cancel request may take after a deadline


class CannotCollect(Exception):
    """A failure that is not the database's error: a server too old, a password file gone."""


@dataclass(frozen=True)
class Session:
    conn: psycopg.Connection[Any]
    role: str
    version: int
    registry: Registry


def _hash_texts(
    conn: psycopg.Connection[Any], texts: Sequence[str], seeds: Sequence[int]
) -> list[int]:
    rows = conn.execute(HASH_TEXTS_SQL, {"texts": list(texts), "seeds": list(seeds)}).fetchall()
    return [row[0] for row in rows]


def _connect(conninfo: str, settings: CollectionSettings) -> psycopg.Connection[Any]:
    try:
        return psycopg.connect(
            conninfo,
            autocommit=True,
            application_name=APPLICATION_NAME,
            # libpq takes whole seconds and treats values below 2 as 2.
            connect_timeout=max(2, math.ceil(settings.connect_timeout)),
            # Notice a dead server or network during a collection, not hours later.
            keepalives=1,
            keepalives_idle=max(1, int(settings.statement_timeout)),
            keepalives_interval=1,
            keepalives_count=3,
            tcp_user_timeout=int(settings.scrape_wait * 1000),
        )
    except psycopg.Error as exc:
        # When an attempt times out, psycopg leaves the half-open connection in a frame
        # that this exception's traceback holds, in a reference cycle that only the cyclic
        # garbage collector breaks: minutes later, or never. Until then its socket stays
        # open, and so does the server backend behind it once the server gets to it.
        # Clearing the frames' locals frees it now.
        traceback.clear_frames(exc.__traceback__)
        raise


def open_session(
    conninfo: str,
    settings: CollectionSettings,
    keys: Sequence[KeyConfig] = (),
    adopt: Callable[[psycopg.Connection[Any]], None] | None = None,
) -> Session:
    """Connect the way every collection needs: autocommit, read-only, with timeouts.

    `adopt` receives the connection before its first statement, so that a deadline can
    interrupt it; the connection is closed here if anything after connecting fails.
    The key registry is resolved on every new connection: hashtextextended() keys come
    from the server, whose major version may have changed since the last one.
    """
    conn = _connect(conninfo, settings)
    try:
        if adopt is not None:
            adopt(conn)
        row = conn.execute(
            SESSION_SQL,
            {
                "statement_timeout": f"{int(settings.statement_timeout * 1000)}ms",
                "lock_timeout": f"{int(settings.lock_timeout * 1000)}ms",
            },
        ).fetchone()
        assert row is not None
        version, role = row[0], row[1]
        if version < MIN_SERVER_VERSION:
            raise CannotCollect(
                f"PostgreSQL {version // 10000} is not supported: pg-advisory-exporter "
                "needs PostgreSQL 14 or newer (it reads pg_locks.waitstart)"
            )
        try:
            registry = Registry.resolve(keys, partial(_hash_texts, conn))
        except ValueError as exc:
            raise CannotCollect(f"key registry: {exc}") from None
    except BaseException:
        conn.close()
        raise
    return Session(conn, role, version, registry)


def interrupt(conn: psycopg.Connection[Any]) -> None:
    """Wake a thread that waits on `conn`, from another thread, without closing its socket.

    Shutting the socket down makes the waiting side see the end of the stream at once,
    whatever the server does; closing it instead could hand its descriptor to another
    socket while the waiting thread still polls it.
    """
    try:
        fd = conn.pgconn.socket
    except psycopg.OperationalError:  # libpq has already dropped the socket
        return
    with socket.socket(fileno=os.dup(fd)) as sock, contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


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

    The target owns one connection. A collection uses it on a pool worker; other threads
    (the watchdog at a collection's deadline, a reload that removes the target) never close
    it under the worker, they interrupt it, and the worker closes it.
    """

    def __init__(self, config: TargetConfig, pool: CollectionPool, watchdog: Watchdog) -> None:
        assert config.collection is not None
        self.name = config.name
        self.config = config
        self.settings = config.collection
        self._pool = pool
        self._watchdog = watchdog
        self._rules = [rule.rule() for rule in self.settings.application_name_rewrites]
        self._min_interval = self.settings.min_interval
        # Shared between scrapes, the collection, the watchdog and reloads; guarded by _state.
        self._state = threading.Lock()
        # Held while a connection is closed or used from outside its collection, so that
        # it is never freed under that use; taken before _state.
        self._closing = threading.Lock()
        self._task: Task[Collection] | None = None  # queued or running
        self._task_submitted = 0.0
        self._generation = 0  # which collection a deadline belongs to
        self._expired = False  # the running collection passed its deadline
        self._last: Collection | None = None
        self._last_success_unix: float | None = None
        self._last_collection_unix: float | None = None
        self._errors_total = 0
        self._conn: psycopg.Connection[Any] | None = None
        self._closed = False
        self._reconnect_at = 0.0  # no new connection before this (monotonic clock)
        # Used by the collection only, and collections of one target never overlap.
        self._role = ""
        self._registry = NO_KEYS
        self._conninfo = config.dsn
        self._backoff = 0.0
        self._warned_privilege = False
        self._logged_error: str | None = None

    # -- scrapes ---------------------------------------------------------------------------

    def begin(self, urgent: bool = False) -> Collection | Future[Collection]:
        """The last collection if it is recent enough, else the running (or a new) one.

        While a failed connection waits out its backoff, the failure is the answer: no
        worker is needed for it, so a fleet of unreachable servers costs next to nothing.
        """
        now = time.monotonic()
        with self._state:
            if self._task is not None:
                if urgent:
                    self._pool.expedite(self._task)
                return self._task.future
            last = self._last
            if last is not None and (
                now - last.finished_at < self._min_interval
                or (self._conn is None and now < self._reconnect_at)
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
            self._task = self._pool.submit(partial(self._collect, self._generation), priority)
            return self._task.future

    def wait(self, pending: Collection | Future[Collection], wait: float) -> Collection | None:
        """The collection, once it is done within `wait` seconds; None if it is not."""
        if not isinstance(pending, Future):
            return pending
        if wait <= 0 and not pending.done():  # no exception to raise and catch per target
            return None
        try:
            return pending.result(timeout=max(wait, 0.0))
        except (FutureTimeout, CancelledError):
            return None

    def late(self) -> Collection:
        """What a scrape reports when the collection is not done in time (it is not recorded:
        the collection goes on, and is recorded when it ends or its deadline passes)."""
        now = time.monotonic()
        with self._state:
            submitted = self._task_submitted
        return Collection(now, now - submitted, error="collection timed out")

    def series(self, collection: Collection) -> list[Sample]:
        """All series of this target for one scrape."""
        name = (self.name,)
        samples = list(collection.samples) or [Sample("pg_advisory_up", name, 0)]
        with self._state:
            errors, last_success = self._errors_total, self._last_success_unix
        samples += [
            Sample("pg_advisory_exporter_collect_duration_seconds", name, collection.duration),
            Sample("pg_advisory_exporter_collect_errors_total", name, errors),
        ]
        if last_success is not None:
            samples.append(
                Sample("pg_advisory_exporter_last_success_timestamp_seconds", name, last_success)
            )
        if collection.insufficient_privilege is not None:
            samples += [
                Sample(
                    "pg_advisory_exporter_insufficient_privilege",
                    name,
                    collection.insufficient_privilege,
                ),
                Sample(
                    "pg_advisory_exporter_folded_application_names",
                    name,
                    collection.folded_application_names,
                ),
            ]
        return samples

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
        with self._closing:
            with self._state:
                self._closed = True
                conn = self._conn
                in_use = self._task is not None and self._task.future.running()
                if not in_use:
                    self._conn = None
            if conn is None:
                return
            if in_use:
                interrupt(conn)
            else:
                conn.close()

    # -- collection (one at a time, on the pool) -------------------------------------------

    def _collect(self, generation: int) -> Collection:
        started = time.monotonic()
        alarm = self._watchdog.arm(self.settings.scrape_wait, partial(self._expire, generation))
        try:
            collection = self._read(started)
        except Exception:  # never let one target's bug take the exporter down
            log.exception("collection failed unexpectedly", extra={"target": self.name})
            collection = self._failed(started, "internal error, see the exporter's log")
        finally:
            self._watchdog.disarm(alarm)
        with self._state:
            expired, closed = self._expired, self._closed
            self._expired = False
        if expired or closed:  # an interrupted connection is never used again
            self._drop_connection()
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
            conn = self._conn
        log.warning(
            "collection passed its deadline; cancelling it and closing the connection",
            extra={"target": self.name, "deadline_seconds": self.settings.scrape_wait},
        )
        if conn is not None:
            # The cancel request may wait on the network: not on the watchdog's thread.
            threading.Thread(
                target=self._cancel_and_interrupt, args=(conn,), name="cancel", daemon=True
            ).start()

    def _cancel_and_interrupt(self, conn: psycopg.Connection[Any]) -> None:
        with self._closing:  # the collection cannot close the connection meanwhile
            with self._state:
                if self._conn is not conn:
                    return
            # A server that is merely slow stops the statement; a stopped backend or a hung
            # proxy never answers, and the interrupt wakes the collection regardless.
            with contextlib.suppress(Exception):
                conn.cancel_safe(timeout=_CANCEL_TIMEOUT)
            interrupt(conn)

    def _read(self, started: float) -> Collection:
        with self._state:
            reused = self._conn is not None
        try:
            try:
                return self._succeeded(started, self._snapshot())
            except psycopg.Error as exc:
                if not (reused and self._connection_lost()):
                    raise
                # A server restart or a terminated backend leaves a dead connection behind;
                # the first collection after it reconnects at once instead of reporting
                # the target down.
                log.info(
                    "the connection was lost; reconnecting",
                    extra={"target": self.name, "error": self._redact(str(exc).strip())},
                )
                self._drop_connection()
                return self._succeeded(started, self._snapshot())
        except CannotCollect as exc:
            self._drop_connection()
            return self._failed(started, str(exc))
        except psycopg.Error as exc:
            if self._connection_lost():
                self._drop_connection()
            return self._failed(started, self._describe(exc))

    def _snapshot(self) -> ServerSnapshot:
        return read_snapshot(self._connection(), self._registry)

    def _connection_lost(self) -> bool:
        with self._state:
            conn, expired = self._conn, self._expired
        return not expired and (conn is None or conn.closed or conn.broken)

    def _describe(self, exc: psycopg.Error) -> str:
        with self._state:
            expired = self._expired
        if expired:
            return (
                f"no answer within the collection's deadline ({self.settings.scrape_wait:g}s); "
                "the statement was cancelled and the connection closed"
            )
        return self._redact(str(exc).strip())

    def _succeeded(self, started: float, snapshot: ServerSnapshot) -> Collection:
        self._check_privilege(snapshot)
        mapped = server_samples(
            self.name,
            snapshot,
            self._rules,
            self.settings.application_name_limit,
            self._registry,
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
            log.warning(
                "the monitoring role cannot see other sessions' state: states are reported "
                "as unknown and idle holders' ages are missing; fix with "
                f'GRANT pg_read_all_stats TO "{self._role}"',
                extra={"target": self.name, "role": self._role},
            )

    def _connection(self) -> psycopg.Connection[Any]:
        with self._state:
            if self._closed:
                raise CannotCollect("the target was removed from the configuration")
            if self._conn is not None:
                return self._conn
        try:
            try:
                self._conninfo = self.config.conninfo()
            except ValueError as exc:  # the password file cannot be read now
                raise CannotCollect(str(exc)) from None
            session = open_session(self._conninfo, self.settings, self.config.keys, self._adopt)
        except BaseException:
            self._drop_connection()  # adopted, then closed by open_session
            self._backoff = min(
                max(self._backoff * 2, _FIRST_BACKOFF), self.settings.reconnect_backoff_max
            )
            with self._state:
                self._reconnect_at = time.monotonic() + self._backoff
            raise
        self._backoff = 0.0
        with self._state:
            self._reconnect_at = 0.0
        log.info("connected", extra={"target": self.name, "server_version_num": session.version})
        self._role = session.role
        self._registry = session.registry
        return session.conn

    def _adopt(self, conn: psycopg.Connection[Any]) -> None:
        with self._state:
            if self._closed:  # removed by a reload while connecting
                raise CannotCollect("the target was removed from the configuration")
            self._conn = conn

    def _drop_connection(self) -> None:
        with self._closing, self._state:
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _redact(self, message: str) -> str:
        # The last conninfo used carries the password, wherever it came from.
        return redact(message, self._conninfo)
