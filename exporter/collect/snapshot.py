"""The one statement a collection runs, and the snapshot of the server it returns."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row

from pg_advisory_exporter.keys.registry import NO_KEYS, RegisteredKey, Registry

from .capacity import CapacitySettings, lock_table_capacity
from .dead_client import (
    ReleaseSettings,
    dead_client_release_seconds,
    idle_in_transaction_release_seconds,
)
from .key_matching import KeyArrays, key_matching
from .versions import LockWaits, columns_for, lock_waits
from .vocabulary import EXCLUSIVE_LOCK, SHARE_LOCK, certainly_session_level, state_word

# The collection: pg_locks is read exactly once, in lock_groups, and aggregated there to
# one row per backend, so the cost stays close to a bare count(*) of pg_locks and the
# exporter never receives a row per lock. Run in autocommit, the statement sees pg_locks
# and pg_stat_activity as of the same moment. Notes:
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
# - state_change is NULL where privileges hide it, so state_seconds is NULL there too, as are
#   backend_start and xact_start; the three bound how long a lock has been held (holds.py),
#   and now() (the statement's start) is what they are measured against.
# - client_addr and client_port say which pooler connection a backend serves; a Unix
#   socket's port is -1, read as NULL like a hidden one.
# - Deadlocks are read for every database but the templates (datistemplate, template0,
#   template1 and any made with IS_TEMPLATE): a template is copied, not worked in, so its
#   series would only be noise. The join also drops the shared-objects row (datid 0). The
#   value repeats on every row: as text, so that only the first row's is parsed.
# - The settings, the privilege and the deadlocks are read once, in totals' one row, not
#   once per backend row (a fifth of the statement's time at 200 locks over 100 backends).
# - The keepalive settings and tcp_user_timeout show what the server applies to this TCP
#   session (the operating system's values where they are 0); on a Unix socket they show 0
#   whatever is set, so there the configured values (reset_val) are read too, from
#   pg_settings, which costs more and is read only then. The idle timeouts show with a unit
#   ("10min"), which an interval reads.
# - {key_codes} and {registered_keys} match the key registry (key_matching.py).
# - {versioned} is what the server's version adds (versions.py).
_COLLECT_TEMPLATE = """
WITH lock_groups AS (
    SELECT
        l.pid,
        count(*) AS entries,
        count(*) FILTER (WHERE l.fastpath) AS fastpath_entries,
        count(*) FILTER (WHERE l.locktype <> 'advisory') AS other_entries,
        count(*) FILTER (WHERE l.mode = 'ShareLock' AND l.locktype = 'advisory') AS share_entries,
        max(l.mode) FILTER (WHERE NOT l.granted AND l.locktype = 'advisory') AS awaited_mode,
        min(l.waitstart) AS wait_start,
        count(l.virtualxid) AS virtualxid_locks{key_codes}
    FROM pg_catalog.pg_locks AS l
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
        {registered_keys} AS registered_keys
    FROM lock_groups
),
totals AS (
    SELECT
        coalesce(sum(table_entries), 0)::bigint AS lock_table_entries,
        coalesce(max(table_entries) FILTER (WHERE pid IS NOT NULL), 0)::bigint
            AS backend_table_entries_max,
        pg_catalog.current_setting('server_version_num')::int AS server_version_num,
        pg_catalog.current_setting('server_version') AS server_version,
        pg_catalog.current_setting('max_locks_per_transaction')::int AS max_locks_per_transaction,
        pg_catalog.current_setting('max_connections')::int AS max_connections,
        pg_catalog.current_setting('autovacuum_max_workers')::int AS autovacuum_max_workers,
        pg_catalog.current_setting('autovacuum_worker_slots', true)::int
            AS autovacuum_worker_slots,
        pg_catalog.current_setting('max_worker_processes')::int AS max_worker_processes,
        pg_catalog.current_setting('max_wal_senders')::int AS max_wal_senders,
        pg_catalog.current_setting('max_prepared_transactions')::int
            AS max_prepared_transactions,
        pg_catalog.current_setting('tcp_keepalives_idle')::int AS tcp_keepalives_idle,
        pg_catalog.current_setting('tcp_keepalives_interval')::int AS tcp_keepalives_interval,
        pg_catalog.current_setting('tcp_keepalives_count')::int AS tcp_keepalives_count,
        pg_catalog.current_setting('tcp_user_timeout')::int AS tcp_user_timeout,
        extract(epoch FROM pg_catalog.current_setting('idle_session_timeout')::interval)::float8
            AS idle_session_timeout,
        extract(epoch FROM pg_catalog.current_setting(
            'idle_in_transaction_session_timeout')::interval)::float8
            AS idle_in_transaction_session_timeout,
        CASE WHEN pg_catalog.inet_server_addr() IS NULL THEN
            (SELECT pg_catalog.json_object_agg(s.name, s.reset_val)
               FROM pg_catalog.pg_settings AS s
              WHERE s.name IN ('tcp_keepalives_idle', 'tcp_keepalives_interval',
                               'tcp_keepalives_count', 'tcp_user_timeout'))::text
        END AS socket_keepalives,
        pg_catalog.pg_has_role('pg_read_all_stats', 'USAGE') AS can_read_all_stats,
        pg_catalog.current_database() AS current_database,
        extract(epoch FROM now())::float8 AS read_at,
        (SELECT pg_catalog.json_object_agg(d.datname, d.deadlocks)
           FROM pg_catalog.pg_stat_database AS d
           JOIN pg_catalog.pg_database AS db ON db.oid = d.datid
          WHERE NOT db.datistemplate)::text AS deadlocks{versioned}
    FROM backend_locks
    WHERE pid IS DISTINCT FROM pg_catalog.pg_backend_pid()
)
SELECT
    t.*,
    b.*,
    a.datname,
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
LEFT JOIN (backend_locks AS b JOIN pg_catalog.pg_stat_activity AS a ON a.pid = b.pid)
       ON b.advisory_entries > 0 AND b.pid <> pg_catalog.pg_backend_pid()
"""


@functools.lru_cache(maxsize=64)
def _collect_sql(arrays: KeyArrays, versioned: str) -> str:
    key_codes, registered_keys = key_matching(dict(arrays))
    return _COLLECT_TEMPLATE.format(
        key_codes=key_codes, registered_keys=registered_keys, versioned=versioned
    )


def collect_sql(version: int, registry: Registry = NO_KEYS) -> str:
    """The collection statement for a server of this version (server_version_num) and this
    registry, its keys written in as constants."""
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
    current_database: str
    read_at: float  # the server's now() when it read pg_locks (Unix time)
    capacity_settings: CapacitySettings
    release_settings: ReleaseSettings
    can_read_all_stats: bool
    deadlocks: Mapping[str, int]
    lock_table_entries: int
    backend_table_entries_max: int
    backends: tuple[BackendLocks, ...]
    lock_waits: LockWaits | None = None  # PostgreSQL 19's count of them (versions.py)

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
        return lock_table_capacity(self.capacity_settings)

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


def _backend(row: Mapping[str, Any]) -> BackendLocks:
    return BackendLocks(
        pid=row["pid"],
        datname=row["datname"] or "",
        application_name=row["application_name"] or "",
        state=row["state"],
        state_seconds=_age(row["state_seconds"]),
        in_transaction=row["in_transaction"],
        advisory_entries=row["advisory_entries"],
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


def _release_settings(row: Mapping[str, Any]) -> ReleaseSettings:
    # A TCP session's values are those in force on it; a Unix socket's come configured.
    socket = row["socket_keepalives"]
    given = row if socket is None else json.loads(socket)
    settings = ReleaseSettings(
        int(given["tcp_keepalives_idle"]),
        int(given["tcp_keepalives_interval"]),
        int(given["tcp_keepalives_count"]),
        int(given["tcp_user_timeout"]),
        row["idle_session_timeout"],
        row["idle_in_transaction_session_timeout"],
    )
    return settings if socket is None else settings.configured()


def read_snapshot(conn: psycopg.Connection[Any], registry: Registry = NO_KEYS) -> ServerSnapshot:
    """Run the collection statement once, the one for the connection's server version, and
    map its rows."""
    sql = collect_sql(conn.info.server_version, registry)
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(sql).fetchall()
    first = rows[0]  # totals always yield one row, with NULL backend columns if none
    return ServerSnapshot(
        server_version=first["server_version"].split()[0],
        current_database=first["current_database"],
        read_at=first["read_at"],
        capacity_settings=CapacitySettings(
            server_version_num=first["server_version_num"],
            max_locks_per_transaction=first["max_locks_per_transaction"],
            max_connections=first["max_connections"],
            autovacuum_max_workers=first["autovacuum_max_workers"],
            autovacuum_worker_slots=first["autovacuum_worker_slots"],
            max_worker_processes=first["max_worker_processes"],
            max_wal_senders=first["max_wal_senders"],
            max_prepared_transactions=first["max_prepared_transactions"],
        ),
        release_settings=_release_settings(first),
        can_read_all_stats=first["can_read_all_stats"],
        deadlocks=json.loads(first["deadlocks"] or "{}"),
        lock_table_entries=first["lock_table_entries"],
        backend_table_entries_max=first["backend_table_entries_max"],
        backends=tuple(_backend(row) for row in rows if row["pid"] is not None),
        lock_waits=lock_waits(first),
    )
