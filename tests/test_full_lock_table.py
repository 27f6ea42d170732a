"""A full lock table, on every supported version: the moment the exporter exists for.

A server of its own with a small lock table (max_locks_per_transaction 10, 12 connections:
340 to 480 entries by version) is filled to its last entry, by a job's session advisory
locks, or by a query over hundreds of partitions topped up with narrower ones. Then no new
session can start and every lock request fails with "out of shared memory"; the exporter,
connected before, keeps reading it: pg_advisory_up stays 1, pg_advisory_lock_table_full is 1,
the application that fills the table is named in the series and on /locks, and PgLockTableFull
fires through a real Prometheus. An exporter that cannot read because of the full table (its
connection lost, or started after the table filled) says "full", and `check` says why it
cannot connect.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from support import (
    MONITOR_PASSWORD,
    PG_MAJOR,
    Cli,
    Config,
    LoggedReads,
    RunningExporter,
    Scrape,
    StartExporter,
    StartService,
    prometheus_api,
    prometheus_query,
    start_prometheus,
    wait_until,
    write_config,
)

from devtools.embedded_postgres import EmbeddedPostgres
from pg_advisory_exporter.collect.connection import prepare_session
from pg_advisory_exporter.collect.databases import DATABASES_SQL, read_databases
from pg_advisory_exporter.collect.snapshot import collect_sql
from pg_advisory_exporter.config.collection import CollectionSettings
from pg_advisory_exporter.config.targets import LocksPageSettings
from pg_advisory_exporter.forensics.read import FORENSICS_SQL, FORENSICS_WITH_QUERY_SQL, parameters
from pg_advisory_exporter.keys import catalog

ROOT = Path(__file__).parent.parent
FILLER = "nightly-import"
SHOP = "shop"  # where the filler works
OLD = "archive"  # a database that is dropped just before the table fills
# More partitions than any version's table has room for at these settings (888 entries at
# most, on 18, measured; a test says so if the partitions run out first).
PARTITIONS = 1200
SESSION_LOCKS = "SELECT count(pg_advisory_lock(73202, g)) FROM generate_series(1, 1000000) AS g"

# Every test here uses the module's own server (a fixture tests/conftest.py does not know).
pytestmark = pytest.mark.pg


@pytest.fixture(scope="module")
def small() -> Iterator[EmbeddedPostgres]:
    """A server of its own, its lock table small, with a monitoring role whose statements
    its log records, a database of partitions and one to drop."""
    server = EmbeddedPostgres(major=PG_MAJOR)
    try:
        server.start(
            max_connections=12,
            max_locks_per_transaction=10,
            autovacuum="off",  # no worker of its own to fail while the table is full
            lc_messages="C",
        )
        with server.connect() as conn:
            conn.execute(f"CREATE ROLE monitor LOGIN PASSWORD '{MONITOR_PASSWORD}'")
            conn.execute("GRANT pg_read_all_stats TO monitor")
            conn.execute("ALTER ROLE monitor SET log_statement = 'all'")
            conn.execute(f"CREATE DATABASE {SHOP}")
        with server.connect(SHOP) as conn:
            conn.execute("CREATE TABLE parts (k int NOT NULL) PARTITION BY RANGE (k)")
            for first in range(0, PARTITIONS, 40):  # 40 a transaction: the table is small
                conn.execute(
                    f"DO $$ BEGIN FOR i IN {first}..{first + 39} LOOP EXECUTE format("
                    "'CREATE TABLE parts_%s PARTITION OF parts FOR VALUES FROM (%s) TO (%s)',"
                    " i, i, i + 1); END LOOP; END $$"
                )
        # The partitions' creation grew the lock table into the spare shared memory (before
        # PostgreSQL 19): a restart gives every test the table as a new server has it.
        server.stop()
        server.start()
        yield server
    finally:
        server.cleanup()


def _monitor_dsn(server: EmbeddedPostgres, dbname: str = "postgres") -> str:
    return server.dsn(dbname, user="monitor", password=MONITOR_PASSWORD)


def _config(server: EmbeddedPostgres) -> Config:
    return {
        "collection": {
            "min_interval": "1ms",
            "reconnect_backoff_max": "1s",
            "statements_interval": "0s",
        },
        "locks_page": {"reuse_for": "1ms"},
        "targets": [{"name": "main", "dsn": _monitor_dsn(server)}],
    }


def _refused(server: EmbeddedPostgres) -> bool:
    """Whether a new session is refused for the full table (every start takes an entry)."""
    try:
        psycopg.connect(server.dsn(), connect_timeout=5).close()
    except psycopg.OperationalError as exc:
        if "out of shared memory" not in str(exc):
            raise
        return True
    return False


def _fill_with_session_locks(conn: psycopg.Connection[Any]) -> None:
    """Session advisory locks until the table refuses one: they outlive the statement that
    failed, and the session sits idle holding them."""
    with pytest.raises(psycopg.errors.OutOfMemory, match="out of shared memory"):
        conn.execute(SESSION_LOCKS)


def _fill_with_partitions(conn: psycopg.Connection[Any]) -> None:
    """A transaction that reads hundreds of partitions (a lock on each), then fewer, then one
    at a time, until the table refuses one more; each read that failed rolled back to its
    savepoint, which releases its locks, and the transaction stays open holding the rest."""
    low, step = 0, 256
    while step:
        step = min(step, PARTITIONS - low)
        assert step, "the partitions ran out before the lock table was full"
        conn.execute("SAVEPOINT fill")
        try:  # constants, so that the planner prunes (and locks) the other partitions away
            conn.execute(f"SELECT count(*) FROM parts WHERE k >= {low} AND k < {low + step}")
        except psycopg.errors.OutOfMemory:
            conn.execute("ROLLBACK TO SAVEPOINT fill")
            step //= 2
            continue
        conn.execute("RELEASE SAVEPOINT fill")
        low += step
    assert low > 16, "hardly a query over many partitions"


@contextlib.contextmanager
def _full(server: EmbeddedPostgres, how: str) -> Iterator[psycopg.Connection[Any]]:
    """The lock table filled by the filler's session (`how`: session_locks or partitions),
    until the block ends and the filler goes; the filler's connection."""
    conn = psycopg.connect(
        server.dsn(SHOP), autocommit=how == "session_locks", application_name=FILLER
    )
    try:
        if how == "session_locks":
            _fill_with_session_locks(conn)
        else:
            _fill_with_partitions(conn)
        assert _refused(server), "the table is not full: a new session started"
        yield conn
    finally:
        conn.close()
    wait_until(lambda: not _refused(server), 10, "the lock table emptied")


def _ok(scrape: Scrape, at: float) -> bool:
    """A successful collection after `at` (Unix time) that found the table full."""
    return (
        scrape.value("pg_advisory_up", target="main") == 1
        and scrape.value("pg_advisory_exporter_last_success_timestamp_seconds", target="main") > at
        and scrape.value("pg_advisory_lock_table_full", target="main") == 1
    )


def _more_errors(scrape: Scrape, seen: float) -> bool:
    """More failed collections of the first target than `seen`."""
    return scrape.value("pg_advisory_exporter_collect_errors_total", target="main") > seen


def _locks(exporter: RunningExporter) -> dict[str, Any]:
    status, body = exporter.get("/locks?target=main&format=json")
    assert status == 200, body
    found: dict[str, Any] = json.loads(body)
    return found


@pytest.mark.slow
@pytest.mark.parametrize("how", ["session_locks", "partitions"])
def test_the_exporter_keeps_reading_naming_and_paging_at_full(
    small: EmbeddedPostgres, start_exporter: StartExporter, how: str
) -> None:
    exporter = start_exporter(config=_config(small))
    before = exporter.scrape_until(lambda s: s.value("pg_advisory_up", target="main") == 1)
    assert before.value("pg_advisory_lock_table_full", target="main") == 0
    capacity = before.value("pg_advisory_lock_table_capacity", target="main")
    with contextlib.ExitStack() as stack:
        # A session opened before the table filled: the runbook's query runs on it.
        admin = stack.enter_context(small.connect())
        lists = LoggedReads(small, f"statement: {DATABASES_SQL}")  # not its error's echo
        filler = stack.enter_context(_full(small, how))
        pid = filler.info.backend_pid
        # Several collections, each a successful one that found the table full.
        last = 0.0
        for _ in range(3):
            scrape = exporter.scrape_until(functools.partial(_ok, at=last))
            last = scrape.value("pg_advisory_exporter_last_success_timestamp_seconds")
            entries = scrape.value("pg_advisory_lock_table_entries", target="main")
            # 19 stops at its capacity, a few entries short; before 19 it holds past it on
            # spare shared memory (this server was restarted: it has it all).
            if PG_MAJOR >= 19:
                assert capacity - 10 < entries <= capacity
            else:
                assert entries >= capacity
            [(labels, held)] = scrape.find("pg_advisory_lock_table_top_application_entries")
            assert (labels["application_name"], labels["datname"]) == (FILLER, SHOP)
            assert held >= entries - 5  # the filler's, all but the exporter's own few
            advisory = scrape.find("pg_advisory_locks", application_name=FILLER)
            if how == "session_locks":
                assert sum(value for _, value in advisory) == held
                assert (
                    scrape.value("pg_advisory_holders", application_name=FILLER, state="idle") == 1
                )
            else:  # relation locks: the table's, never counted as advisory locks
                assert advisory == []
        # The list of databases was tried once, when the table had just filled: not at every
        # collection, and never again while it stays this full.
        assert lists.count() == 1
        assert exporter.log().count("the list of databases cannot be read (the lock table") == 1

        # /locks names the filler, with its entries and the statement that ends it, read
        # through the connection the daemon keeps (a new one would be refused).
        page = _locks(exporter)
        [top, *_] = page["lock_table_holders"]
        assert (top["pid"], top["application_name"], top["datname"]) == (pid, FILLER, SHOP)
        assert top["entries"] == held
        assert top["terminate"] == f"SELECT pg_terminate_backend({pid})"
        holders = {h["pid"]: h for h in page["holders"]}
        if how == "session_locks":
            assert holders[pid]["held_entries"] == held
            assert holders[pid]["terminate"] == top["terminate"]
        else:
            assert pid not in holders
        status, html = exporter.get("/locks?target=main")
        assert status == 200
        assert "Most lock table entries, all lock types" in html
        assert f"SELECT pg_terminate_backend({pid})" in html

        # The runbook's query for a full table runs on a session opened before, and names it.
        runbook = (ROOT / "docs" / "runbook.md").read_text()
        section = runbook[
            runbook.index("## PgLockTableFull") : runbook.index("## PgLockTableNearlyFull")
        ]
        [query] = re.findall(r"```sql\n(.*?)```", section, flags=re.DOTALL)
        rows = admin.execute(query).fetchall()
        assert rows[0][:2] == (pid, FILLER)

    # The filler gone, the table has room again, and says so.
    exporter.scrape_until(lambda s: s.value("pg_advisory_lock_table_full", target="main") == 0)
    assert "collection failed" not in exporter.log()


@pytest.mark.slow
def test_an_exporter_started_at_full_says_full_and_check_says_why(
    small: EmbeddedPostgres, start_exporter: StartExporter, cli: Cli, tmp_path: Path
) -> None:
    with _full(small, "session_locks"):
        exporter = start_exporter(config=_config(small))
        scrape = exporter.scrape_until(
            lambda s: bool(s.find("pg_advisory_lock_table_full", target="main"))
        )
        assert scrape.value("pg_advisory_up", target="main") == 0
        assert scrape.value("pg_advisory_lock_table_full", target="main") == 1
        assert "the server's lock table is full" in exporter.log()
        # /locks cannot read either, and says why.
        status, body = exporter.get("/locks?target=main&format=json")
        assert "lock table is full" in json.loads(body)["error"], (status, body)
        # check must connect anew: it says the table is full, and that a running exporter can
        # still read the server.
        config = write_config(tmp_path, _config(small), "check.yaml")
        checked = cli("check", "--config.file", str(config))
        assert checked.returncode != 0
        assert "lock table is full: no new session can start" in checked.stdout, checked
        assert "/locks" in checked.stdout
    exporter.scrape_until(
        lambda s: (
            s.value("pg_advisory_up", target="main") == 1
            and s.value("pg_advisory_lock_table_full", target="main") == 0
        )
    )


@pytest.mark.slow
def test_a_kept_connection_lost_at_full_says_full(
    small: EmbeddedPostgres, start_exporter: StartExporter
) -> None:
    """The first target's connection ended at full: it says full, once; a second target that
    connects another way (another database) and reads the server through the first goes on
    doing so, so the full table is not paged twice."""
    config = _config(small)
    config["targets"].append({"name": "second", "dsn": _monitor_dsn(small, SHOP)})
    exporter = start_exporter(config=config)
    exporter.scrape_until(
        lambda s: (
            s.value("pg_advisory_up", target="main") == 1
            and s.value("pg_advisory_up", target="second") == 1
            and "the same server as another target" in exporter.log()
        )
    )
    with small.connect() as admin:
        [(backend,)] = admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = 'pg-advisory-exporter'"
        ).fetchall()
    with _full(small, "partitions"):
        # Ended as pg_terminate_backend ends it (which may itself need an entry at full).
        os.kill(backend, signal.SIGTERM)
        scrape = exporter.scrape_until(
            lambda s: (
                s.value("pg_advisory_up", target="main") == 0
                and bool(s.find("pg_advisory_lock_table_full", target="main"))
            )
        )
        assert scrape.value("pg_advisory_lock_table_full", target="main") == 1
        assert "the server's lock table is full" in exporter.log()
        errors = "pg_advisory_exporter_collect_errors_total"
        for _ in range(3):  # failed collections after it: the second never says full itself
            assert scrape.find("pg_advisory_lock_table_full", target="second") == []
            seen = scrape.value(errors, target="main")
            scrape = exporter.scrape_until(functools.partial(_more_errors, seen=seen))
    exporter.scrape_until(lambda s: s.value("pg_advisory_up", target="main") == 1)


@pytest.mark.slow
def test_databases_created_or_dropped_just_before_the_table_fills(
    small: EmbeddedPostgres, start_exporter: StartExporter
) -> None:
    """Named from the list read before: one created since by its oid, one dropped since by
    its name (its deadlocks 0), until the table has room to read the list again."""
    with small.connect() as admin:
        admin.execute(f"CREATE DATABASE {OLD}")
    exporter = start_exporter(config=_config(small))
    exporter.scrape_until(lambda s: bool(s.find("pg_advisory_deadlocks_total", datname=OLD)))
    fresh = "fresh"
    with small.connect() as admin:  # no collection from here until the table is full
        admin.execute(f"CREATE DATABASE {fresh}")
        admin.execute(f"DROP DATABASE {OLD}")
        [(oid,)] = admin.execute("SELECT oid FROM pg_database WHERE datname = %s", (fresh,))
    with psycopg.connect(small.dsn(fresh), autocommit=True, application_name="newcomer") as new:
        new.execute("SELECT pg_advisory_lock(1)")  # taken before the table fills
        with _full(small, "session_locks"):
            scrape = exporter.scrape_until(
                lambda s: (
                    _ok(s, 0) and bool(s.find("pg_advisory_locks", application_name="newcomer"))
                )
            )
            [(labels, _)] = scrape.find("pg_advisory_locks", application_name="newcomer")
            assert labels["datname"] == f"oid:{oid}"
            assert scrape.value("pg_advisory_deadlocks_total", datname=OLD) == 0
            assert not scrape.find("pg_advisory_deadlocks_total", datname=fresh)
    with small.connect() as admin:
        admin.execute(f"DROP DATABASE {fresh} WITH (FORCE)")
    exporter.scrape_until(lambda s: not s.find("pg_advisory_deadlocks_total", datname=OLD))


def test_the_statements_take_no_lock(small: EmbeddedPostgres) -> None:
    """The collection's statement (with the catalog's keys) and the /locks read, on this
    version, take no lock at all but their transaction's own (a virtualxid): no relation,
    so nothing that could need an entry in a full table. Counted in a transaction, which
    keeps every lock a statement took until it ends."""
    own = (
        "SELECT locktype, fastpath FROM pg_catalog.pg_lock_status()"
        " WHERE pid = pg_catalog.pg_backend_pid() AND locktype <> 'virtualxid'"
    )
    with psycopg.connect(_monitor_dsn(small), autocommit=True) as conn:
        session = prepare_session(conn, CollectionSettings(), entries=catalog.DEFAULTS)
        databases = read_databases(conn)
        statements: list[tuple[str, dict[str, Any]]] = [
            (
                collect_sql(conn.info.server_version, session.registry),
                {"databases": list(databases.worked_in)},
            ),
            *(
                (text, parameters(LocksPageSettings(query_text=True)))
                for text in (FORENSICS_SQL, FORENSICS_WITH_QUERY_SQL)
            ),
        ]
        for text, given in statements:
            with conn.transaction():
                conn.execute(text, given)
                assert conn.execute(own).fetchall() == []
        # The count sees a lock where there is one: a view is a relation.
        with conn.transaction():
            conn.execute("SELECT count(*) FROM pg_catalog.pg_locks")
            assert conn.execute(own).fetchall() == [("relation", True)]


def _firing(prometheus: int, alertname: str) -> list[dict[str, Any]]:
    alerts: list[dict[str, Any]] = prometheus_api(prometheus, "alerts")["alerts"]
    return [
        alert
        for alert in alerts
        if alert["labels"]["alertname"] == alertname and alert["state"] == "firing"
    ]


@pytest.mark.slow
@pytest.mark.any_version  # the alert reads the same series on every version (above)
def test_the_full_table_pages_through_a_real_prometheus(
    small: EmbeddedPostgres,
    start_exporter: StartExporter,
    start_service: StartService,
    cli: Cli,
    tmp_path: Path,
) -> None:
    exporter = start_exporter(config=_config(small))
    rules = tmp_path / "rules.yml"
    rules.write_text(cli("rules", "--set", "exporter_job=pg-advisory", check=True).stdout)
    prometheus = start_prometheus(
        start_service,
        tmp_path,
        {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules)],
            "scrape_configs": [
                {
                    "job_name": "pg-advisory",
                    "static_configs": [{"targets": [f"127.0.0.1:{exporter.port}"]}],
                }
            ],
        },
    )
    query = 'pg_advisory_up{target="main"} == 1'
    wait_until(
        lambda: bool(prometheus_query(prometheus, query)), 30, "Prometheus scraping the exporter"
    )
    with _full(small, "session_locks"):
        wait_until(lambda: bool(_firing(prometheus, "PgLockTableFull")), 30, "PgLockTableFull")
        [alert] = _firing(prometheus, "PgLockTableFull")
        assert alert["labels"]["target"] == "main"
        description = alert["annotations"]["description"]
        assert f"The application holding the most entries is {FILLER} in database {SHOP}" in (
            description
        )
        # Read, so not a target the exporter cannot read; and nothing pages twice for it.
        assert _firing(prometheus, "PgAdvisoryTargetDown") == []
