"""One target's connection to its server: opened with the settings that keep the exporter
harmless, and kept (kept_connection.py) with the key registry resolved on it; and a
connection of its own for one read (/locks, check, pg_stat_statements)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any

import psycopg

from pg_advisory_exporter import logs
from pg_advisory_exporter.config.collection import CollectionSettings
from pg_advisory_exporter.config.dsn import redact
from pg_advisory_exporter.config.settings import TargetSettings
from pg_advisory_exporter.keys import catalog
from pg_advisory_exporter.keys.catalog_entry import CatalogEntry
from pg_advisory_exporter.keys.key_config import KeyConfig
from pg_advisory_exporter.keys.registry import HASH_TEXTS_SQL, NO_KEYS, Note, Registry

from .capacity import MIN_SERVER_VERSION
from .kept_connection import APPLICATION_NAME, CannotCollect, KeptConnection, connect
from .scheduling import Watchdog

log = logging.getLogger(__name__)

# The session's work_mem. The scan of pg_lock_status() keeps its rows in a tuplestore
# (about 150 bytes a lock) that spills to a temporary file past work_mem: at the default
# 4MB from about 27,000 locks (at 100,000, 7MB written and read back). Kept in memory, the
# statement at 100,000 locks costs 1.18-1.22x the bare count instead of 1.38-1.41x when the
# backend keeps that memory between collections, and 1.37-1.38x when its allocator gives it
# back and takes it again each time (page faults, costly in a virtual machine): never more
# than spilling (interleaved, 50-100 rounds). The bare count gains nothing from it. 32MB
# holds about 200,000 locks; the memory is taken only as far as the locks need it, and past
# it the rows spill as before.
COLLECTION_WORK_MEM = "32MB"

# Run once per connection: the session settings that keep the exporter harmless (and its
# collection cheap), the server version it checks before the first collection, and what
# tells this server from others (connection.ServerIdentity): when its postmaster started,
# and whether the role may read the system identifier (pg_control_system() is PUBLIC by
# default; some shops revoke it).
SESSION_SQL = """
SELECT pg_catalog.current_setting('server_version_num')::int AS server_version_num,
       current_user AS role,
       pg_catalog.pg_postmaster_start_time() AS started,
       pg_catalog.has_function_privilege('pg_catalog.pg_control_system()', 'EXECUTE')
           AS reads_control,
       pg_catalog.set_config('statement_timeout', %(statement_timeout)s, false),
       pg_catalog.set_config('lock_timeout', %(lock_timeout)s, false),
       pg_catalog.set_config('work_mem', %(work_mem)s, false),
       pg_catalog.set_config('default_transaction_read_only', 'on', false)
"""

# The databases whose names the catalog's per-database keys are computed from: the ones
# the collection reports deadlocks for (templates are copied, not worked in), so that a
# name it reports and this list lacks is a database created since.
DATABASES_SQL = "SELECT datname FROM pg_catalog.pg_database WHERE NOT datistemplate"


# The server's system identifier, for a role that may read it (Session.identity).
SYSTEM_IDENTIFIER_SQL = "SELECT system_identifier FROM pg_catalog.pg_control_system()"


@dataclass(frozen=True)
class ServerIdentity:
    """What tells one running server from every other: two connections with the same
    identity reach the same server, whatever address each was given.

    The start of its postmaster (to the microsecond) is readable by any role, and differs
    between a primary and its physical standbys, which share the system identifier; the
    system identifier (where the role may read it) tells apart servers started in the same
    microsecond. A restart gives a server a new identity.
    """

    started: datetime
    system_identifier: int | None

    def __str__(self) -> str:
        known = "" if self.system_identifier is None else f"system {self.system_identifier}, "
        return f"{known}started {self.started.isoformat()}"


@dataclass(frozen=True)
class Session:
    conn: psycopg.Connection[Any]
    role: str
    version: int
    registry: Registry
    databases: frozenset[str]  # those the registry's per-database catalog keys cover
    complete: bool  # False: a server-side read of the registry failed (see resolve_registry)
    identity: ServerIdentity


class _OddAnswer(Exception):
    """The server answered a registry read with something other than what was asked for."""


def _hash_texts(
    conn: psycopg.Connection[Any], texts: Sequence[str], seeds: Sequence[int | None]
) -> list[int]:
    rows = conn.execute(HASH_TEXTS_SQL, {"texts": list(texts), "seeds": list(seeds)}).fetchall()
    values = [row[0] for row in rows]
    if len(values) != len(texts) or not all(type(value) is int for value in values):
        raise _OddAnswer(f"hashtext() gave {values[:3]!r} for {len(texts)} texts")
    return values


def _databases(conn: psycopg.Connection[Any]) -> frozenset[str]:
    names = [row[0] for row in conn.execute(DATABASES_SQL).fetchall()]
    if not all(isinstance(name, str) for name in names):
        raise _OddAnswer(f"pg_database gave database names {names[:3]!r}")
    return frozenset(names)


def _without(what: str, exc: Exception, conn: psycopg.Connection[Any], note: Note) -> None:
    """A registry read failed: the collection goes on without what it would have named,
    unless the connection itself is gone (then the collection fails, as it would anyway)."""
    if isinstance(exc, psycopg.Error) and (conn.closed or conn.broken):
        raise exc
    note(f"the server could not give {what} ({str(exc).strip()}): collecting without them")


def needs_databases(keys: Sequence[KeyConfig], entries: Sequence[CatalogEntry]) -> bool:
    """Whether some key is computed per database, so the server's list of them is read."""
    return catalog.needs_databases(entries) or any(key.per_database for key in keys)


def resolve_registry(
    conn: psycopg.Connection[Any],
    keys: Sequence[KeyConfig],
    entries: Sequence[CatalogEntry],
    note: Note,
) -> tuple[Registry, frozenset[str], bool]:
    """The registry on this connection's server: the user's keys, then the catalog's entries,
    each key computed per database for every database it has (read from pg_database, never
    from pg_locks), the databases that covers, and whether it is complete. A key clash among
    the user's keys raises CannotCollect. A server-side read that fails or answers oddly
    leaves its keys out (those computed per database, or those the server computes) and says
    so through `note`: the registry only names locks, and the collection does not need it to
    count them."""
    complete = True
    databases: frozenset[str] = frozenset()
    if needs_databases(keys, entries):
        try:
            databases = _databases(conn)
        except (psycopg.Error, _OddAnswer) as exc:
            _without("the database names for the keys computed per database", exc, conn, note)
            complete = False
    catalog_keys = catalog.key_configs(entries, databases)
    try:
        try:
            registry = Registry.resolve(
                keys, partial(_hash_texts, conn), catalog_keys, note, databases
            )
        except (psycopg.Error, _OddAnswer) as exc:
            _without("the keys that hashtext() and hashtextextended() compute", exc, conn, note)
            complete = False
            registry = Registry.resolve(keys, None, catalog_keys, note, databases)
    except ValueError as exc:
        raise CannotCollect(f"key registry: {exc}") from None
    return registry, databases, complete


def connect_to_server(
    conninfo: str, settings: CollectionSettings, application_name: str = APPLICATION_NAME
) -> psycopg.Connection[Any]:
    """A new connection to a server, with keepalives (psycopg.Error if not)."""
    return connect(
        conninfo,
        settings.connect_timeout,
        application_name,
        # Notice a dead server or network during a collection, not hours later.
        keepalives=1,
        keepalives_idle=max(1, int(settings.statement_timeout)),
        keepalives_interval=1,
        keepalives_count=3,
        tcp_user_timeout=int(settings.collection_deadline * 1000),
    )


def prepare_session(
    conn: psycopg.Connection[Any],
    settings: CollectionSettings,
    keys: Sequence[KeyConfig] = (),
    entries: Sequence[CatalogEntry] = (),
    note: Note = log.info,
) -> Session:
    """Ready a new connection the way every collection needs: read-only, with timeouts.

    The key registry is resolved on every new connection: hashtextextended() keys come
    from the server, whose major version may have changed since the last one, and the
    catalog's `entries` are computed for the databases it has now. `note` hears of the
    catalog entries left out because another entry names the same lock. The caller closes
    the connection if this fails (KeptConnection does).
    """
    row = conn.execute(
        SESSION_SQL,
        {
            "statement_timeout": f"{int(settings.statement_timeout * 1000)}ms",
            "lock_timeout": f"{int(settings.lock_timeout * 1000)}ms",
            "work_mem": COLLECTION_WORK_MEM,
        },
    ).fetchone()
    assert row is not None
    version, role, started, reads_control = row[0], row[1], row[2], row[3]
    if version < MIN_SERVER_VERSION:
        raise CannotCollect(
            f"PostgreSQL {version // 10000} is not supported: pg-advisory-exporter "
            "needs PostgreSQL 14 or newer (it reads pg_locks.waitstart)"
        )
    registry, databases, complete = resolve_registry(conn, keys, entries, note)
    identity = ServerIdentity(started, _system_identifier(conn) if reads_control else None)
    return Session(conn, role, version, registry, databases, complete, identity)


def _system_identifier(conn: psycopg.Connection[Any]) -> int | None:
    row = conn.execute(SYSTEM_IDENTIFIER_SQL).fetchone()
    return row[0] if row is not None and type(row[0]) is int else None


class ServerConnection(KeptConnection[Session]):
    """The one connection a target keeps to its server, and the key registry resolved on it.

    Its user is the target's collection, one at a time, which gets the connection with
    `connection()` within `use()`; other threads interrupt or close it (KeptConnection).
    A /locks read makes one of its own for that read (`announce` off: it logs no
    "connected" at each page view).
    """

    def __init__(
        self,
        config: TargetSettings,
        *,
        announce: bool = True,
        application_name: str = APPLICATION_NAME,
        registry: bool = True,
    ) -> None:
        super().__init__(
            self._connect,
            self._prepare,
            backoff_max=config.collection.reconnect_backoff_max,
            cancel=True,
        )
        self.name = config.name
        self._announce = announce
        self._application_name = application_name
        self._config = config
        self._settings = config.collection
        # Used by the connection's user only.
        self._conninfo = config.dsn
        self.role = ""
        self.registry = NO_KEYS
        self.identity: ServerIdentity | None = None  # of the server last connected to
        # Without `registry`, a read that names no lock (pg_stat_statements') resolves none.
        self._keys = config.keys if registry else ()
        self._entries = catalog.selected(config.catalog) if registry else ()
        self._databases: frozenset[str] = frozenset()  # the registry's catalog keys cover
        self._new_database = False  # a collection saw one: resolve again before the next
        # False once a server-side read of the registry failed: tried again at the next
        # connection, not at every collection (each would put an error in the server's log).
        self._complete = True
        self._said = logs.Changes()  # catalog entries left out, each logged once

    def connection(self) -> psycopg.Connection[Any]:
        """The open connection, or a new one (CannotCollect or psycopg.Error if not, and
        the next attempt waits out the backoff)."""
        try:
            session = self.get()
        except BaseException:
            self.failed()
            raise
        self.succeeded()
        if self._new_database:
            self._resolve_again(session.conn)
        return session.conn

    def saw_databases(self, databases: Iterable[str]) -> None:
        """Called with the databases a collection saw (its snapshot's deadlocks name every
        one but the templates): one the registry's catalog keys do not cover yet is
        resolved before the next collection, on the same connection, from pg_database."""
        if (
            self._complete
            and needs_databases(self._keys, self._entries)
            and not self._databases.issuperset(databases)
        ):
            self._new_database = True

    def redact(self, message: str) -> str:
        # The last conninfo used carries the password, wherever it came from.
        return redact(message, self._conninfo)

    def _connect(self) -> psycopg.Connection[Any]:
        try:
            self._conninfo = self._config.conninfo()
        except ValueError as exc:  # the password file cannot be read now
            raise CannotCollect(str(exc)) from None
        return connect_to_server(self._conninfo, self._settings, self._application_name)

    def _prepare(self, conn: psycopg.Connection[Any]) -> Session:
        session = prepare_session(conn, self._settings, self._keys, self._entries, self._note)
        if self._announce:
            log.info(
                "connected", extra={"target": self.name, "server_version_num": session.version}
            )
        self.role = session.role
        self.registry = session.registry
        self.identity = session.identity
        self._databases = session.databases
        self._new_database, self._complete = False, session.complete
        return session

    def _resolve_again(self, conn: psycopg.Connection[Any]) -> None:
        registry, databases, complete = resolve_registry(
            conn, self._keys, self._entries, self._note
        )
        log.debug(
            "key registry resolved for new databases",
            extra={
                "target": self.name,
                "databases": ", ".join(sorted(databases - self._databases)),
            },
        )
        self.registry, self._databases = registry, databases
        self._new_database, self._complete = False, complete

    def _note(self, message: str) -> None:
        """Once per target, not at every connection: the same configuration says the same."""
        if self._said.changed(message, True):
            log.info(message, extra={"target": self.name})


class Unanswered(Exception):
    """The server could not be read: down, too slow, refusing; the message has no secret."""


@contextlib.contextmanager
def new_session(
    target: TargetSettings,
    watchdog: Watchdog,
    seconds: float,
    application_name: str = APPLICATION_NAME,
    registry: bool = True,
) -> Iterator[Session]:
    """A new connection of its own, closed at the end, and given up after `seconds` (a
    stopped backend or a hung proxy: the watchdog interrupts it, as a collection's)."""
    # Made for this one read (so never backing off), prepared as the collection's is, and
    # interrupted and closed as it is.
    server = ServerConnection(
        target, announce=False, application_name=application_name, registry=registry
    )
    with server.deadline(watchdog, seconds) as expired:
        try:
            try:
                yield server.get()
            finally:
                server.close()
        except (psycopg.Error, CannotCollect, ValueError) as exc:
            error = server.unanswered(seconds) if expired.is_set() else str(exc).strip()
            raise Unanswered(server.redact(error)) from None
