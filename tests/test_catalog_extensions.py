"""pg_repack and pg_partman take their locks in the test server: each named by the catalog,
at the level the catalog says, and gone when the work is done (or, for pg_partman's session
locks, when the session of a failed call ends). Every pg_partman call that takes a lock runs:
each waits for partman.part_config, which the test locks, right after taking it.

Marked `any_version`, so run with the first version (15) only: Debian 12 builds these
extensions for its own PostgreSQL 15 alone (postgresql-15-repack 1.4.8, postgresql-15-partman
4.7.2, which the test command installs), and the wheels that bring the other versions have
none. The keys are the extensions' own: pg_repack's from the table's oid, pg_partman's from
hashtext(), which the server computes (checked on every version by test_key_libraries.py).
"""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
from clients import (
    WAIT,
    Level,
    StartClient,
    Watch,
    blocked,
    check_level,
    client_environment,
    fresh_database,
    in_transaction,
    lock_of,
    locks_config,
)
from support import (
    PG_MAJOR,
    Connection,
    RunningExporter,
    Session,
    StartExporter,
    block_on,
    wait_until,
)

from devtools.embedded_postgres import EmbeddedPostgres
from pg_advisory_exporter.keys.catalog import BY_NAME

pytestmark = pytest.mark.any_version

DEBIAN_MAJOR = 15  # the only version Debian 12 builds them for


@pytest.fixture
def exporter(start_exporter: StartExporter, monitor_dsn: str) -> RunningExporter:
    """The exporter with the catalog as it ships, /locks read anew at each request."""
    return start_exporter(config=locks_config(monitor_dsn))


def _with_extension(
    pg: EmbeddedPostgres, name: str, extension: str, entry: str, schema: str = ""
) -> str:
    """A fresh database with `extension` created (in `schema`, made for it, if given), of the
    version that catalog `entry` was read in (Debian 12 may move to a newer point release)."""
    with pg.connect() as conn:
        available = conn.execute(
            "SELECT default_version FROM pg_available_extensions WHERE name = %s", (extension,)
        ).fetchone()
    if available is None:
        if PG_MAJOR != DEBIAN_MAJOR:
            pytest.skip(f"Debian 12 builds {extension} for PostgreSQL {DEBIAN_MAJOR} only")
        pytest.fail(f"{extension} is not installed (`make system-packages` installs it)")
    assert available[0].startswith(f"{BY_NAME[entry].versions}."), available
    database = fresh_database(pg, name)
    with pg.connect(database) as conn:
        if schema:
            conn.execute(f"CREATE SCHEMA {schema}")
            conn.execute(f"CREATE EXTENSION {extension} SCHEMA {schema}")
        else:
            conn.execute(f"CREATE EXTENSION {extension}")
    return database


def _repackable(pg: EmbeddedPostgres, *statements: str) -> tuple[str, Path, int]:
    """A database with pg_repack and a table to repack, `orders`, these statements run once
    it is filled: the database, pg_repack's command, and the table's oid."""
    database = _with_extension(pg, "repack", "pg_repack", "pg_repack")
    with pg.connect(database) as conn:
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY, note text)")
        conn.execute("INSERT INTO orders SELECT g, 'note' FROM generate_series(1, 1000) g")
        for statement in statements:
            conn.execute(statement)
        row = conn.execute("SELECT 'orders'::regclass::oid").fetchone()
    assert row is not None
    return database, pg.bindir / "pg_repack", row[0]


def test_pg_repack_holds_its_table_lock_while_it_waits_for_older_transactions(
    exporter: RunningExporter, pg: EmbeddedPostgres, start_client: StartClient
) -> None:
    """pg_repack holds (16185446, table oid - 2^31) for the whole repack of a table, on a
    connection that sits idle, outside any transaction, while it waits for the transactions
    older than its copy: a session lock."""
    database, pg_repack, oid = _repackable(pg)
    watch = Watch(exporter, "pg_repack", database)
    with in_transaction(pg, database, "SELECT 1", "long-report"):  # older than its copy
        command: list[str | Path] = [pg_repack, "--dbname", database, "--table", "orders"]
        repack = start_client("pg_repack", command, client_environment(pg, database))
        # Its wait for the older transaction, the state it stays in until the test lets go:
        # its setup before (a copy and an index, in transactions of their own) is a moment,
        # and it looks at the older transactions once a second, each look a moment of its
        # own (active): the row is read in between.
        wait_until(
            lambda: repack.said("Waiting for 1 transactions to finish"),
            WAIT,
            "pg_repack waiting for the older transaction",
        )
        holder = watch.held(repack, lambda row: (row["state"], row["xact_start"]) == ("idle", None))
    assert holder["application_name"] == "pg_repack"
    assert (holder["state"], holder["xact_start"]) == ("idle", None)
    check_level(holder, "session")
    assert lock_of(holder, "pg_repack")["key_parts"] == [16185446, oid - 2**31]
    output = repack.finish()
    assert 'INFO: repacking table "public.orders"' in output
    assert "Waiting for 1 transactions to finish" in output
    watch.gone()


# An index whose expression waits at advisory key 4242 (shared): building it waits while the
# test holds the key.
GATE = """
CREATE FUNCTION gate(i int) RETURNS int LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
  PERFORM pg_advisory_lock_shared(4242);
  PERFORM pg_advisory_unlock_shared(4242);
  RETURN i;
END $$
"""


def test_pg_repack_with_jobs_is_no_leak_while_its_workers_build_indexes(
    exporter: RunningExporter, pg: EmbeddedPostgres, session: Session, start_client: StartClient
) -> None:
    """With --jobs, pg_repack's workers build the table's indexes on connections of their own
    while the connection that holds its lock sits idle, outside any transaction, for as long
    as the builds take (hours, on a large table): it is at work, not a leaked lock, as Rails'
    lock connection is (the catalog's idle_holder)."""
    database, pg_repack, _ = _repackable(pg, GATE, "CREATE INDEX orders_gate ON orders (gate(id))")
    session("gatekeeper", dbname=database).execute("SELECT pg_advisory_lock(4242)")
    command: list[str | Path] = [
        pg_repack,
        "--dbname",
        database,
        "--table",
        "orders",
        "--jobs",
        "2",
    ]
    repack = start_client("pg_repack", command, client_environment(pg, database))
    blocked(pg, database, "pg_repack")  # a worker's index build, at the gate
    holder = Watch(exporter, "pg_repack", database).held(repack)
    assert (holder["state"], holder["xact_start"]) == ("idle", None)
    labels = {"datname": database, "application_name": "pg_repack"}
    assert exporter.scrape().find("pg_advisory_idle_holder_max_seconds", **labels) == []


PARENT = "public.events"


def _partition_set(pg: EmbeddedPostgres, name: str) -> str:
    """A database with pg_partman (in schema partman) and a daily partition set, public.events,
    with rows in its default partition (a month before the premade partitions)."""
    database = _with_extension(pg, name, "pg_partman", "pg_partman_maintenance", "partman")
    with pg.connect(database) as conn:
        conn.execute(
            "CREATE TABLE events (id bigint, created_at timestamptz NOT NULL)"
            " PARTITION BY RANGE (created_at)"
        )
        conn.execute("SELECT partman.create_parent(%s, 'created_at', 'native', 'daily')", (PARENT,))
        conn.execute(
            "INSERT INTO events SELECT g, now() - interval '30 days' FROM generate_series(1, 10) g"
        )
    return database


@pytest.fixture
def partitioned(pg: EmbeddedPostgres) -> str:
    """A partition set of the test's own, for work that changes it."""
    return _partition_set(pg, "partman")


@pytest.fixture(scope="module")
def untouched(pg: EmbeddedPostgres) -> str:
    """A partition set for the calls that are cancelled before they change anything."""
    return _partition_set(pg, "partman_untouched")


def _config_locked(pg: EmbeddedPostgres, database: str) -> AbstractContextManager[Connection]:
    """partman.part_config locked against readers until the block ends: every pg_partman
    function reads it right after taking its advisory lock, and waits there."""
    return in_transaction(
        pg, database, "LOCK TABLE partman.part_config IN ACCESS EXCLUSIVE MODE", "partman-admin"
    )


def _finished(thread: threading.Thread) -> None:
    thread.join(60)
    assert not thread.is_alive(), "the pg_partman call never finished"


def test_pg_partman_run_maintenance_holds_its_lock_in_its_transaction(
    exporter: RunningExporter, pg: EmbeddedPostgres, session: Session, partitioned: str
) -> None:
    """run_maintenance() holds pg_partman_maintenance in its transaction while it works, and
    lets it go with it, its session open."""
    watch = Watch(exporter, "pg_partman_maintenance", partitioned)
    function = session("partman-maintenance", dbname=partitioned)
    with _config_locked(pg, partitioned):
        call = block_on(pg, function, "SELECT partman.run_maintenance()")
        holder = watch.held()
        assert holder["pid"] == function.info.backend_pid
        check_level(holder, "transaction")
    _finished(call)
    watch.gone()


# Each other pg_partman 4.7 function and procedure that takes an advisory lock, the entry that
# names it, and the level it takes it at.
PARTMAN_CALLS = [
    ("pg_partman_maintenance", "CALL partman.run_maintenance_proc()", "session"),
    ("pg_partman_undo_partition", f"SELECT partman.undo_partition('{PARENT}')", "transaction"),
    ("pg_partman_undo_partition_proc", f"CALL partman.undo_partition_proc('{PARENT}')",
     "transaction"),
    ("pg_partman_drop_partition_id", f"SELECT partman.drop_partition_id('{PARENT}')",
     "transaction"),
    ("pg_partman_drop_partition_time", f"SELECT partman.drop_partition_time('{PARENT}')",
     "transaction"),
    ("pg_partman_reapply_constraints", f"CALL partman.reapply_constraints_proc('{PARENT}')",
     "session"),
    ("pg_partman_run_analyze", "CALL partman.run_analyze()", "session"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("entry", "call", "level"),
    PARTMAN_CALLS,
    ids=[call.split(".")[1].split("(")[0] for _, call, _ in PARTMAN_CALLS],
)
def test_a_cancelled_pg_partman_call_leaves_its_lock_as_its_level_says(
    exporter: RunningExporter,
    pg: EmbeddedPostgres,
    session: Session,
    untouched: str,
    entry: str,
    call: str,
    level: Level,
) -> None:
    """Each call holds its entry's key while it waits for part_config; cancelled there, a
    transaction lock goes with its transaction while the session stays, and a session lock
    stays held by the idle session (every later call then finds it "already running") until
    that session ends. A key per table has hashtext(parent table) as its second int."""
    assert BY_NAME[entry].lock_level in (None, level)
    watch = Watch(exporter, entry, untouched)
    caller = session("partman-caller", dbname=untouched)
    with _config_locked(pg, untouched):
        thread = block_on(pg, caller, call)
        holder = watch.held()
        assert holder["pid"] == caller.info.backend_pid
        caller.cancel_safe()
        _finished(thread)
    form = BY_NAME[entry].form
    assert form is not None
    if form.form == "namespace":
        assert lock_of(holder, entry)["key_parts"][1] == _hashtext(pg, untouched, PARENT)
    if level == "transaction":
        watch.gone()
    else:
        holder = watch.held()
        assert (holder["pid"], holder["state"]) == (caller.info.backend_pid, "idle")
        check_level(holder, "session")
        caller.close()
        watch.gone()


def _hashtext(pg: EmbeddedPostgres, database: str, text: str) -> int:
    with pg.connect(database) as conn:
        row = conn.execute("SELECT hashtext(%s)", (text,)).fetchone()
    assert row is not None
    return int(row[0])


def test_pg_partman_partition_data_names_the_parent_table(
    exporter: RunningExporter, pg: EmbeddedPostgres, session: Session, partitioned: str
) -> None:
    """partition_data_proc holds (hashtext('pg_partman partition_data_proc'),
    hashtext(parent table)) in its transaction: the catalog's namespace names it whatever
    the table."""
    watch = Watch(exporter, "pg_partman_partition_data", partitioned)
    mover = session("partman-partition-data", dbname=partitioned)
    with _config_locked(pg, partitioned):
        call = block_on(pg, mover, f"CALL partman.partition_data_proc('{PARENT}', p_wait := 0)")
        holder = watch.held()
        assert holder["pid"] == mover.info.backend_pid
        check_level(holder, "transaction")
    assert lock_of(holder, "pg_partman_partition_data")["key_parts"] == [
        _hashtext(pg, partitioned, "pg_partman partition_data_proc"),
        _hashtext(pg, partitioned, PARENT),
    ]
    _finished(call)
    watch.gone()
    with pg.connect(partitioned) as conn:
        assert conn.execute("SELECT count(*) FROM ONLY events_default").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM events").fetchone() == (10,)
