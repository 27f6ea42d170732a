"""The lock table's nominal size: the formula per version, the running server's own count,
and a table filled to it (a hard limit from PostgreSQL 19)."""

from __future__ import annotations

import dataclasses

import psycopg
import pytest
from support import PG_MAJOR, OneTarget, Session, StartExporter, snapshot_of

from devtools.embedded_postgres import EmbeddedPostgres
from pg_advisory_exporter.collect.capacity import (
    CapacitySettings,
    lock_table_capacity,
    max_backends,
    refused_for_full_table,
)
from pg_advisory_exporter.collect.snapshot import ServerSnapshot, read_snapshot

# One backend's entries by kind, read from pg_locks row by row: the oracle for the counts
# the collection statement derives (every entry less the fast-path ones, less the others).
_ENTRIES_OF = """
SELECT count(*) FILTER (WHERE NOT fastpath) AS table_entries,
       count(*) FILTER (WHERE locktype = 'advisory') AS advisory_entries,
       count(*) FILTER (WHERE fastpath) AS fastpath_entries,
       count(*) FILTER (WHERE locktype <> 'advisory' AND NOT fastpath) AS other_table_entries
FROM pg_catalog.pg_locks WHERE pid = %s
"""

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
        # 19: as 18 (what a real 19rc1 server held, to the entry, at its own default of
        # max_locks_per_transaction: 128 x 136 = 17,408)
        (190000, 16, 64 * 136),
    ],
)
def test_default_capacity_per_version(version: int, slots: int | None, expected: int) -> None:
    settings = CapacitySettings(autovacuum_worker_slots=slots, **DEFAULTS)
    assert lock_table_capacity(settings, version) == expected


def test_prepared_transactions_count_like_backends() -> None:
    settings = CapacitySettings(**{**DEFAULTS, "max_prepared_transactions": 10})
    assert lock_table_capacity(settings, 150000) == 64 * (122 + 10)


def test_versions_without_a_verified_formula_have_no_capacity() -> None:
    settings = CapacitySettings(autovacuum_worker_slots=16, **DEFAULTS)
    assert lock_table_capacity(settings, 200000) is None


def test_postgresql_18_needs_its_worker_slots() -> None:
    with pytest.raises(ValueError, match="autovacuum_worker_slots"):
        max_backends(CapacitySettings(**DEFAULTS), 180000)


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
            capacity = snapshot.lock_table_capacity
            assert capacity is not None
            slots, remainder = divmod(capacity, settings["max_locks_per_transaction"])
            assert remainder == 0
            headers.append(row[0] - 4 * slots)
    finally:
        server.cleanup()
    assert headers[0] == headers[1], f"slot counts disagree with the server: {headers}"
    assert 0 < headers[0] <= 64, f"implausible Proc Array header of {headers[0]} bytes"


_TABLE_ENTRIES = "SELECT count(*) FROM pg_catalog.pg_locks WHERE NOT fastpath"
_HELD = (
    "SELECT count(*) FROM pg_catalog.pg_locks"
    " WHERE locktype = 'advisory' AND pid = pg_catalog.pg_backend_pid()"
)


@pytest.mark.slow
@pytest.mark.pg  # starts its own server, to fill its lock table
def test_the_lock_table_holds_the_exported_capacity_a_hard_limit_from_19(
    start_exporter: StartExporter, one_target: OneTarget
) -> None:
    """One backend takes advisory locks in an otherwise empty lock table. On PostgreSQL 19
    exactly the exported capacity fit, and the next fails with "out of shared memory"; before
    19 the table borrows spare shared memory, and the next is taken too."""
    server = EmbeddedPostgres(major=PG_MAJOR)
    try:
        server.start(autovacuum="off")  # no worker to take a lock of its own meanwhile
        exporter = start_exporter(config=one_target(server.dsn()))
        capacity = int(exporter.scrape().value("pg_advisory_lock_table_capacity", target="main"))
        # Its reads take an entry for a moment (pg_database's lock, which is never fast-path):
        # none may while the table fills.
        exporter.process.terminate()
        exporter.process.wait(timeout=15)
        with server.connect(application_name="lock-table-filler") as conn:
            assert conn.execute(_TABLE_ENTRIES).fetchone() == (0,)
            conn.execute(
                "SELECT count(pg_catalog.pg_advisory_lock(k))"
                " FROM pg_catalog.generate_series(1::bigint, %s::bigint) AS k",
                (capacity,),
            )
            assert conn.execute(_HELD).fetchone() == (capacity,)
            if PG_MAJOR >= 19:
                with pytest.raises(psycopg.errors.OutOfMemory, match="out of shared memory"):
                    conn.execute("SELECT pg_catalog.pg_advisory_lock(0)")
                # Full, it fails the exporter's connection too, as the runbook says.
                full = start_exporter(config=one_target(server.dsn()))
                assert full.scrape().value("pg_advisory_up", target="main") == 0
                assert "out of shared memory" in full.log()
            else:
                conn.execute("SELECT pg_catalog.pg_advisory_lock(0)")
                assert conn.execute(_HELD).fetchone() == (capacity + 1,)
    finally:
        server.cleanup()


def test_entries_leave_out_fast_path_locks_and_count_advisory_ones_apart(
    pg: EmbeddedPostgres, session: Session
) -> None:
    """A backend with every kind of entry: advisory locks (session and transaction level),
    fast-path relation locks and its virtualxid, and entries of other kinds in the shared
    table (a relation locked in SHARE mode, its transaction id)."""
    holder = session("mixed-holder", autocommit=False)
    holder.execute("SELECT pg_advisory_lock(1), pg_advisory_lock(2, 3)")
    holder.execute("SELECT pg_advisory_xact_lock_shared(4), pg_catalog.txid_current()")
    holder.execute("SELECT count(*) FROM pg_catalog.pg_namespace")  # fast-path AccessShare
    holder.execute("LOCK TABLE pg_catalog.pg_description IN SHARE MODE")  # never fast-path
    pid = holder.info.backend_pid
    with pg.connect(application_name="entries-monitor") as conn:
        snapshot = read_snapshot(conn)
        row = conn.execute(_ENTRIES_OF, (pid,)).fetchone()
    assert row is not None
    table_entries, advisory_entries, fastpath_entries, other_table_entries = row
    # Every kind is there, so a count that mixed two of them would come out wrong.
    assert (advisory_entries, fastpath_entries >= 2, other_table_entries >= 2) == (3, True, True)
    (backend,) = [b for b in snapshot.backends if b.pid == pid]
    assert (backend.table_entries, backend.advisory_entries) == (table_entries, advisory_entries)
    assert backend.share_entries == 1
    assert backend.in_transaction
    holder.rollback()


def _at(entries: int, version: int = 150000, refused_at: int | None = None) -> ServerSnapshot:
    settings = CapacitySettings(
        autovacuum_worker_slots=16 if version >= 180000 else None, **DEFAULTS
    )
    return dataclasses.replace(
        snapshot_of(),
        server_version_num=version,
        capacity_settings=settings,
        lock_table_entries=entries,
        refused_at=refused_at,
    )


def test_a_table_is_full_with_less_room_than_one_backends_budget() -> None:
    capacity = 64 * 122  # 7808 on 15, max_locks_per_transaction 64
    assert not _at(capacity - 64).lock_table_full  # room for one backend's budget
    assert _at(capacity - 63).lock_table_full
    assert _at(2 * capacity).lock_table_full  # before 19, past it on spare memory
    # Room to read the list of databases (an entry, for a moment): below 90% and not full.
    assert _at(int(0.9 * capacity) - 1).room_to_read
    assert not _at(int(0.9 * capacity) + 1).room_to_read
    assert not _at(capacity).room_to_read


def test_a_table_refused_below_its_capacity_is_full_at_that_size() -> None:
    """Before 19 a table whose spare memory earlier growth took can refuse below capacity:
    where the server refused the exporter an entry, that size is full."""
    assert _at(338, refused_at=338).lock_table_full
    assert _at(400, refused_at=338).lock_table_full
    assert not _at(337, refused_at=338).lock_table_full
    assert _at(337, refused_at=338).room_to_read
    # A version whose size is not verified: full only as refused, and then no more reads.
    assert not _at(10**6, version=200000).lock_table_full
    assert _at(10**6, version=200000).room_to_read
    assert _at(500, version=200000, refused_at=500).lock_table_full
    assert not _at(500, version=200000, refused_at=500).room_to_read


@pytest.mark.parametrize(
    ("message", "full"),
    [
        # A new connection refused at full: libpq's text, without its SQLSTATE.
        ('connection failed: FATAL:  out of shared memory\nHINT:  You might need to increase'
         " max_locks_per_transaction.", True),
        ('FATAL:  out of shared memory\nHINT:  You might need to increase'
         ' "max_locks_per_transaction".', True),  # 18 and later quote it
        ("FATAL:  Speicher aufgebraucht\nTIP:  Erhöhen Sie eventuell max_locks_per_transaction.",
         True),  # translated: the setting's name is not
        ("ERROR:  out of shared memory\nHINT:  You might need to increase"
         " max_pred_locks_per_transaction.", False),  # the predicate lock table's
        ("FATAL:  password authentication failed for user \"monitor\"", False),
    ],
)  # fmt: skip
def test_a_refusal_for_the_full_table_is_told_by_its_hint(message: str, full: bool) -> None:
    assert refused_for_full_table(psycopg.OperationalError(message)) is full
    assert not refused_for_full_table(ValueError(message))  # not the server's
