"""One target's connection to its server: opened with the settings that keep the exporter
harmless, and kept (kept_connection.py) with the key registry resolved on it; and a
connection of its own for one read (/locks, check, pg_stat_statements)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
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

from .capacity import FULL_TABLE_NO_SESSION, refused_for_full_table
from .databases import NO_DATABASES, Databases, OddDatabases, read_databases
from .kept_connection import APPLICATION_NAME, CannotCollect, KeptConnection, connect
from .reads import server_version
from .scheduling import Watchdog

log = logging.getLogger(__name__)

# The session's work_mem. The scan of pg_lock_status() keeps its rows in a tuplestore
# (about 150 bytes a lock) that spills to a temporary file past work_mem: at the default
# 4MB from about 27,000 locks (at 100,000, 7MB written and read back). Kept in memory, the
# statement at 100,000 locks costs 1.14-1.22x a bare count at the server's settings instead
# of 1.38-1.41x when the backend keeps that memory between collections, and 1.37-1.38x when
# its allocator gives it back and takes it again each time (page faults, costly in a
# virtual machine): never more than spilling (interleaved, 50-100 rounds; the bare count
# itself gains too, to 0.79-0.81x). 32MB holds about 200,000 locks; the memory is taken only
# as far as the locks need it, and past it the rows spill as before.
COLLECTION_WORK_MEM = "32MB"
# Which of the two a backend does is glibc's choice, made by what the session freed before:
# once it has freed a block larger than the tuplestore's (one of 30MB, allocated and freed by
# its own mmap), glibc raises its thresholds to it and keeps what a collection frees for the
# next one. So a session frees such a block once, before its first collection of a table of
# WARM_UP_AFTER entries or more, after which every collection is the faster case whatever
# the session did before (measured in the exporter's own sessions with the default catalog:
# 1.31-1.33x the bare count instead of 1.40-1.46x; benchmarks/). Below that the tuplestore is
# a few MB at most, and a fleet of small servers pays nothing.
WARM_UP_BYTES = 30 * 1024 * 1024
WARM_UP_AFTER = 10_000
WARM_UP_SQL = "SELECT pg_catalog.length(pg_catalog.repeat(' ', %(bytes)s))"

# Run once per connection, on a server of a version the exporter reads (reads.server_version):
# the session settings that keep the exporter harmless (and its collection cheap), and what
# tells this server from others (connection.ServerIdentity): when its postmaster started, and
# whether the role may read the system identifier (pg_control_system() is PUBLIC by default;
# some shops revoke it).
SESSION_SQL = """
SELECT current_user AS role,
       pg_catalog.pg_postmaster_start_time() AS started,
       pg_catalog.has_function_privilege('pg_catalog.pg_control_system()', 'EXECUTE')
           AS reads_control,
       pg_catalog.set_config('statement_timeout', %(statement_timeout)s, false),
       pg_catalog.set_config('lock_timeout', %(lock_timeout)s, false),
       pg_catalog.set_config('work_mem', %(work_mem)s, false),
       pg_catalog.set_config('default_transaction_read_only', 'on', false)
"""

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
    databases: Databases  # as read on this connection's start
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
    databases: Databases,
) -> tuple[Registry, bool]:
    """The registry on this connection's server: the user's keys, then the catalog's entries,
    each key computed per database for every database of the list (databases.py: never read
    from pg_locks), and whether it is complete. A key clash among the user's keys raises
    CannotCollect. A server-side read that fails or answers oddly leaves its keys out (those
    the server computes) and says so through `note`: the registry only names locks, and the
    collection does not need it to count them."""
    complete = True
    names = frozenset(databases.worked_in.values())
    catalog_keys = catalog.key_configs(entries, names)
    try:
        try:
            registry = Registry.resolve(keys, partial(_hash_texts, conn), catalog_keys, note, names)
        except (psycopg.Error, _OddAnswer) as exc:
            _without("the keys that hashtext() and hashtextextended() compute", exc, conn, note)
            complete = False
            registry = Registry.resolve(keys, None, catalog_keys, note, names)
    except ValueError as exc:
        raise CannotCollect(f"key registry: {exc}") from None
    return registry, complete


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
    *,
    names: bool = True,
) -> Session:
    """Ready a new connection the way every collection needs: read-only, with timeouts;
    with the server's list of databases, where its reads are to be named (`names`).

    The key registry is resolved on every new connection: hashtextextended() keys come
    from the server, whose major version may have changed since the last one, and the
    catalog's `entries` are computed for the databases it has now. `note` hears of the
    catalog entries left out because another entry names the same lock. The caller closes
    the connection if this fails (KeptConnection does).
    """
    version = server_version(conn)  # a server too old is refused before any statement
    row = conn.execute(
        SESSION_SQL,
        {
            "statement_timeout": f"{int(settings.statement_timeout * 1000)}ms",
            "lock_timeout": f"{int(settings.lock_timeout * 1000)}ms",
            "work_mem": COLLECTION_WORK_MEM,
        },
    ).fetchone()
    assert row is not None
    role, started, reads_control = row[0], row[1], row[2]
    databases = NO_DATABASES
    try:
        databases = read_databases(conn) if names else NO_DATABASES
    except (psycopg.Error, OddDatabases) as exc:
        _without("the list of its databases (named by oid until it can)", exc, conn, note)
    registry, complete = resolve_registry(conn, keys, entries, note, databases)
    identity = ServerIdentity(started, _system_identifier(conn) if reads_control else None)
    return Session(conn, role, version, registry, databases, complete, identity)


def warm_up_session(conn: psycopg.Connection[Any]) -> None:
    """Have the backend free a block of WARM_UP_BYTES, so that it keeps the collection's
    memory between collections (WARM_UP_BYTES says why)."""
    conn.execute(WARM_UP_SQL, {"bytes": WARM_UP_BYTES})


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
        # Without `registry`, a read that names no lock nor database (pg_stat_statements',
        # which joins them itself) resolves no key and lists no database.
        self._names = registry
        self._keys = config.keys if registry else ()
        self._entries = catalog.selected(config.catalog) if registry else ()
        self.databases = NO_DATABASES  # the server's, as last read (databases.py)
        self._listed = False  # the list was read on this connection's start, not since
        self._warm = False  # its backend has freed a block of WARM_UP_BYTES
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
        return session.conn

    def list_databases(self, conn: psycopg.Connection[Any], room: bool) -> bool:
        """The server's list of databases read again on `conn` (its connection, open), where
        the lock table has `room` for it (databases.py), and the registry's per-database
        keys computed for a database it gains; the list kept as it was where it cannot be
        read, and why said once. Not at a new connection's start, which has just read it.
        Whether the server refused the read because its lock table is full."""
        if self._listed:
            self._listed = False
            return False
        if not room:
            self._say_databases(
                "the lock table is nearly full: the list of databases is not read again (its "
                "read would take an entry) until it has room; a database created meanwhile is "
                "named by its oid"
            )
            return False
        try:
            databases = read_databases(conn)
        except (psycopg.Error, OddDatabases) as exc:
            if isinstance(exc, psycopg.Error) and (conn.closed or conn.broken):
                raise
            full = refused_for_full_table(exc)
            why = "the lock table is full" if full else str(exc).strip()
            self._say_databases(
                f"the list of databases cannot be read ({why}): the last one read names them, "
                "and a database created since is named by its oid"
            )
            return full
        if self._said.changed("databases", None):
            log.info("the list of databases is read again", extra={"target": self.name})
        gained = set(databases.worked_in.values()) - set(self.databases.worked_in.values())
        self.databases = databases
        if gained and self._complete and needs_databases(self._keys, self._entries):
            self.registry, self._complete = resolve_registry(
                conn, self._keys, self._entries, self._note, databases
            )
            log.debug(
                "key registry resolved for new databases",
                extra={"target": self.name, "databases": ", ".join(sorted(gained))},
            )
        return False

    def warm_up(self, conn: psycopg.Connection[Any], entries: int) -> None:
        """Once per connection, before its first collection of a table of WARM_UP_AFTER
        `entries` or more (warm_up_session)."""
        if self._warm or entries < WARM_UP_AFTER:
            return
        warm_up_session(conn)
        self._warm = True

    def _say_databases(self, message: str) -> None:
        if self._said.changed("databases", message):
            log.warning(message, extra={"target": self.name})

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
        session = prepare_session(
            conn, self._settings, self._keys, self._entries, self._note, names=self._names
        )
        if self._announce:
            log.info(
                "connected", extra={"target": self.name, "server_version_num": session.version}
            )
        self.role = session.role
        self.registry = session.registry
        self.identity = session.identity
        self.databases, self._listed = session.databases, True
        self._warm = False
        self._complete = session.complete
        return session

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
            if refused_for_full_table(exc):
                error = FULL_TABLE_NO_SESSION + error
            raise Unanswered(server.redact(error)) from None
