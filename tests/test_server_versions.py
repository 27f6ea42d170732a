"""The reads of the collection statement (collect/reads.py): which a server of each version is
sent, how each is mapped, and what PostgreSQL 19's pg_stat_lock becomes. tests/test_pg19.py
reads a real 19, tests/test_full_lock_table.py every version with its lock table full."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
from support import IDLE, snapshot_of

from pg_advisory_exporter.collect.databases import Databases
from pg_advisory_exporter.collect.reads import (
    DEADLOCKS,
    LOCK_WAITS,
    READS,
    TABLE_ENTRIES,
    ApplicationEntries,
    LockWaits,
    Read,
    columns_for,
    mapped,
    reads_for,
)
from pg_advisory_exporter.collect.series import server_samples

DATABASES = Databases({5: "postgres", 16384: "shop", 1: "template1"}, frozenset({1}))


def test_each_read_for_its_versions() -> None:
    assert LOCK_WAITS not in reads_for(180004)
    assert reads_for(190000) == READS
    assert reads_for(200001) == READS  # no last version: every later one
    assert columns_for(190000) == "".join(read.columns for read in READS)
    bounded = replace(LOCK_WAITS, until=190099)
    assert bounded.reads_on(190000)
    assert not bounded.reads_on(190100)
    assert not bounded.reads_on(180000)


@pytest.mark.parametrize("read", READS, ids=lambda read: read.columns.split()[-1])
def test_every_read_names_functions_only(read: Read) -> None:
    """No FROM or JOIN of a relation: a view or a table is locked for the statement, and a
    shared catalog's lock needs an entry in the full lock table (reads.py). Relations the
    statement's own CTEs define (backend_locks, activity) are no relations of the server."""
    columns = read.columns
    sources = re.findall(r"\b(?:FROM|JOIN)\s+([\w.]+)(\s*\()?", columns)
    for name, call in sources:
        assert call or name in {"backend_locks", "activity"}, f"{name} in {columns}"


def test_pg_stat_lock_in_seconds() -> None:
    fields = LOCK_WAITS.mapped({"advisory_lock_waits": "[1, 2504.25]"}, DATABASES)
    assert fields == {"lock_waits": LockWaits(1, 2.50425)}


def test_databases_are_read_by_oid_and_named_from_the_list() -> None:
    """Deadlocks and the lock table's entries by application name their databases from the
    list; one the list has not seen yet (created while the table was too full to read it)
    by its oid."""
    row = {
        "deadlocks": '{"5": 0, "16384": 2, "16999": 1}',
        "table_entries_by_application": '[[16384, "job", 4704], [16999, "new", 3], [0, null, 2]]',
    }
    assert DEADLOCKS.mapped(row, DATABASES) == {
        "deadlocks": {"postgres": 0, "shop": 2, "oid:16999": 1}
    }
    assert TABLE_ENTRIES.mapped(row, DATABASES)["table_entries_by_application"] == (
        ApplicationEntries("shop", "job", 4704),
        ApplicationEntries("oid:16999", "new", 3),
        ApplicationEntries("", "", 2),  # a background worker: no database, no name
    )
    assert DATABASES.worked_in == {5: "postgres", 16384: "shop"}  # templates left out
    assert DEADLOCKS.mapped({"deadlocks": None}, DATABASES) == {"deadlocks": {}}


def test_a_version_maps_the_fields_of_its_reads() -> None:
    row = {
        "server_version": "19.0 (Debian 19.0-1)",
        "current_database": "postgres",
        "read_at": 1.5,
        "advisory_lock_waits": "[0, 0]",
    }
    fields = mapped(190000, {**row, **_settings()}, DATABASES)
    assert fields["server_version"] == "19.0"
    assert fields["lock_waits"] == LockWaits(0, 0.0)
    assert "lock_waits" not in mapped(180000, {**row, **_settings()}, DATABASES)


def _settings() -> dict[str, object]:
    return {
        "max_locks_per_transaction": 64,
        "max_connections": 100,
        "autovacuum_max_workers": 3,
        "autovacuum_worker_slots": 16,
        "max_worker_processes": 8,
        "max_wal_senders": 10,
        "max_prepared_transactions": 0,
        "tcp_keepalives_idle": 7200,
        "tcp_keepalives_interval": 75,
        "tcp_keepalives_count": 9,
        "tcp_user_timeout": 0,
        "idle_session_timeout": 0.0,
        "idle_in_transaction_session_timeout": 0.0,
        "socket_keepalives": None,
        "can_read_all_stats": True,
        "deadlocks": "{}",
        "table_entries_by_application": None,
    }


def test_the_server_counted_waits_are_the_servers_series() -> None:
    snapshot = replace(snapshot_of(IDLE), lock_waits=LockWaits(3, 7.5))
    samples = server_samples("main", snapshot, [], 100).samples
    found = {s.name: s.value for s in samples if s.name.startswith("pg_advisory_server_lock")}
    assert found == {
        "pg_advisory_server_lock_waits_total": 3,
        "pg_advisory_server_lock_wait_seconds_total": 7.5,
    }
    # On another target of the server (a database's probe), and before 19: none.
    probe = server_samples("main/app", snapshot, [], 100, database="app", server_wide=False)
    older = server_samples("main", snapshot_of(IDLE), [], 100)
    for mapped_samples in (probe, older):
        assert not [
            s for s in mapped_samples.samples if s.name.startswith("pg_advisory_server_lock")
        ]
