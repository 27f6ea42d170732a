"""One target's connection to its server: opened with the settings that keep the exporter
harmless, reopened with backoff, and closed or interrupted safely from any thread."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import psycopg

from . import catalog
from .capacity import MIN_SERVER_VERSION
from .catalog import CatalogEntry
from .config import CollectionSettings, TargetConfig, redact
from .registry import HASH_TEXTS_SQL, NO_KEYS, KeyConfig, Note, Registry
from .snapshot import SESSION_SQL

log = logging.getLogger(__name__)

APPLICATION_NAME = "pg-advisory-exporter"
_FIRST_BACKOFF = 1.0
_CANCEL_TIMEOUT = 1.0  # seconds a cancel request may take after a deadline
# The databases whose names the catalog's per-database keys are computed from: the ones
# the collection reports deadlocks for (templates are copied, not worked in), so that a
# name it reports and this list lacks is a database created since.
DATABASES_SQL = "SELECT datname FROM pg_catalog.pg_database WHERE NOT datistemplate"


class CannotCollect(Exception):
    """A failure that is not the database's error: a server too old, a password file gone."""


@dataclass(frozen=True)
class Session:
    conn: psycopg.Connection[Any]
    role: str
    version: int
    registry: Registry
    databases: frozenset[str]  # those the registry's per-database catalog keys cover


def _hash_texts(
    conn: psycopg.Connection[Any], texts: Sequence[str], seeds: Sequence[int]
) -> list[int]:
    rows = conn.execute(HASH_TEXTS_SQL, {"texts": list(texts), "seeds": list(seeds)}).fetchall()
    return [row[0] for row in rows]


def resolve_registry(
    conn: psycopg.Connection[Any],
    keys: Sequence[KeyConfig],
    entries: Sequence[CatalogEntry],
    note: Note,
) -> tuple[Registry, frozenset[str]]:
    """The registry on this connection's server: the user's keys, then the catalog's entries
    for every database it has (read from pg_database, never from pg_locks), and the
    databases that covers. A key clash among the user's keys raises CannotCollect."""
    databases: frozenset[str] = frozenset()
    if catalog.needs_databases(entries):
        databases = frozenset(row[0] for row in conn.execute(DATABASES_SQL).fetchall())
    try:
        registry = Registry.resolve(
            keys, partial(_hash_texts, conn), catalog.key_configs(entries, databases), note
        )
    except ValueError as exc:
        raise CannotCollect(f"key registry: {exc}") from None
    return registry, databases


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
    *,
    entries: Sequence[CatalogEntry] = (),
    note: Note = log.info,
) -> Session:
    """Connect the way every collection needs: autocommit, read-only, with timeouts.

    `adopt` receives the connection before its first statement, so that a deadline can
    interrupt it; the connection is closed here if anything after connecting fails.
    The key registry is resolved on every new connection: hashtextextended() keys come
    from the server, whose major version may have changed since the last one, and the
    catalog's `entries` are computed for the databases it has now. `note` hears of the
    catalog entries left out because another entry names the same lock.
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
        registry, databases = resolve_registry(conn, keys, entries, note)
    except BaseException:
        conn.close()
        raise
    return Session(conn, role, version, registry, databases)


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


class ServerConnection:
    """The one connection a target keeps, and the backoff between attempts to open it.

    Its user (the target's collection, one at a time) gets it with `get()`. Other threads
    (a deadline, a reload that removes the target) never close it under that user: they
    `interrupt()` it, and the user closes it with `drop()`.
    """

    def __init__(self, config: TargetConfig) -> None:
        assert config.collection is not None
        self.name = config.name
        self._config = config
        self._settings = config.collection
        self._state = threading.Lock()  # guards the fields below it
        # Held while the connection is closed or used from another thread, so that it is
        # never freed under that use; taken before _state.
        self._closing = threading.Lock()
        self._conn: psycopg.Connection[Any] | None = None
        self._closed = False
        self._reconnect_at = 0.0  # no new connection before this (monotonic clock)
        # Used by the connection's user only.
        self._backoff = 0.0
        self._conninfo = config.dsn
        self.role = ""
        self.registry = NO_KEYS
        self._entries = catalog.selected(config.catalog)
        self._databases: frozenset[str] = frozenset()  # the registry's catalog keys cover
        self._new_database = False  # a collection saw one: resolve again before the next
        self._noted: set[str] = set()  # catalog entries left out, each logged once

    def backing_off(self, now: float) -> bool:
        """True while a failed connection waits out its backoff."""
        with self._state:
            return self._conn is None and now < self._reconnect_at

    def retired(self) -> bool:
        """True once close() was called: the target is gone."""
        with self._state:
            return self._closed

    def is_open(self) -> bool:
        with self._state:
            return self._conn is not None

    def lost(self) -> bool:
        """True when there is no usable connection (closed, or found broken)."""
        with self._state:
            conn = self._conn
        return conn is None or conn.closed or conn.broken

    def get(self) -> psycopg.Connection[Any]:
        """The open connection, or a new one (CannotCollect or psycopg.Error if not)."""
        with self._state:
            if self._closed:
                raise CannotCollect("the target was removed from the configuration")
            conn = self._conn
        if conn is not None:
            if self._new_database:
                self._resolve_again(conn)
            return conn
        try:
            try:
                self._conninfo = self._config.conninfo()
            except ValueError as exc:  # the password file cannot be read now
                raise CannotCollect(str(exc)) from None
            session = open_session(
                self._conninfo,
                self._settings,
                self._config.keys,
                self._adopt,
                entries=self._entries,
                note=self._note,
            )
        except BaseException:
            self.drop()  # adopted, then closed by open_session
            self._backoff = min(
                max(self._backoff * 2, _FIRST_BACKOFF), self._settings.reconnect_backoff_max
            )
            with self._state:
                self._reconnect_at = time.monotonic() + self._backoff
            raise
        self._backoff = 0.0
        with self._state:
            self._reconnect_at = 0.0
        log.info("connected", extra={"target": self.name, "server_version_num": session.version})
        self.role = session.role
        self.registry = session.registry
        self._databases = session.databases
        self._new_database = False
        return session.conn

    def saw_databases(self, databases: Iterable[str]) -> None:
        """Called with the databases a collection saw (its snapshot's deadlocks name every
        one but the templates): one the registry's catalog keys do not cover yet is
        resolved before the next collection, on the same connection, from pg_database."""
        if catalog.needs_databases(self._entries) and not self._databases.issuperset(databases):
            self._new_database = True

    def _resolve_again(self, conn: psycopg.Connection[Any]) -> None:
        registry, databases = resolve_registry(conn, self._config.keys, self._entries, self._note)
        log.debug(
            "key registry resolved for new databases",
            extra={
                "target": self.name,
                "databases": ", ".join(sorted(databases - self._databases)),
            },
        )
        self.registry, self._databases, self._new_database = registry, databases, False

    def _note(self, message: str) -> None:
        """Once per target, not at every connection: the same configuration says the same."""
        if message not in self._noted:
            self._noted.add(message)
            log.info(message, extra={"target": self.name})

    def drop(self) -> None:
        """Close the connection, if any; the next get() opens a new one."""
        with self._closing, self._state:
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def interrupt(self) -> None:
        """Stop what the connection's user waits for, from another thread, at once."""
        with self._state:
            conn = self._conn
        if conn is not None:
            # The cancel request may wait on the network: not on the caller's thread.
            threading.Thread(
                target=self._cancel_and_interrupt, args=(conn,), name="cancel", daemon=True
            ).start()

    def close(self, in_use: bool) -> None:
        """No more connections; one `in_use` is interrupted, and its user drops it."""
        with self._closing:
            with self._state:
                self._closed = True
                conn = self._conn
                if not in_use:
                    self._conn = None
            if conn is None:
                return
            if in_use:
                interrupt(conn)
            else:
                conn.close()

    def redact(self, message: str) -> str:
        # The last conninfo used carries the password, wherever it came from.
        return redact(message, self._conninfo)

    def _adopt(self, conn: psycopg.Connection[Any]) -> None:
        with self._state:
            if self._closed:  # removed by a reload while connecting
                raise CannotCollect("the target was removed from the configuration")
            self._conn = conn

    def _cancel_and_interrupt(self, conn: psycopg.Connection[Any]) -> None:
        with self._closing:  # the user cannot close the connection meanwhile
            with self._state:
                if self._conn is not conn:
                    return
            # A server that is merely slow stops the statement; a stopped backend or a hung
            # proxy never answers, and the interrupt wakes the user regardless.
            with contextlib.suppress(Exception):
                conn.cancel_safe(timeout=_CANCEL_TIMEOUT)
            interrupt(conn)
