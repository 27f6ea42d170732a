"""The one statement a collection runs, and the snapshot of the server it returns."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row

from pg_advisory_exporter.keys.extension_tags import extension_of
from pg_advisory_exporter.keys.registry import NO_KEYS, RegisteredKey, Registry

from .capacity import CapacitySettings, lock_table_capacity
from .databases import NO_DATABASES, ROOM_TO_READ, Databases
from .dead_client import (
    ReleaseSettings,
    dead_client_release_seconds,
    idle_in_transaction_release_seconds,
)
from .key_matching import KeyArrays, key_matching
from .reads import ApplicationEntries, LockWaits, columns_for, mapped, server_version
from .vocabulary import EXCLUSIVE_LOCK, SHARE_LOCK, certainly_session_level, state_word

# The collection: pg_locks is read exactly once, in lock_groups, and aggregated there to
# one row per backend, so the cost stays close to a bare count(*) of pg_locks and the
# exporter never receives a row per lock. Run in autocommit, the statement sees the locks
# and the backends' activity as of the same moment. It names functions only, never a
# relation (reads.py says why: it takes no lock, so it still runs when the lock table is
# full): pg_lock_status() for the pg_locks view, pg_stat_get_activity() for
# pg_stat_activity, and databases by oid, named from the list read apart (databases.py).
# Notes:
# - A backend waits for at most one lock, so min(waitstart) is the start of that wait; it
#   counts only when the awaited lock is advisory (awaited_mode is set).
# - Only a backend inside a transaction holds a virtualxid lock, its own: a backend without
#   one holds nothing but session-level locks. pg_locks shows this to any role, where
#   pg_stat_activity hides other sessions' state without pg_read_all_stats. The /locks read
#   tells the same from its advisory rows' virtualtransaction ("n/0"), which this statement
#   does not read (a text per lock row); tests/test_outside_transaction.py proves the two
#   agree in every state a holder can be in.
# - count(virtualxid) and min(waitstart) skip the NULLs most rows carry, which is cheaper
#   than a FILTER on locktype.
# - Table and advisory entries are every entry less the fast-path and the other entries:
#   an advisory lock, the row there can be 100,000 of, is then counted once, not twice
#   (one transition call less per row: about 0.02x the bare count at 100,000 locks).
# - An advisory-tag lock whose objsubid is neither 1 nor 2 is an extension's own
#   (keys/extension_tags.py), counted apart, never one of the application's advisory locks:
#   its code (objsubid, times 2, plus 1 if awaited) in extension_codes, which _backend takes
#   from the advisory entries. One aggregate whose filter fails at once on an application's
#   key (its first test, an integer comparison): three, one per figure, cost 0.08x the bare
#   count at 100,000 locks (make bench), and each of the advisory aggregates a second test.
# - activity is used twice (the backends with advisory locks, and the lock table's entries
#   by application): a CTE used twice is computed once.
# - state_change is NULL where privileges hide it, so state_seconds is NULL there too, as are
#   backend_start and xact_start; the three bound how long a lock has been held (holds.py),
#   and now() (the statement's start) is what they are measured against.
# - client_addr and client_port say which pooler connection a backend serves; a Unix
#   socket's port is -1, read as NULL like a hidden one.
# - The reads of `totals` (reads.py) are read once, in its one row, not once per backend
#   row (a fifth of the statement's time at 200 locks over 100 backends).
# - {key_codes} and {registered_keys} match the key registry (key_matching.py).
_COLLECT_TEMPLATE = """
WITH lock_groups AS (
    SELECT
        l.pid,
        count(*) AS entries,
        count(*) FILTER (WHERE l.fastpath) AS fastpath_entries,
        count(*) FILTER (WHERE l.locktype <> 'advisory') AS other_entries,
        count(*) FILTER (WHERE l.mode = 'ShareLock' AND l.locktype = 'advisory'
                           AND l.objsubid <= 2) AS share_entries,
        max(l.mode) FILTER (WHERE NOT l.granted AND l.locktype = 'advisory'
                              AND l.objsubid <= 2) AS awaited_mode,
        min(l.waitstart) AS wait_start,
        count(l.virtualxid) AS virtualxid_locks,
        pg_catalog.array_agg(l.objsubid::int * 2 + (NOT l.granted)::int)
            FILTER (WHERE l.objsubid > 2 AND l.locktype = 'advisory') AS extension_codes{key_codes}
    FROM pg_catalog.pg_lock_status() AS l
    GROUP BY l.pid
),
backend_locks AS (
    SELECT
        pid,
        entries - fastpath_entries AS table_entries,
        entries - other_entries AS advisory_entries,
        share_entries,
        awaited_mode,
        wait_start,
        virtualxid_locks > 0 AS in_transaction,
        extension_codes,
        {registered_keys} AS registered_keys
    FROM lock_groups
),
activity AS (
    SELECT a.pid, a.datid, a.application_name, a.state, a.client_addr, a.client_port,
           a.state_change, a.backend_start, a.xact_start
    FROM pg_catalog.pg_stat_get_activity(NULL) AS a
),
totals AS (
    SELECT
        coalesce(sum(table_entries), 0)::bigint AS lock_table_entries,
        coalesce(max(table_entries) FILTER (WHERE pid IS NOT NULL), 0)::bigint
            AS backend_table_entries_max{reads}
    FROM backend_locks
    WHERE pid IS DISTINCT FROM pg_catalog.pg_backend_pid()
)
SELECT
    t.*,
    b.*,
    a.datid::bigint AS datid,
    a.application_name,
    a.state,
    pg_catalog.host(a.client_addr) AS client_addr,
    nullif(a.client_port, -1) AS client_port,
    extract(epoch FROM now() - a.state_change)::float8 AS state_seconds,
    extract(epoch FROM a.backend_start)::float8 AS backend_start,
    extract(epoch FROM a.xact_start)::float8 AS xact_start,
    CASE WHEN b.awaited_mode IS NOT NULL
         THEN extract(epoch FROM now() - coalesce(b.wait_start, now()))::float8
    END AS wait_seconds
FROM totals AS t
LEFT JOIN (backend_locks AS b JOIN activity AS a ON a.pid = b.pid)
       ON b.advisory_entries > 0 AND b.pid <> pg_catalog.pg_backend_pid()
"""


@functools.lru_cache(maxsize=64)
def _collect_sql(arrays: KeyArrays, reads: str) -> str:
    key_codes, registered_keys = key_matching(dict(arrays))
    return _COLLECT_TEMPLATE.format(
        key_codes=key_codes, registered_keys=registered_keys, reads=reads
    )


def collect_sql(version: int, registry: Registry = NO_KEYS) -> str:
    """The collection statement for a server of this version (server_version_num) and this
    registry, its keys written in as constants; the databases it reads deadlocks for are
    bound as %(databases)s (collection_parameters)."""
    arrays = registry.sql_parameters()
    keys = tuple((name, tuple(arrays[name])) for name in sorted(arrays))
    return _collect_sql(keys, columns_for(version))


@dataclass(frozen=True)
class KeyUse:
    """What one backend does with one registered key."""

    key_index: int  # position in the registry
    held: int  # entries granted (a namespace can match several keys)
    awaited: bool


@dataclass(frozen=True)
class BackendLocks:
    """One backend that holds or awaits advisory locks, as the collection saw it: counts
    aggregated in SQL, never its locks one by one. The /locks read (forensics.model.Backend)
    is the other model of a backend, and rightly so: it reads each lock (capped), for one
    person's question, where this is read on every scrape at any number of locks. Both tell
    the server's session facts to holds.Holder, and derive session level in one place
    (vocabulary.certainly_session_level, through `session_level` here and Holder's there)."""

    pid: int
    datname: str
    application_name: str
    state: str | None  # pg_stat_activity.state; None where privileges hide it
    state_seconds: float | None  # time in that state; None where privileges hide it
    in_transaction: bool
    advisory_entries: int  # held and awaited, one per key and mode
    share_entries: int
    awaited_mode: str | None  # EXCLUSIVE_LOCK or SHARE_LOCK while waiting
    wait_seconds: float | None
    table_entries: int  # all lock types, fast-path locks excluded
    registered: tuple[KeyUse, ...] = ()
    # Where the backend's client connects from (a pooler's, for a pooled backend); None for
    # a Unix socket, or where privileges hide it.
    client_addr: str | None = None
    client_port: int | None = None
    # When the backend and its transaction started (Unix time); None where privileges hide
    # them, and the transaction's outside one.
    backend_start: float | None = None
    xact_start: float | None = None

    @property
    def waiting(self) -> bool:
        return self.awaited_mode is not None

    @property
    def session_level(self) -> bool:
        """Whether every lock it holds is certainly session-level."""
        return certainly_session_level(not self.in_transaction, self.state)

    @property
    def state_word(self) -> str:
        """Its state as the metrics' `state` label names it."""
        return state_word(self.state, not self.in_transaction)

    @property
    def held_share(self) -> int:
        return self.share_entries - (self.awaited_mode == SHARE_LOCK)

    @property
    def held_exclusive(self) -> int:
        return self.advisory_entries - self.share_entries - (self.awaited_mode == EXCLUSIVE_LOCK)

    @property
    def held(self) -> int:
        return self.held_share + self.held_exclusive


@dataclass(frozen=True)
class ExtensionLocks:
    """One backend's advisory-tag locks of an extension's own (keys/extension_tags.py)."""

    datname: str
    extension: str
    held: int
    awaited: int


def counted_uses(backend: BackendLocks, registry: Registry) -> list[tuple[RegisteredKey, KeyUse]]:
    """The backend's registered keys, in the databases each key is registered for."""
    if not backend.registered:  # most backends: once per backend and collection
        return []
    pairs = [(registry.keys[use.key_index], use) for use in backend.registered]
    return [
        (key, use)
        for key, use in pairs
        if not key.config.databases or backend.datname in key.config.databases
    ]


def grant_read_all_stats(role: str) -> str:
    """The statement that lets `role` see other sessions' state (without it,
    can_read_all_stats is false), as the messages that ask for it write it."""
    quoted = '"' + role.replace('"', '""') + '"'  # an identifier, as PostgreSQL quotes one
    return f"GRANT pg_read_all_stats TO {quoted}"


@dataclass(frozen=True)
class ServerSnapshot:
    """Everything one collection learnt about one server."""

    server_version: str
    server_version_num: int  # what its reads were chosen by (reads.server_version)
    current_database: str
    read_at: float  # the server's now() when it read pg_locks (Unix time)
    capacity_settings: CapacitySettings
    release_settings: ReleaseSettings
    can_read_all_stats: bool
    deadlocks: Mapping[str, int]
    lock_table_entries: int
    backend_table_entries_max: int
    backends: tuple[BackendLocks, ...]
    # The lock table's entries (all lock types) by database and application (reads.py).
    table_entries_by_application: tuple[ApplicationEntries, ...] = ()
    lock_waits: LockWaits | None = None  # PostgreSQL 19's count of them (reads.py)
    extension_locks: tuple[ExtensionLocks, ...] = ()
    # The entries the table held when the server last refused the exporter one (its list of
    # databases), on this connection: the table's real size, where it is below capacity.
    refused_at: int | None = None

    @property
    def idle_session_holders(self) -> int:
        """Backends holding advisory locks outside any transaction: session locks only, those
        a dead client would keep (pg_advisory_idle_session_holders)."""
        return sum(1 for b in self.backends if b.held and not b.in_transaction)

    @property
    def databases(self) -> frozenset[str]:
        """The server's databases but the templates (those it reads deadlocks for)."""
        return frozenset(self.deadlocks)

    @property
    def lock_table_capacity(self) -> int | None:
        """The entries its lock table is sized for (capacity.py); None where not verified."""
        return lock_table_capacity(self.capacity_settings, self.server_version_num)

    @property
    def lock_table_full(self) -> bool:
        """Whether the lock table is full: it has less room left than one backend's budget
        (max_locks_per_transaction), or holds as many entries as when the server refused the
        exporter an entry (`refused_at`). A server refuses at about its capacity: a few
        entries short of it on PostgreSQL 19, and before 19 anywhere from there to twice past
        it, as much as the spare shared memory that earlier growth left allows."""
        capacity = self.lock_table_capacity
        budget = self.capacity_settings.max_locks_per_transaction
        entries = self.lock_table_entries
        if capacity is not None and entries > capacity - budget:
            return True
        return self.refused_at is not None and entries >= self.refused_at

    @property
    def room_to_read(self) -> bool:
        """Whether the lock table has room for the exporter to take an entry for a moment
        (to read the list of databases, a shared catalog): not full, and below ROOM_TO_READ
        of its capacity where that is known."""
        capacity = self.lock_table_capacity
        if self.lock_table_full:
            return False
        return capacity is None or self.lock_table_entries < ROOM_TO_READ * capacity

    @property
    def dead_client_release_seconds(self) -> float | None:
        """How long a dead client's idle session keeps its locks (dead_client.py); None where
        the keepalive settings cannot be read."""
        settings = self.release_settings
        return dead_client_release_seconds(settings) if settings.known else None

    @property
    def idle_in_transaction_release_seconds(self) -> float:
        """How long a stuck client's session idle in a transaction keeps them (+Inf: for ever)."""
        return idle_in_transaction_release_seconds(self.release_settings)


def _age(seconds: float | None) -> float | None:
    # now() is the statement's start: a state entered after it would come out negative.
    return None if seconds is None else max(seconds, 0.0)


def _key_uses(row: Mapping[str, Any]) -> tuple[KeyUse, ...]:
    return tuple(
        KeyUse(index, entries - awaited, awaited)
        for index, entries, awaited in row["registered_keys"] or ()
    )


def _backend(row: Mapping[str, Any], databases: Databases) -> BackendLocks:
    return BackendLocks(
        pid=row["pid"],
        datname=databases.name(row["datid"]),
        application_name=row["application_name"] or "",
        state=row["state"],
        state_seconds=_age(row["state_seconds"]),
        in_transaction=row["in_transaction"],
        advisory_entries=row["advisory_entries"] - len(row["extension_codes"] or ()),
        share_entries=row["share_entries"],
        awaited_mode=row["awaited_mode"],
        wait_seconds=_age(row["wait_seconds"]),
        table_entries=row["table_entries"],
        registered=_key_uses(row),
        client_addr=row["client_addr"],
        client_port=row["client_port"],
        backend_start=row["backend_start"],
        xact_start=row["xact_start"],
    )


def _extension_locks(row: Mapping[str, Any], databases: Databases) -> list[ExtensionLocks]:
    """The backend's extensions' own locks, by extension, from their codes."""
    counts: dict[str, list[int]] = {}
    for code in row["extension_codes"] or ():
        held_awaited = counts.setdefault(extension_of(code >> 1), [0, 0])
        held_awaited[code & 1] += 1
    datname = databases.name(row["datid"])
    return [
        ExtensionLocks(datname, extension, held, awaited)
        for extension, (held, awaited) in counts.items()
    ]


def read_snapshot(
    conn: psycopg.Connection[Any], registry: Registry = NO_KEYS, databases: Databases = NO_DATABASES
) -> ServerSnapshot:
    """Run the collection statement once, the one for the connection's server version, and
    map its rows, naming databases from `databases` (and reading deadlocks for its own)."""
    version = server_version(conn)
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(
            collect_sql(version, registry), {"databases": list(databases.worked_in)}
        ).fetchall()
    first = rows[0]  # totals always yield one row, with NULL backend columns if none
    return ServerSnapshot(
        **mapped(version, first, databases),
        server_version_num=version,
        lock_table_entries=first["lock_table_entries"],
        backend_table_entries_max=first["backend_table_entries_max"],
        backends=tuple(
            _backend(row, databases)
            for row in rows
            if row["pid"] is not None
            and row["advisory_entries"] > len(row["extension_codes"] or ())
        ),
        extension_locks=tuple(
            locks
            for row in rows
            if row["extension_codes"]
            for locks in _extension_locks(row, databases)
        ),
    )
