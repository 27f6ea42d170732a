"""One watched server: its connection, its collections, and what the last one found."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Executor, Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import psycopg

from .capacity import MIN_SERVER_VERSION
from .config import CollectionSettings, TargetConfig, redact
from .metrics import Sample, server_samples
from .registry import HASH_TEXTS_SQL, NO_KEYS, KeyConfig, Registry
from .snapshot import SESSION_SQL, ServerSnapshot, read_snapshot

log = logging.getLogger(__name__)

APPLICATION_NAME = "pg-advisory-exporter"
_FIRST_BACKOFF = 1.0


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


def open_session(
    conninfo: str, settings: CollectionSettings, keys: Sequence[KeyConfig] = ()
) -> Session:
    """Connect the way every collection needs: autocommit, read-only, with timeouts.

    The key registry is resolved on every new connection: hashtextextended() keys come
    from the server, whose major version may have changed since the last one.
    """
    conn = psycopg.connect(
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
    try:
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
    """

    def __init__(self, config: TargetConfig, executor: Executor) -> None:
        assert config.collection is not None
        self.name = config.name
        self.config = config
        self.settings = config.collection
        self._executor = executor
        self._rules = [rule.rule() for rule in self.settings.application_name_rewrites]
        self._min_interval = self.settings.min_interval
        # Shared between scrapes and the collection; guarded by _state.
        self._state = threading.Lock()
        self._running: Future[Collection] | None = None
        self._last: Collection | None = None
        self._last_success_unix: float | None = None
        self._last_collection_unix: float | None = None
        self._errors_total = 0
        self._conn: psycopg.Connection[Any] | None = None
        self._closed = False
        # Used by the collection only, and collections of one target never overlap.
        self._role = ""
        self._registry = NO_KEYS
        self._conninfo = config.dsn
        self._reconnect_at = 0.0
        self._backoff = 0.0
        self._warned_privilege = False

    # -- scrapes ---------------------------------------------------------------------------

    def begin(self) -> Collection | Future[Collection]:
        """The last collection if it is recent enough, else the running (or a new) one."""
        with self._state:
            last = self._last
            if last is not None and time.monotonic() - last.finished_at < self._min_interval:
                return last
            if self._running is None:
                self._running = self._executor.submit(self._collect)
            return self._running

    def samples(self, pending: Collection | Future[Collection], wait: float) -> list[Sample]:
        """All series of this target for one scrape, waiting at most `wait` seconds."""
        if isinstance(pending, Future):
            try:
                collection = pending.result(timeout=max(wait, 0.0))
            except FutureTimeout:
                log.warning(
                    "collection is slower than the scrape allows; reporting the target down",
                    extra={"target": self.name, "waited_seconds": round(wait, 3)},
                )
                collection = Collection(time.monotonic(), wait, error="collection timed out")
        else:
            collection = pending
        return self._with_exporter_series(collection)

    def _with_exporter_series(self, collection: Collection) -> list[Sample]:
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
        """Close the connection; a collection still running drops the one it opens."""
        with self._state:
            self._closed = True
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    # -- collection (one at a time, on the executor) ---------------------------------------

    def _collect(self) -> Collection:
        started = time.monotonic()
        try:
            collection = self._read(started)
        except Exception:  # never let one target's bug take the exporter down
            log.exception("collection failed unexpectedly", extra={"target": self.name})
            collection = self._failed(started, "internal error, see the exporter's log")
        with self._state:
            self._last = collection
            self._running = None
            self._last_collection_unix = time.time()
            if collection.ok:
                self._last_success_unix = self._last_collection_unix
        return collection

    def _read(self, started: float) -> Collection:
        if self._conn is None and started < self._reconnect_at:
            return Collection(
                started,
                0.0,
                error=f"not reconnecting for {self._reconnect_at - started:.1f}s after a failure",
            )
        try:
            conn = self._connection()
            snapshot = read_snapshot(conn, self._registry)
        except CannotCollect as exc:
            self._drop_connection()
            return self._failed(started, str(exc))
        except psycopg.Error as exc:
            if self._conn is None or self._conn.closed or self._conn.broken:
                self._drop_connection()
            return self._failed(started, self._redact(str(exc).strip()))
        self._backoff = 0.0
        return self._succeeded(started, snapshot)

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
        log.error("collection failed", extra={"target": self.name, "error": error})
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
        if self._conn is not None:
            return self._conn
        self._backoff = min(
            max(self._backoff * 2, _FIRST_BACKOFF), self.settings.reconnect_backoff_max
        )
        self._reconnect_at = time.monotonic() + self._backoff
        try:
            self._conninfo = self.config.conninfo()
        except ValueError as exc:  # the password file cannot be read now
            raise CannotCollect(str(exc)) from None
        session = open_session(self._conninfo, self.settings, self.config.keys)
        with self._state:
            if self._closed:  # removed by a reload while connecting
                session.conn.close()
                raise CannotCollect("the target was removed from the configuration")
            self._conn = session.conn
        log.info("connected", extra={"target": self.name, "server_version_num": session.version})
        self._role = session.role
        self._registry = session.registry
        return session.conn

    def _drop_connection(self) -> None:
        with self._state:
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _redact(self, message: str) -> str:
        # The last conninfo used carries the password, wherever it came from.
        return redact(message, self._conninfo)
