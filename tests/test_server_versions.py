"""The reads the server's version decides (collect/versions.py): which statement a server is
sent, and what PostgreSQL 19's pg_stat_lock becomes. tests/test_pg19.py reads a real 19."""

from __future__ import annotations

from dataclasses import replace

from support import IDLE, snapshot_of

from pg_advisory_exporter.collect.series import server_samples
from pg_advisory_exporter.collect.versions import (
    ADVISORY_LOCK_WAITS,
    READS,
    LockWaits,
    columns_for,
    lock_waits,
)


def test_each_read_from_its_version_on() -> None:
    assert columns_for(180004) == ""
    assert columns_for(190000) == ADVISORY_LOCK_WAITS.columns
    assert columns_for(200001) == "".join(read.columns for read in READS)
    assert [read.since for read in READS] == sorted(read.since for read in READS)


def test_pg_stat_lock_in_seconds() -> None:
    assert lock_waits({"advisory_lock_waits": None}) is None  # no advisory row
    assert lock_waits({}) is None  # before 19: not read
    assert lock_waits({"advisory_lock_waits": "[1, 2504.25]"}) == LockWaits(1, 2.50425)


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
    for mapped in (probe, older):
        assert not [s for s in mapped.samples if s.name.startswith("pg_advisory_server_lock")]
