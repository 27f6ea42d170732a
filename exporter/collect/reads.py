"""What the collection statement reads beside pg_locks and the backends' activity, one declared
read each: its SQL (select-list items of the statement's `totals`, its one row), the server
versions it is for, and how its columns are mapped into the snapshot. The server's version is
decided here, once (`server_version`): the one psycopg knows from the connection's start (no
round trip), refused below the oldest the exporter reads; the statement is built for it, as
postgres_exporter's collectors switch their queries on it, and the session, the snapshot and
the lock table's size take it from there.

Every read names functions only, never a relation (a table or a view): a function such as
pg_stat_get_activity() takes no lock, where the pg_stat_activity view locks the shared
catalogs it joins (pg_database, pg_authid), and a shared relation's lock needs an entry in
the shared lock table, which is refused when the table is full: the one moment the
statement must still run. tests/test_full_lock_table.py runs the statement of every version
on a full lock table, and counts the locks it takes: none but its own transaction's."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import psycopg

from .capacity import CapacitySettings
from .databases import Databases
from .dead_client import ReleaseSettings
from .kept_connection import CannotCollect

# The oldest server the exporter reads: pg_locks.waitstart, which the wait metrics read, is
# new in 14.
MIN_SERVER_VERSION = 140000

# A row of `totals`, and the server's databases by oid (what the statement reads as oids),
# into fields of the snapshot (snapshot.ServerSnapshot).
Mapper = Callable[[Mapping[str, Any], Databases], Mapping[str, Any]]


@dataclass(frozen=True)
class LockWaits:
    """The server's own count of advisory lock waits (pg_stat_lock, PostgreSQL 19): those that
    outlived deadlock_timeout and then got the lock, and the time they waited. A wait given up
    (lock_timeout, a cancel), a shorter one and a pg_try_advisory_* call are not counted."""

    waits: int
    wait_seconds: float


@dataclass(frozen=True)
class ApplicationEntries:
    """The shared lock table's entries (all lock types) held by one application's backends in
    one database: who fills the table, whatever it locks."""

    datname: str
    application_name: str
    entries: int


@dataclass(frozen=True)
class Read:
    """One read of `totals`, mapped into the snapshot's fields by `mapped`."""

    columns: str  # select-list items of `totals`, each after a comma: functions only
    mapped: Mapper
    since: int = MIN_SERVER_VERSION  # server_version_num
    until: int | None = None  # the last server_version_num it is for; None: every later one
    series: tuple[str, ...] = ()  # what it is exported as, where a version lacks it

    def reads_on(self, version: int) -> bool:
        return self.since <= version and (self.until is None or version <= self.until)


SERVER = Read(
    """,
        pg_catalog.current_setting('server_version') AS server_version,
        pg_catalog.current_database() AS current_database,
        extract(epoch FROM now())::float8 AS read_at""",
    lambda row, _: {
        "server_version": row["server_version"].split()[0],
        "current_database": row["current_database"],
        "read_at": row["read_at"],
    },
)

# The settings that size the lock table (capacity.py); autovacuum_worker_slots is new in 18.
CAPACITY = Read(
    """,
        pg_catalog.current_setting('max_locks_per_transaction')::int AS max_locks_per_transaction,
        pg_catalog.current_setting('max_connections')::int AS max_connections,
        pg_catalog.current_setting('autovacuum_max_workers')::int AS autovacuum_max_workers,
        pg_catalog.current_setting('autovacuum_worker_slots', true)::int
            AS autovacuum_worker_slots,
        pg_catalog.current_setting('max_worker_processes')::int AS max_worker_processes,
        pg_catalog.current_setting('max_wal_senders')::int AS max_wal_senders,
        pg_catalog.current_setting('max_prepared_transactions')::int
            AS max_prepared_transactions""",
    lambda row, _: {
        "capacity_settings": CapacitySettings(
            max_locks_per_transaction=row["max_locks_per_transaction"],
            max_connections=row["max_connections"],
            autovacuum_max_workers=row["autovacuum_max_workers"],
            autovacuum_worker_slots=row["autovacuum_worker_slots"],
            max_worker_processes=row["max_worker_processes"],
            max_wal_senders=row["max_wal_senders"],
            max_prepared_transactions=row["max_prepared_transactions"],
        )
    },
)


def _release_settings(row: Mapping[str, Any], _: Databases) -> dict[str, ReleaseSettings]:
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
    return {"release_settings": settings if socket is None else settings.configured()}


# The keepalive settings and tcp_user_timeout show what the server applies to this TCP session
# (the operating system's values where they are 0); on a Unix socket they show 0 whatever is
# set, so there the configured values (reset_val) are read too, from the function behind the
# pg_settings view, which costs more and is called only then. The idle timeouts show with a
# unit ("10min"), which an interval reads.
RELEASE = Read(
    """,
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
               FROM pg_catalog.pg_show_all_settings() AS s
              WHERE s.name IN ('tcp_keepalives_idle', 'tcp_keepalives_interval',
                               'tcp_keepalives_count', 'tcp_user_timeout'))::text
        END AS socket_keepalives""",
    _release_settings,
)

PRIVILEGE = Read(
    """,
        pg_catalog.pg_has_role('pg_read_all_stats', 'USAGE') AS can_read_all_stats""",
    lambda row, _: {"can_read_all_stats": row["can_read_all_stats"]},
)


def _deadlocks(row: Mapping[str, Any], databases: Databases) -> dict[str, dict[str, int]]:
    counts: dict[str, int] = json.loads(row["deadlocks"] or "{}")
    return {"deadlocks": {databases.name(int(oid)): count for oid, count in counts.items()}}


# Deadlocks of the databases the list gives (databases.py), bound as %(databases)s: every one
# but the templates, which are copied, not worked in (their series would only be noise). As
# text, like every value of `totals` that is not a number.
DEADLOCKS = Read(
    """,
        (SELECT pg_catalog.json_object_agg(d.oid, pg_catalog.pg_stat_get_db_deadlocks(d.oid))
           FROM pg_catalog.unnest(%(databases)s::oid[]) AS d(oid))::text AS deadlocks""",
    _deadlocks,
)


def _table_entries(
    row: Mapping[str, Any], databases: Databases
) -> dict[str, tuple[ApplicationEntries, ...]]:
    found = json.loads(row["table_entries_by_application"] or "[]")
    return {
        "table_entries_by_application": tuple(
            ApplicationEntries(databases.name(datid), application_name or "", int(entries))
            for datid, application_name, entries in found
        )
    }


# The lock table's entries by database and application, of every backend that holds any (a
# few rows: one per application in a transaction): the application that fills the table is
# named whatever it locks, advisory keys or the relations of a query over thousands of
# partitions. The rewrites of application_name apply after, so they are summed in Python.
TABLE_ENTRIES = Read(
    """,
        (SELECT pg_catalog.json_agg(
                    pg_catalog.json_build_array(g.datid, g.application_name, g.entries))
           FROM (SELECT a.datid::bigint AS datid, a.application_name,
                        sum(b.table_entries) AS entries
                   FROM backend_locks AS b JOIN activity AS a ON a.pid = b.pid
                  WHERE b.table_entries > 0 AND b.pid <> pg_catalog.pg_backend_pid()
                  GROUP BY 1, 2) AS g)::text AS table_entries_by_application""",
    _table_entries,
)


def _lock_waits(row: Mapping[str, Any], _: Databases) -> dict[str, LockWaits]:
    waits, wait_ms = json.loads(row["advisory_lock_waits"])
    return {"lock_waits": LockWaits(int(waits), float(wait_ms) / 1000.0)}


# The function behind the pg_stat_lock view: one row per lock type; wait_time in milliseconds.
LOCK_WAITS = Read(
    """,
        (SELECT pg_catalog.json_build_array(s.waits, s.wait_time)
           FROM pg_catalog.pg_stat_get_lock() AS s
          WHERE s.locktype = 'advisory')::text AS advisory_lock_waits""",
    _lock_waits,
    since=190000,
    series=("pg_advisory_server_lock_waits_total", "pg_advisory_server_lock_wait_seconds_total"),
)

READS = (SERVER, CAPACITY, RELEASE, PRIVILEGE, DEADLOCKS, TABLE_ENTRIES, LOCK_WAITS)


def server_version(conn: psycopg.Connection[Any]) -> int:
    """The server's version (server_version_num), as libpq has it from the connection's start;
    CannotCollect for a server older than MIN_SERVER_VERSION."""
    version = conn.info.server_version
    if version < MIN_SERVER_VERSION:
        raise CannotCollect(
            f"PostgreSQL {version // 10000} is not supported: pg-advisory-exporter "
            "needs PostgreSQL 14 or newer (it reads pg_locks.waitstart)"
        )
    return version


def reads_for(version: int) -> tuple[Read, ...]:
    """The reads of a server of this version (server_version_num)."""
    return tuple(read for read in READS if read.reads_on(version))


def columns_for(version: int) -> str:
    """The reads' part of `totals` for a server of this version."""
    return "".join(read.columns for read in reads_for(version))


def mapped(version: int, row: Mapping[str, Any], databases: Databases) -> dict[str, Any]:
    """The snapshot's fields from `totals`' row, for a server of this version."""
    fields: dict[str, Any] = {}
    for read in reads_for(version):
        fields.update(read.mapped(row, databases))
    return fields
