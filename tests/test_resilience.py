"""A server that is down, slow, locked or refuses us never crashes the exporter or stalls it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import psycopg
import pytest
from support import (
    PLAIN_PASSWORD,
    Cli,
    OneTarget,
    RunningExporter,
    Session,
    SilentServer,
    StartExporter,
    write_config,
)

from devtools.embedded_postgres import SUPERUSER, EmbeddedPostgres
from pg_advisory_exporter.collect.connection import connect_to_server, prepare_session
from pg_advisory_exporter.collect.kept_connection import CannotCollect
from pg_advisory_exporter.config.collection import CollectionSettings


def test_role_without_pg_read_all_stats(
    start_exporter: StartExporter,
    one_target: OneTarget,
    plain_dsn: str,
    session: Session,
) -> None:
    session("leaked-session").execute("SELECT pg_advisory_lock(31)")
    in_transaction = session("open-transaction", autocommit=False)
    in_transaction.execute("SELECT pg_advisory_xact_lock(32)")
    exporter = start_exporter(config=one_target(plain_dsn))

    scrape = exporter.scrape()
    assert scrape.value("pg_advisory_up", target="main") == 1
    assert scrape.value("pg_advisory_exporter_insufficient_privilege", target="main") == 1
    labels = {"target": "main", "datname": "postgres"}
    # Outside any transaction the holder is known to be idle, so its locks are session-level.
    assert (
        scrape.value(
            "pg_advisory_holders", **labels, application_name="leaked-session", state="idle"
        )
        == 1
    )
    assert (
        scrape.value(
            "pg_advisory_holders", **labels, application_name="open-transaction", state="unknown"
        )
        == 1
    )
    # Ages cannot be read without the grant: no made-up values.
    assert scrape.find("pg_advisory_idle_holder_max_seconds") == []
    assert 'GRANT pg_read_all_stats TO \\"plain\\"' in exporter.log()


def test_privileged_role_is_reported_as_such(exporter: RunningExporter) -> None:
    scrape = exporter.scrape()
    assert scrape.value("pg_advisory_exporter_insufficient_privilege", target="main") == 0


@pytest.mark.slow
@pytest.mark.any_version  # an outage, on the client's side
def test_server_stopped_and_started_again(
    start_exporter: StartExporter,
    one_target: OneTarget,
    own_server: EmbeddedPostgres,
) -> None:
    exporter = start_exporter(config=one_target(own_server.dsn()))
    assert exporter.scrape().value("pg_advisory_up", target="main") == 1
    own_server.stop()

    elapsed, down = exporter.timed_scrape()
    assert elapsed < 2.0
    assert down.value("pg_advisory_up", target="main") == 0
    assert down.value("pg_advisory_exporter_collect_errors_total", target="main") >= 1
    assert down.find("pg_advisory_exporter_build_info")
    assert down.find("pg_advisory_exporter_last_success_timestamp_seconds", target="main")
    assert down.find("pg_advisory_locks") == []  # no stale data from the last success
    status, health = exporter.get("/health")
    assert status == 503
    assert '"up": false' in health

    # While the server is down, the exporter retries with backoff (max 1s here) and every
    # scrape stays quick.
    for _ in range(5):
        elapsed, scrape = exporter.timed_scrape()
        assert elapsed < 2.0
        assert scrape.value("pg_advisory_up", target="main") == 0
        time.sleep(0.3)
    errors = exporter.scrape().value("pg_advisory_exporter_collect_errors_total", target="main")
    assert errors >= 2

    own_server.start()
    exporter.scrape_until(lambda s: s.value("pg_advisory_up", target="main") == 1, timeout=15)
    assert exporter.get("/health")[0] == 200
    assert "collection failed" in exporter.log()
    assert "connection" in exporter.log().lower()
    assert exporter.process.poll() is None


@pytest.mark.any_version  # libpq's refusal, redacted
def test_login_refused_reports_down_and_never_shows_the_password(
    start_exporter: StartExporter,
    one_target: OneTarget,
    pg: EmbeddedPostgres,
) -> None:
    wrong = "wr0ng-pa55word-never-shown"
    exporter = start_exporter(config=one_target(pg.dsn(user="plain", password=wrong)))
    scrape = exporter.scrape()
    assert scrape.value("pg_advisory_up", target="main") == 0
    assert scrape.value("pg_advisory_exporter_collect_errors_total", target="main") == 1
    assert "password authentication failed" in exporter.log()
    _, landing = exporter.get("/")
    _, health = exporter.get("/health")
    for text in (exporter.log(), scrape.text, landing, health):
        assert wrong not in text
    assert "main" in landing


@pytest.mark.any_version  # the exporter reads the file
def test_password_file(
    start_exporter: StartExporter,
    pg: EmbeddedPostgres,
    tmp_path: Path,
) -> None:
    secret = tmp_path / "password"
    secret.write_text(PLAIN_PASSWORD + "\n")
    dsn = f"postgresql://plain@127.0.0.1:{pg.port}/postgres"
    config = {"targets": [{"name": "main", "dsn": dsn, "password_file": str(secret)}]}
    exporter = start_exporter(config=config)
    assert exporter.scrape().value("pg_advisory_up", target="main") == 1


@pytest.mark.any_version  # the exporter reads the file; the server only checks the password
def test_a_password_file_missing_at_start_downs_its_target_until_it_appears(
    start_exporter: StartExporter,
    cli: Cli,
    monitor_dsn: str,
    own_server: EmbeddedPostgres,
    tmp_path: Path,
) -> None:
    """One Secret key not mounted yet: its target starts down with the reason (series,
    /health, one log line), the other runs, and the file's arrival brings it up without a
    restart. --config.check warns of it and exits 0."""
    secret = tmp_path / "secrets" / "billing"
    secret.parent.mkdir()
    billing_dsn = f"host=127.0.0.1 port={own_server.port} dbname=postgres user={SUPERUSER}"
    config = {
        "collection": {"min_interval": "1ms", "reconnect_backoff_max": "1s"},
        "targets": [
            {"name": "orders", "dsn": monitor_dsn},
            {"name": "billing", "dsn": billing_dsn, "password_file": str(secret)},
        ],
    }
    reason = f"cannot read password_file {secret}: No such file or directory"
    path = write_config(tmp_path, config, "check.yaml")
    checked = cli("--config.file", str(path), "--config.check")
    assert checked.returncode == 0, checked.stderr
    assert (
        f"warning: {path}: targets[1] (billing).password_file: {reason}; the target is down "
        "until it can be read"
    ) in checked.stdout

    exporter = start_exporter(config=config)
    scrape = exporter.scrape()
    assert scrape.value("pg_advisory_up", target="orders") == 1
    assert scrape.value("pg_advisory_up", target="billing") == 0
    assert scrape.find("pg_advisory_lock_table_entries", target="orders")
    status, body = exporter.get("/health")
    health = {t["target"]: t for t in json.loads(body)["targets"]}
    assert status == 503
    assert (health["billing"]["up"], health["billing"]["error"]) == (False, reason)
    assert (health["orders"]["up"], health["orders"]["error"]) == (True, None)
    for _ in range(3):  # retried after its backoff, and not said again
        time.sleep(0.6)
        assert exporter.scrape().value("pg_advisory_up", target="billing") == 0
    assert exporter.log().count(reason) == 1, exporter.log()

    secret.write_text(own_server.password + "\n")
    after = exporter.scrape_until(lambda s: s.value("pg_advisory_up", target="billing") == 1)
    assert after.value("pg_advisory_up", target="orders") == 1
    assert json.loads(exporter.get("/health")[1])["status"] == "ok"
    assert "collection succeeded again" in exporter.log()
    assert exporter.process.poll() is None
    assert own_server.password not in exporter.log()


def test_locked_catalog_times_out_instead_of_stalling(
    start_exporter: StartExporter,
    one_target: OneTarget,
    monitor_dsn: str,
    session: Session,
) -> None:
    exporter = start_exporter(config=one_target(monitor_dsn, lock_timeout="300ms"))
    assert exporter.scrape().value("pg_advisory_up", target="main") == 1
    # A collection reads the list of databases (pg_database) before its statement, which
    # locks nothing; a DDL-like lock on pg_database would make that read wait. lock_timeout
    # ends the wait instead of stalling every scrape, and the collection goes on with the
    # list it had.
    locker = session("catalog-locker", autocommit=False)
    locker.execute("LOCK TABLE pg_catalog.pg_database IN ACCESS EXCLUSIVE MODE")
    try:
        elapsed, scrape = exporter.timed_scrape()
    finally:
        locker.rollback()
    assert elapsed < 2.0
    assert scrape.value("pg_advisory_up", target="main") == 1
    assert scrape.find("pg_advisory_deadlocks_total", datname="postgres")  # named as before
    assert "the list of databases cannot be read (canceling statement due to lock timeout" in (
        exporter.log()
    )
    exporter.scrape()
    assert "the list of databases is read again" in exporter.log()


@pytest.mark.any_version  # the exporter's deadlines
def test_hung_server_never_stalls_metrics(
    start_exporter: StartExporter,
    monitor_dsn: str,
    silent_server: SilentServer,
) -> None:
    config = {
        "collection": {"min_interval": "1ms", "connect_timeout": "10s"},
        "targets": [
            {"name": "healthy", "dsn": monitor_dsn},
            {"name": "hung", "dsn": f"host=127.0.0.1 port={silent_server.port} user=x dbname=x"},
        ],
    }
    exporter = start_exporter(config=config)
    # Prometheus says how long it will wait; the exporter answers within it.
    elapsed, scrape = exporter.timed_scrape(**{"X-Prometheus-Scrape-Timeout-Seconds": "2"})
    assert elapsed < 2.0
    assert scrape.value("pg_advisory_up", target="hung") == 0
    assert scrape.value("pg_advisory_up", target="healthy") == 1
    assert scrape.find("pg_advisory_lock_table_entries", target="healthy")
    assert "slower than the scrape allows" in exporter.log()


def test_the_session_is_read_only_with_timeouts(monitor_dsn: str) -> None:
    settings = CollectionSettings(statement_timeout="2500ms", lock_timeout="300ms")
    session = prepare_session(connect_to_server(monitor_dsn, settings), settings)
    with session.conn as conn:
        shown = conn.execute(
            "SELECT current_setting('statement_timeout'), current_setting('lock_timeout'),"
            " current_setting('default_transaction_read_only'),"
            " current_setting('application_name')"
        ).fetchone()
        assert shown == ("2500ms", "300ms", "on", "pg-advisory-exporter")
        assert conn.autocommit
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            conn.execute("CREATE TABLE t (x int)")
    assert session.role == "monitor"


@pytest.mark.any_version  # the version is pretended
def test_an_older_server_is_refused_with_a_clear_message(
    monitor_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No PostgreSQL 13 binaries are at hand; pretend this server is too old instead.
    monkeypatch.setattr("pg_advisory_exporter.collect.reads.MIN_SERVER_VERSION", 10**7)
    settings = CollectionSettings()
    with (
        connect_to_server(monitor_dsn, settings) as conn,
        pytest.raises(
            CannotCollect, match=r"PostgreSQL \d+ is not supported: .* needs PostgreSQL 14"
        ),
    ):
        prepare_session(conn, settings)
