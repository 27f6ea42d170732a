"""The lock table's nominal size: the formula per version, and the running server's own count."""

from __future__ import annotations

import pytest
from support import PG_MAJOR

from devtools.embedded_postgres import EmbeddedPostgres
from pg_advisory_exporter.capacity import CapacitySettings, lock_table_capacity, max_backends
from pg_advisory_exporter.snapshot import read_snapshot

DEFAULTS = {
    "max_locks_per_transaction": 64,
    "max_connections": 100,
    "autovacuum_max_workers": 3,
    "max_worker_processes": 8,
    "max_wal_senders": 10,
    "max_prepared_transactions": 0,
}


@pytest.mark.parametrize(
    ("version", "slots", "expected"),
    [
        # 100 + 3 autovacuum + 1 launcher + 8 + 10 = 122 backends
        (140000, None, 64 * 122),
        (150018, None, 7808),  # what a real 15.18 server reported
        (160004, None, 64 * 122),
        # 17: the launcher and the slot sync worker count as two special workers
        (170011, None, 64 * 123),
        # 18: autovacuum_worker_slots (default 16) replaces autovacuum_max_workers
        (180006, 16, 64 * 136),
    ],
)
def test_default_capacity_per_version(version: int, slots: int | None, expected: int) -> None:
    settings = CapacitySettings(
        server_version_num=version, autovacuum_worker_slots=slots, **DEFAULTS
    )
    assert lock_table_capacity(settings) == expected


def test_prepared_transactions_count_like_backends() -> None:
    settings = CapacitySettings(
        server_version_num=150000, **{**DEFAULTS, "max_prepared_transactions": 10}
    )
    assert lock_table_capacity(settings) == 64 * (122 + 10)


def test_versions_without_a_verified_formula_have_no_capacity() -> None:
    settings = CapacitySettings(server_version_num=190000, autovacuum_worker_slots=16, **DEFAULTS)
    assert lock_table_capacity(settings) is None


def test_postgresql_18_needs_its_worker_slots() -> None:
    with pytest.raises(ValueError, match="autovacuum_worker_slots"):
        max_backends(CapacitySettings(server_version_num=180000, **DEFAULTS))


# The server sizes its "Proc Array" shared-memory struct as a fixed header plus one int per
# MaxBackends + max_prepared_transactions slot (procarray.c, PROCARRAY_MAXPROCS), the same
# count NLOCKENTS() multiplies. Reading it under two configurations checks that the formula
# counts every slot the server counts: the header left over must be the same both times.
_PROC_ARRAY_SIZE = "SELECT size FROM pg_shmem_allocations WHERE name = 'Proc Array'"
_CONFIGURATIONS = [
    {"max_connections": 20, "max_worker_processes": 4, "max_wal_senders": 2,
     "autovacuum_max_workers": 2, "max_prepared_transactions": 0, "max_locks_per_transaction": 32},
    {"max_connections": 57, "max_worker_processes": 11, "max_wal_senders": 5,
     "autovacuum_max_workers": 5, "max_prepared_transactions": 7, "max_locks_per_transaction": 80},
]  # fmt: skip


@pytest.mark.slow
@pytest.mark.pg  # starts its own server, under two configurations
def test_capacity_matches_the_running_servers_own_slot_count() -> None:
    server = EmbeddedPostgres(major=PG_MAJOR)
    headers = []
    try:
        for settings in _CONFIGURATIONS:
            server.start(**settings)
            with server.connect() as conn:
                snapshot = read_snapshot(conn)
                row = conn.execute(_PROC_ARRAY_SIZE).fetchone()
            server.stop()
            assert row is not None
            capacity = lock_table_capacity(snapshot.capacity_settings)
            assert capacity is not None
            slots, remainder = divmod(capacity, settings["max_locks_per_transaction"])
            assert remainder == 0
            headers.append(row[0] - 4 * slots)
    finally:
        server.cleanup()
    assert headers[0] == headers[1], f"slot counts disagree with the server: {headers}"
    assert 0 < headers[0] <= 64, f"implausible Proc Array header of {headers[0]} bytes"
