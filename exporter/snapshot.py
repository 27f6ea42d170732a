"""The one statement a collection runs, and the snapshot of the server it returns."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row

from .capacity import CapacitySettings
from .keys import BIGINT_KEY, INT_PAIR_KEY, AdvisoryKey
from .registry import NO_KEYS, Registry

# Run once per connection: the session settings that keep the exporter harmless, and the
# server version it checks before the first collection.
SESSION_SQL = """
SELECT pg_catalog.current_setting('server_version_num')::int AS server_version_num,
       current_user AS role,
       pg_catalog.set_config('statement_timeout', %(statement_timeout)s, false),
       pg_catalog.set_config('lock_timeout', %(lock_timeout)s, false),
       pg_catalog.set_config('default_transaction_read_only', 'on', false)
"""

# The collection: pg_locks is read exactly once, in lock_groups, and aggregated there to
# one row per backend (and per registered key it holds), so the cost stays close to a bare
# count(*) of pg_locks and the exporter never receives a row per lock. Run in autocommit,
# the statement sees pg_locks and pg_stat_activity as of the same moment. Notes:
# - A backend waits for at most one lock, so min(waitstart) is the start of that wait; it
#   counts only when the awaited lock is advisory (awaited_mode is set).
# - Only a backend inside a transaction holds a virtualxid lock, its own: a backend without
#   one holds nothing but session-level locks. pg_locks shows this to any role, where
#   pg_stat_activity hides other sessions' state without pg_read_all_stats.
# - count(virtualxid) and min(waitstart) skip the NULLs most rows carry, which is cheaper
#   than a FILTER on locktype.
# - state_change is NULL where privileges hide it, so state_seconds is NULL there too.
# - The key registry arrives as arrays and is matched by hash joins: exact keys on all
#   three key columns, namespaces on the first int. A join costs a hash probe per row, so
#   it is only there when the registry has keys of that kind.
# - Deadlocks are read for every database but the templates (datistemplate, template0,
#   template1 and any made with IS_TEMPLATE): a template is copied, not worked in, so its
#   series would only be noise. The join also drops the shared-objects row (datid 0).
# - {key_columns} and {key_rollup} are where the one-shot report adds the lowest key a
#   backend holds and the key it awaits.
_COLLECT_TEMPLATE = """
WITH {registry}lock_groups AS (
    SELECT
        l.pid,
        {key_index} AS key_index,
        count(*) FILTER (WHERE NOT l.fastpath) AS table_entries,
        count(*) FILTER (WHERE l.locktype = 'advisory') AS advisory_entries,
        count(*) FILTER (WHERE l.mode = 'ShareLock' AND l.locktype = 'advisory') AS share_entries,
        max(l.mode) FILTER (WHERE NOT l.granted AND l.locktype = 'advisory') AS awaited_mode,
        min(l.waitstart) AS wait_start,
        count(l.virtualxid) AS virtualxid_locks{key_columns}
    FROM pg_catalog.pg_locks AS l{registry_joins}
    GROUP BY l.pid{group_by_key}
),
backend_locks AS (
    SELECT
        pid,
        sum(table_entries)::bigint AS table_entries,
        sum(advisory_entries)::bigint AS advisory_entries,
        sum(share_entries)::bigint AS share_entries,
        max(awaited_mode) AS awaited_mode,
        min(wait_start) AS wait_start,
        sum(virtualxid_locks) > 0 AS in_transaction,
        pg_catalog.json_agg(
            pg_catalog.json_build_array(key_index, advisory_entries, awaited_mode IS NOT NULL)
        ) FILTER (WHERE key_index IS NOT NULL AND advisory_entries > 0)
            AS registered_keys{key_rollup}
    FROM lock_groups
    GROUP BY pid
),
totals AS (
    SELECT
        coalesce(sum(table_entries), 0)::bigint AS lock_table_entries,
        coalesce(max(table_entries) FILTER (WHERE pid IS NOT NULL), 0)::bigint
            AS backend_table_entries_max
    FROM backend_locks
    WHERE pid IS DISTINCT FROM pg_catalog.pg_backend_pid()
)
SELECT
    pg_catalog.current_setting('server_version_num')::int AS server_version_num,
    pg_catalog.current_setting('server_version') AS server_version,
    pg_catalog.current_setting('max_locks_per_transaction')::int AS max_locks_per_transaction,
    pg_catalog.current_setting('max_connections')::int AS max_connections,
    pg_catalog.current_setting('autovacuum_max_workers')::int AS autovacuum_max_workers,
    pg_catalog.current_setting('autovacuum_worker_slots', true)::int AS autovacuum_worker_slots,
    pg_catalog.current_setting('max_worker_processes')::int AS max_worker_processes,
    pg_catalog.current_setting('max_wal_senders')::int AS max_wal_senders,
    pg_catalog.current_setting('max_prepared_transactions')::int AS max_prepared_transactions,
    pg_catalog.pg_has_role('pg_read_all_stats', 'USAGE') AS can_read_all_stats,
    pg_catalog.current_database() AS current_database,
    (SELECT pg_catalog.json_object_agg(d.datname, d.deadlocks)
       FROM pg_catalog.pg_stat_database AS d
       JOIN pg_catalog.pg_database AS db ON db.oid = d.datid
      WHERE NOT db.datistemplate) AS deadlocks,
    t.lock_table_entries,
    t.backend_table_entries_max,
    b.*,
    a.datname,
    a.application_name,
    a.state,
    extract(epoch FROM now() - a.state_change)::float8 AS state_seconds,
    CASE WHEN b.awaited_mode IS NOT NULL
         THEN extract(epoch FROM now() - coalesce(b.wait_start, now()))::float8
    END AS wait_seconds
FROM totals AS t
LEFT JOIN (backend_locks AS b JOIN pg_catalog.pg_stat_activity AS a ON a.pid = b.pid)
       ON b.advisory_entries > 0 AND b.pid <> pg_catalog.pg_backend_pid()
"""

_EXACT_KEYS = """exact_keys AS (
    SELECT * FROM unnest(%(exact_index)s::int[], %(exact_objsubid)s::int2[],
                         %(exact_classid)s::oid[], %(exact_objid)s::oid[])
                  AS k(key_index, objsubid, classid, objid)
),
"""
_EXACT_JOIN = """
    LEFT JOIN exact_keys AS e
           ON e.objid = l.objid AND e.classid = l.classid AND e.objsubid = l.objsubid
          AND l.locktype = 'advisory'"""
_NAMESPACE_KEYS = """namespace_keys AS (
    SELECT * FROM unnest(%(namespace_index)s::int[], %(namespace_classid)s::oid[])
                  AS k(key_index, classid)
),
"""
_NAMESPACE_JOIN = f"""
    LEFT JOIN namespace_keys AS n
           ON n.classid = l.classid AND l.objsubid = {INT_PAIR_KEY} AND l.locktype = 'advisory'"""

_PACKED_KEY = "(l.classid::bigint << 32) | l.objid::bigint"
_KEY_COLUMNS = f""",
        min({_PACKED_KEY}) FILTER (WHERE l.granted AND l.objsubid = {BIGINT_KEY}
                                   AND l.locktype = 'advisory') AS held_bigint_key,
        min({_PACKED_KEY}) FILTER (WHERE l.granted AND l.objsubid = {INT_PAIR_KEY}
                                   AND l.locktype = 'advisory') AS held_pair_key,
        min({_PACKED_KEY}) FILTER (WHERE NOT l.granted AND l.locktype = 'advisory')
            AS awaited_key,
        min(l.objsubid) FILTER (WHERE NOT l.granted AND l.locktype = 'advisory')
            AS awaited_key_form"""
_KEY_ROLLUP = """,
        min(held_bigint_key) AS held_bigint_key,
        min(held_pair_key) AS held_pair_key,
        min(awaited_key) AS awaited_key,
        min(awaited_key_form) AS awaited_key_form"""


@functools.cache
def collect_sql(
    *, exact_keys: bool = False, namespaces: bool = False, with_keys: bool = False
) -> str:
    """The collection statement for a registry with these kinds of keys.

    with_keys adds the keys each backend holds and awaits, for the one-shot report.
    """
    key_index = {
        (False, False): "NULL::int",
        (True, False): "e.key_index",
        (False, True): "n.key_index",
        (True, True): "coalesce(e.key_index, n.key_index)",
    }[exact_keys, namespaces]
    return _COLLECT_TEMPLATE.format(
        registry=(_EXACT_KEYS if exact_keys else "") + (_NAMESPACE_KEYS if namespaces else ""),
        registry_joins=(_EXACT_JOIN if exact_keys else "")
        + (_NAMESPACE_JOIN if namespaces else ""),
        key_index=key_index,
        group_by_key=", 2" if exact_keys or namespaces else "",
        key_columns=_KEY_COLUMNS if with_keys else "",
        key_rollup=_KEY_ROLLUP if with_keys else "",
    )


COLLECT_SQL = collect_sql()


@dataclass(frozen=True)
class KeyUse:
    """What one backend does with one registered key."""

    key_index: int  # position in the registry
    held: int  # entries granted (a namespace can match several keys)
    awaited: bool


@dataclass(frozen=True)
class BackendLocks:
    """One backend that holds or awaits advisory locks, as the collection saw it."""

    pid: int
    datname: str
    application_name: str
    state: str | None  # pg_stat_activity.state; None where privileges hide it
    state_seconds: float | None  # time in that state; None where privileges hide it
    in_transaction: bool
    advisory_entries: int  # held and awaited, one per key and mode
    share_entries: int
    awaited_mode: str | None  # "ExclusiveLock" or "ShareLock" while waiting
    wait_seconds: float | None
    table_entries: int  # all lock types, fast-path locks excluded
    registered: tuple[KeyUse, ...] = ()
    held_key: AdvisoryKey | None = None  # the lowest key held; only for the report
    awaited_key: AdvisoryKey | None = None  # only for the report

    @property
    def waiting(self) -> bool:
        return self.awaited_mode is not None

    @property
    def held_share(self) -> int:
        return self.share_entries - (self.awaited_mode == "ShareLock")

    @property
    def held_exclusive(self) -> int:
        return self.advisory_entries - self.share_entries - (self.awaited_mode == "ExclusiveLock")

    @property
    def held(self) -> int:
        return self.held_share + self.held_exclusive


@dataclass(frozen=True)
class ServerSnapshot:
    """Everything one collection learnt about one server."""

    server_version: str
    current_database: str
    capacity_settings: CapacitySettings
    can_read_all_stats: bool
    deadlocks: Mapping[str, int]
    lock_table_entries: int
    backend_table_entries_max: int
    backends: tuple[BackendLocks, ...]


def _held_key(row: Mapping[str, Any]) -> AdvisoryKey | None:
    if row.get("held_bigint_key") is not None:
        return AdvisoryKey.from_packed(row["held_bigint_key"], BIGINT_KEY)
    if row.get("held_pair_key") is not None:
        return AdvisoryKey.from_packed(row["held_pair_key"], INT_PAIR_KEY)
    return None


def _awaited_key(row: Mapping[str, Any]) -> AdvisoryKey | None:
    if row.get("awaited_key") is None:
        return None
    return AdvisoryKey.from_packed(row["awaited_key"], row["awaited_key_form"])


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
        held_key=_held_key(row),
        awaited_key=_awaited_key(row),
    )


def read_snapshot(
    conn: psycopg.Connection[Any], registry: Registry = NO_KEYS, *, with_keys: bool = False
) -> ServerSnapshot:
    """Run the collection statement once and map its rows."""
    sql = collect_sql(
        exact_keys=registry.has_exact, namespaces=registry.has_namespaces, with_keys=with_keys
    )
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(sql, registry.sql_parameters()).fetchall()
    first = rows[0]  # totals always yield one row, with NULL backend columns if none
    return ServerSnapshot(
        server_version=first["server_version"].split()[0],
        current_database=first["current_database"],
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
        can_read_all_stats=first["can_read_all_stats"],
        deadlocks=first["deadlocks"] or {},
        lock_table_entries=first["lock_table_entries"],
        backend_table_entries_max=first["backend_table_entries_max"],
        backends=tuple(_backend(row) for row in rows if row["pid"] is not None),
    )
