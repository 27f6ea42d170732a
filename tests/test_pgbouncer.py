"""The worst case of a pool: a session lock stranded on a server connection of a transaction
pool, through a real PgBouncer (tests/pgbouncer.py), seen by the real exporter."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pgbouncer import SESSION_POOL, STATS_PASSWORD, TRANSACTION_POOL, PgBouncer
from support import Config, OneTarget, Scrape, StartExporter

from devtools.embedded_postgres import free_port

# Version-independent (tests/conftest.py): PgBouncer's console and pools; the statement is checked
# on every version elsewhere.
pytestmark = pytest.mark.any_version

STRANDED = "pg_advisory_pooled_session_locks"
TRANSACTION = f"{TRANSACTION_POOL}/postgres"  # PgBouncer's pool: database/user (forced)


def _with_poolers(one_target: OneTarget, dsn: str, *poolers: dict[str, Any]) -> Config:
    config = one_target(dsn)
    config["targets"][0]["poolers"] = list(poolers)
    return config


def _console(bouncer: PgBouncer, tmp_path: Path, name: str = "pgbouncer") -> dict[str, Any]:
    password = tmp_path / "pgbouncer-password"
    password.write_text(STATS_PASSWORD + "\n")
    return {"name": name, "admin_dsn": bouncer.admin_dsn(with_password=False),
            "password_file": str(password)}  # fmt: skip


@pytest.fixture
def watched(
    pgbouncer: PgBouncer, one_target: OneTarget, monitor_dsn: str, tmp_path: Path
) -> Config:
    """A target whose PgBouncer is read through its admin console."""
    return _with_poolers(one_target, monitor_dsn, _console(pgbouncer, tmp_path))


def _strand(bouncer: PgBouncer, key: int, application_name: str = "nightly-job") -> None:
    """A job takes a session lock through the transaction pool and finishes: its client
    disconnects, but the server connection, with the lock, goes back to the pool."""
    with psycopg.connect(bouncer.dsn(), autocommit=True, application_name=application_name) as job:
        job.execute("SELECT pg_advisory_lock(%s)", (key,))


def _pooler_up(scrape: Scrape) -> list[float]:
    return [value for _, value in scrape.find("pg_advisory_pooler_up", pooler="pgbouncer")]


def _stranded(scrape: Scrape, **labels: str) -> float:
    return sum(value for _, value in scrape.find(STRANDED, **labels))


def test_a_session_lock_stranded_in_a_transaction_pool_is_counted_with_its_pool(
    pgbouncer: PgBouncer, start_exporter: StartExporter, watched: Config
) -> None:
    exporter = start_exporter(config=watched)
    # Read and found clean: a 0, so that the series' absence would mean "not watched". (The
    # first read also connects: on a loaded machine it may take longer than a collection
    # waits for it.)
    scrape = exporter.scrape_until(lambda s: _pooler_up(s) == [1])
    clean = {"target": "main", "datname": "", "application_name": "", "pooler": "pgbouncer"}
    assert scrape.find(STRANDED) == [({**clean, "pool": ""}, 0.0)]  # Prometheus drops ""

    _strand(pgbouncer, 777)
    labels = {"target": "main", "datname": "postgres", "application_name": "nightly-job"}
    stranded = {**labels, "pooler": "pgbouncer", "pool": TRANSACTION}
    scrape = exporter.scrape_until(lambda s: _stranded(s, **stranded) == 1)
    assert scrape.value("pg_advisory_holders", **labels, state="idle") == 1
    assert not scrape.find(STRANDED, pooler="pgbouncer", datname="")  # no 0 beside it

    # The next client handed that server connection "gets" the lock too: the job's double
    # run. The lock is still stranded, now under the new client's name.
    with psycopg.connect(
        pgbouncer.dsn(), autocommit=True, application_name="nightly-job-2"
    ) as late:
        assert late.execute("SELECT pg_try_advisory_lock(777)").fetchone() == (True,)
    second = {**stranded, "application_name": "nightly-job-2"}
    # More collections than psycopg's prepare threshold (5): the console takes no prepared
    # statements, and a collection that prepared one would lose the pooler.
    for _ in range(8):
        scrape = exporter.scrape()
    assert _stranded(scrape, **second) == 1
    assert scrape.value("pg_advisory_pooler_up", target="main", pooler="pgbouncer") == 1
    assert "cannot read the pooler" not in exporter.log()


def test_a_session_lock_through_a_session_pool_is_not_stranded(
    pgbouncer: PgBouncer, start_exporter: StartExporter, watched: Config
) -> None:
    # A session pool gives the client the server connection until it disconnects: its
    # session lock is its own, held while idle, and not stranded.
    with psycopg.connect(
        pgbouncer.dsn(SESSION_POOL), autocommit=True, application_name="session-job"
    ) as job:
        job.execute("SELECT pg_advisory_lock(778)")
        exporter = start_exporter(config=watched)
        holder = {"target": "main", "datname": "postgres", "application_name": "session-job"}
        scrape = exporter.scrape_until(
            lambda s: bool(s.find("pg_advisory_holders", **holder)) and _pooler_up(s) == [1]
        )
        assert scrape.find(STRANDED, application_name="session-job") == []
        assert _stranded(scrape, pooler="pgbouncer") == 0
        # The same lock through the transaction pool is stranded: the pools differ only in
        # their mode.
        _strand(pgbouncer, 779, application_name="tx-job")
        scrape = exporter.scrape_until(lambda s: _stranded(s, application_name="tx-job") == 1)
        assert scrape.find(STRANDED, application_name="session-job") == []


def test_a_pooler_that_is_down_leaves_the_server_series(
    pgbouncer: PgBouncer,
    start_exporter: StartExporter,
    one_target: OneTarget,
    monitor_dsn: str,
    tmp_path: Path,
) -> None:
    nobody = {"name": "gone", "admin_dsn": f"host=127.0.0.1 port={free_port()} dbname=pgbouncer"}
    config = _with_poolers(one_target, monitor_dsn, _console(pgbouncer, tmp_path), nobody)
    _strand(pgbouncer, 780)
    exporter = start_exporter(config=config)
    scrape = exporter.scrape_until(lambda s: _stranded(s, pooler="pgbouncer") == 1)
    assert scrape.value("pg_advisory_up", target="main") == 1
    assert scrape.value("pg_advisory_pooler_up", target="main", pooler="gone") == 0
    assert scrape.find(STRANDED, pooler="gone") == []  # not watched: no series at all

    pgbouncer.stop()  # the server connection, and its lock, go with it
    scrape = exporter.scrape_until(
        lambda s: s.value("pg_advisory_pooler_up", target="main", pooler="pgbouncer") == 0
    )
    assert scrape.value("pg_advisory_up", target="main") == 1
    assert scrape.find("pg_advisory_lock_table_entries", target="main")
    assert scrape.find(STRANDED) == []
    assert "cannot read the pooler" in exporter.log()


def test_a_pooler_known_by_its_addresses(
    pgbouncer: PgBouncer,
    start_exporter: StartExporter,
    one_target: OneTarget,
    monitor_dsn: str,
) -> None:
    # Without the console: every backend whose client is 127.0.0.1 is the pooler's (here,
    # where every client is local, that includes direct sessions: it is the user's word).
    by_address = {"name": "by-address", "addresses": ["127.0.0.1/32", "localhost"],
                  "pool_mode": "transaction"}  # fmt: skip
    exporter = start_exporter(config=_with_poolers(one_target, monitor_dsn, by_address))
    _strand(pgbouncer, 781)
    labels = {"target": "main", "datname": "postgres", "application_name": "nightly-job"}
    scrape = exporter.scrape_until(lambda s: _stranded(s, **labels, pooler="by-address") == 1)
    assert scrape.value("pg_advisory_pooler_up", target="main", pooler="by-address") == 1
    assert scrape.find(STRANDED, pooler="by-address")[0][0]["pool"] == ""


def test_a_frozen_pooler_costs_a_scrape_no_more_than_the_poolers_wait(
    pgbouncer: PgBouncer, start_exporter: StartExporter, watched: Config
) -> None:
    watched["collection"].update(connect_timeout="2s", statement_timeout="1s")  # 4s deadline
    exporter = start_exporter(config=watched)
    exporter.scrape_until(lambda s: _pooler_up(s) == [1])
    assert pgbouncer.process is not None
    pgbouncer.process.send_signal(signal.SIGSTOP)  # connected, and answering nothing
    try:
        took, scrape = exporter.timed_scrape()
        assert took < 2.0  # the poolers' wait (0.5s), far from the deadline
        assert scrape.value("pg_advisory_up", target="main") == 1
        assert scrape.value("pg_advisory_pooler_up", target="main", pooler="pgbouncer") == 0
        # Still reading, then backing off: the next scrapes do not wait for it again.
        took, scrape = exporter.timed_scrape()
        assert took < 0.5
        assert scrape.value("pg_advisory_pooler_up", target="main", pooler="pgbouncer") == 0
    finally:
        pgbouncer.process.send_signal(signal.SIGCONT)
    scrape = exporter.scrape_until(
        lambda s: s.value("pg_advisory_pooler_up", target="main", pooler="pgbouncer") == 1
    )
    assert "no answer within" in exporter.log()
