"""One server, one read, one count: the probes of many databases of one server, and targets
that name one server twice, share one connection and one collection, count each lock once and
page once per problem (a real Prometheus, the shipped rules)."""

from __future__ import annotations

import json
import re
import signal
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from support import (
    MONITOR_PASSWORD,
    Cli,
    Config,
    LoggedReads,
    RunningExporter,
    Scrape,
    Session,
    StartExporter,
    StartService,
    databases_on,
    exporter_sessions,
    monitor_module,
    prometheus_query,
    start_prometheus,
    wait_until,
    write_config,
)

from devtools.embedded_postgres import EmbeddedPostgres
from pg_advisory_exporter.collect.kept_connection import APPLICATION_NAME

# Version-independent (tests/conftest.py): how the exporter shares a server's collections
# between its targets, and how the rules count them.
pytestmark = pytest.mark.any_version

DATABASES = [f"shop{i:02}" for i in range(1, 11)]
# Thresholds low enough that the test's locks fire the alerts: a lock held idle for a
# second leaks, and any lock table entry is "nearly full" (the suite's server has about
# 5,000 entries of capacity).
RULES = (
    "leaked_lock_after=1s",
    "leaked_lock_for=1m",
    "lock_table_warning=0.00001",
    "lock_table_for=1m",
)


@pytest.fixture
def databases(pg: EmbeddedPostgres) -> Iterator[list[str]]:
    with databases_on(pg, DATABASES) as made:
        yield made


def _held(pg: EmbeddedPostgres) -> int:
    """Advisory lock entries granted now, as pg_locks counts them."""
    with pg.connect() as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
        ).fetchone()
    assert row is not None
    return int(row[0])


def _idle_holders(pg: EmbeddedPostgres) -> set[tuple[str, str, str]]:
    """(database, application_name, state) of each session idle while holding an advisory
    lock, in the exporter's words for its state."""
    with pg.connect() as conn:
        rows = conn.execute(
            "SELECT DISTINCT a.datname, a.application_name, replace(a.state, ' ', '_')"
            " FROM pg_locks AS l JOIN pg_stat_activity AS a USING (pid)"
            " WHERE l.locktype = 'advisory' AND l.granted AND a.state LIKE 'idle%'"
        ).fetchall()
    return {(str(d), str(n), str(s)) for d, n, s in rows}


class Prometheus:
    def __init__(self, port: int) -> None:
        self.port = port

    def query(self, query: str) -> list[dict[str, Any]]:
        return prometheus_query(self.port, query)

    def value(self, query: str) -> float | None:
        found = self.query(query)
        assert len(found) <= 1, found
        return float(found[0]["value"][1]) if found else None

    def alerts(self, name: str) -> list[dict[str, str]]:
        """The labels of each pending or firing alert of that name."""
        return [r["metric"] for r in self.query(f'ALERTS{{alertname="{name}"}}')]


def _prometheus(
    start_service: StartService,
    tmp_path: Path,
    cli: Cli,
    job: dict[str, Any],
) -> Prometheus:
    """Prometheus with the shipped rules (thresholds lowered) and this job, every second."""
    rules = tmp_path / "rules.yml"
    settings = [arg for setting in RULES for arg in ("--set", setting)]
    rules.write_text(cli("rules", *settings, check=True).stdout)
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": [{"job_name": "pg-advisory-exporter", **job}],
    }
    return Prometheus(start_prometheus(start_service, tmp_path, config))


def _all_up(prometheus: Prometheus, count: int) -> None:
    wait_until(
        lambda: prometheus.value("count(pg_advisory_up == 1)") == count,
        60,
        lambda: f"{count} targets up: {prometheus.query('pg_advisory_up')}",
        0.5,
    )


def _read_once_per_collection(pg: EmbeddedPostgres, targets: int) -> None:
    """About one read of pg_locks per collection interval (min_interval 1s), not one per
    target (`targets` a second)."""
    window = 10.0
    logged = LoggedReads(pg)
    time.sleep(window)
    reads = logged.count()
    print(f"{reads} reads of pg_locks in {window:g}s for {targets} targets scraped every second")
    assert 1 <= reads <= window + 2, f"{reads} reads of pg_locks in {window}s"


def _each_lock_counted_once(prometheus: Prometheus, pg: EmbeddedPostgres) -> None:
    held = 'sum(pg_advisory_locks{job="pg-advisory-exporter", granted="true"})'
    wait_until(
        lambda: prometheus.value(held) == _held(pg),
        30,
        lambda: f"{prometheus.value(held)} locks counted, {_held(pg)} held",
        0.5,
    )


def _leaks_and_table_pending(prometheus: Prometheus) -> list[tuple[str, ...]]:
    """Once both alerts are pending, and every target has been scraped and every rule
    evaluated again since: each leak's (target, datname, application_name, state)."""
    names = ("PgAdvisoryLockLeaked", "PgLockTableNearlyFull")
    wait_until(lambda: all(prometheus.alerts(n) for n in names), 30, f"{names} pending", 0.5)
    time.sleep(3)
    return [
        (a["target"], a["datname"], a["application_name"], a["state"])
        for a in prometheus.alerts("PgAdvisoryLockLeaked")
    ]


def _probes(exporter: RunningExporter, targets: list[str]) -> dict[str, Any]:
    """The job that probes these targets one by one through the auth module `fleet`."""
    return {
        "metrics_path": "/probe",
        "params": {"auth_module": ["fleet"]},
        "static_configs": [{"targets": targets}],
        "relabel_configs": [
            {"source_labels": ["__address__"], "target_label": "__param_target"},
            {"source_labels": ["__param_target"], "target_label": "instance"},
            {"target_label": "__address__", "replacement": f"127.0.0.1:{exporter.port}"},
        ],
    }


def _hold_locks(session: Session) -> None:
    """A leaked session lock in shop03 (idle), and other holders elsewhere that do not leak:
    two readers sharing a lock in shop05 (active statements would show as active; these are
    transactions kept open by the test, idle in transaction but young), one in billing."""
    session("billing-worker", "shop03").execute("SELECT pg_advisory_lock(7310001)")
    for name in ("report-reader-1", "report-reader-2"):
        reader = session(name, "shop05", autocommit=False)
        reader.execute("SELECT pg_advisory_xact_lock_shared(2001, 81234)")
    session("leader-elector", "billing").execute("SELECT pg_advisory_lock(42)")


def test_a_real_prometheus_probing_ten_databases_reads_the_server_once_and_pages_once(
    pg: EmbeddedPostgres,
    databases: list[str],
    session: Session,
    start_exporter: StartExporter,
    start_service: StartService,
    tmp_path: Path,
    cli: Cli,
) -> None:
    config: Config = {
        "collection": {"min_interval": "1s"},
        "auth_modules": {"fleet": monitor_module(tmp_path, "127.0.0.1/32")},
    }
    exporter = start_exporter(config=config)
    targets = [f"127.0.0.1:{pg.port}/{name}" for name in [*databases, "billing"]]
    _hold_locks(session)
    prometheus = _prometheus(start_service, tmp_path, cli, _probes(exporter, targets))

    _all_up(prometheus, len(targets))
    # One connection for the eleven probes, to the module's database, not one per database.
    assert len(exporter_sessions(pg)) == 1
    scrape = exporter.scrape()
    assert scrape.value("pg_advisory_exporter_discovered_targets") == len(targets)
    assert scrape.value("pg_advisory_exporter_discovered_servers") == 1
    _read_once_per_collection(pg, len(targets))
    _each_lock_counted_once(prometheus, pg)
    # The lock table's series once, on one probe.
    assert len(prometheus.query("pg_advisory_lock_table_entries")) == 1
    assert len(prometheus.query("pg_advisory_exporter_collect_duration_seconds")) == 1

    # One page per problem. Every idle holder leaks at a second's threshold: each pages once,
    # on its database's probe (with each probe answering for every database, each would page
    # eleven times); the lock table pages once.
    leaks = _leaks_and_table_pending(prometheus)
    assert sorted(leaks) == sorted(
        (f"127.0.0.1:{pg.port}/{datname}", datname, name, state)
        for datname, name, state in _idle_holders(pg)
    )
    assert (f"127.0.0.1:{pg.port}/shop03", "shop03", "billing-worker", "idle") in leaks
    [table] = prometheus.alerts("PgLockTableNearlyFull")
    assert table["severity"] == "warning"
    assert table["target"] in targets


def test_two_configured_targets_on_one_server_read_it_once_and_page_once(
    pg: EmbeddedPostgres,
    databases: list[str],
    session: Session,
    start_exporter: StartExporter,
    start_service: StartService,
    tmp_path: Path,
    cli: Cli,
) -> None:
    """`orders` and `billing` name one address (two databases of it), `local` the same
    server under another name: one connection, one read per collection, one count."""
    password_file = tmp_path / "monitor-password"
    password_file.write_text(MONITOR_PASSWORD)
    dsn = "host={} port={} user=monitor dbname={}"
    config: Config = {
        "collection": {"min_interval": "1s"},
        "targets": [
            {
                "name": name,
                "dsn": dsn.format(host, pg.port, dbname),
                "password_file": str(password_file),
            }
            for name, host, dbname in (
                ("orders", "127.0.0.1", "postgres"),
                ("billing", "127.0.0.1", "billing"),
                ("local", "localhost", "postgres"),
            )
        ],
    }
    (tmp_path / "check.yaml").write_text(json.dumps(config))
    checked = cli("--config.file", str(tmp_path / "check.yaml"), "--config.check", check=True)
    assert re.search(
        r"note: .*check\.yaml: targets\[1\] \(billing\)\.dsn: the same server as target "
        rf"'orders' \(targets\[0\], 127\.0\.0\.1:{pg.port}\)",
        checked.stdout,
    ), checked.stdout
    exporter = start_exporter(config=config)
    _hold_locks(session)
    job = {"static_configs": [{"targets": [f"127.0.0.1:{exporter.port}"]}]}
    prometheus = _prometheus(start_service, tmp_path, cli, job)

    _all_up(prometheus, 3)
    wait_until(lambda: len(exporter_sessions(pg)) == 1, 10, "one connection for three targets")
    _read_once_per_collection(pg, 3)
    _each_lock_counted_once(prometheus, pg)
    answered = exporter.scrape()
    assert {labels["target"] for labels, _ in answered.find("pg_advisory_locks")} == {"orders"}
    assert "the same server as another target" in exporter.log()
    # Each leak once, on the target that answers for the server (each target of the three
    # answering for every database, each would page three times).
    leaks = _leaks_and_table_pending(prometheus)
    assert sorted(leaks) == sorted(("orders", *holder) for holder in _idle_holders(pg))
    assert [a["target"] for a in prometheus.alerts("PgLockTableNearlyFull")] == ["orders"]


def test_made_up_databases_and_other_spellings_of_one_server_open_no_connection(
    own_server: EmbeddedPostgres, start_exporter: StartExporter, tmp_path: Path
) -> None:
    """A flood of probes of databases that do not exist, and of the server's other names,
    makes one connection to it in all (counted by the server's own connection log)."""
    with own_server.connect() as conn:
        conn.execute(f"CREATE ROLE monitor LOGIN PASSWORD '{MONITOR_PASSWORD}'")
        conn.execute("GRANT pg_read_all_stats TO monitor")
        conn.execute("ALTER SYSTEM SET log_connections = on")
        conn.execute("SELECT pg_reload_conf()")
    exporter = start_exporter(
        config={"auth_modules": {"fleet": monitor_module(tmp_path, "127.0.0.1/32")}}
    )
    server = f"127.0.0.1:{own_server.port}"

    def probe(target: str) -> tuple[int, str]:
        query = urllib.parse.urlencode({"target": target, "auth_module": "fleet"})
        return exporter.get(f"/probe?{query}")

    def up(target: str) -> float:
        status, body = probe(target)
        assert status == 200, body
        return Scrape(body).value("pg_advisory_up", target=target)

    # While the server cannot say which databases it has, a probe is answered as down...
    own_server.stop()
    assert up(f"{server}/made_up") == 0
    own_server.start()
    wait_until(lambda: up(f"{server}/postgres") == 1, 10, "the server read again")
    # ... and refused once it has said.
    assert probe(f"{server}/made_up")[0] == 404
    for i in range(200):
        status, body = probe(f"{server}/made_up_{i}")
        assert status == 404, body
        assert f"has no database 'made_up_{i}'" in body
    for spelling in (server, f"{server}/template1", f"{server}/postgres"):
        status, _ = probe(spelling)
        assert status == (404 if "template" in spelling else 200), spelling
    metrics = exporter.scrape()
    refused = metrics.value("pg_advisory_exporter_probe_refusals_total", reason="no_such_database")
    assert refused == 202
    assert metrics.value("pg_advisory_exporter_discovered_servers") == 1
    assert metrics.value("pg_advisory_exporter_discovered_targets") == 2
    log = own_server.logfile.read_text(errors="replace")
    # One kept connection; the rare read of pg_stat_statements has one of its own, closed.
    kept = r"connection authorized: user=monitor .*application_name=pg-advisory-exporter$"
    assert len(re.findall(kept, log, flags=re.MULTILINE)) == 1
    reader = (
        r"connection authorized: user=monitor .*application_name=pg-advisory-exporter statements$"
    )
    assert len(re.findall(reader, log, flags=re.MULTILINE)) <= 1


def _exporter_roles(server: EmbeddedPostgres) -> list[str]:
    """The role of each connection the exporter keeps to the server (its rare reads of
    pg_stat_statements, on connections of their own, left out)."""
    with server.connect() as conn:
        rows = conn.execute(
            "SELECT usename FROM pg_stat_activity WHERE application_name = %s ORDER BY pid",
            (APPLICATION_NAME,),
        ).fetchall()
    return [str(row[0]) for row in rows]


def test_the_first_in_the_file_reads_a_server_named_three_ways_whichever_connects_first(
    own_server: EmbeddedPostgres, start_exporter: StartExporter, tmp_path: Path
) -> None:
    """By address, by host name and by Unix socket, with three roles: only the first has the
    grant. The first cannot connect at the start (its password file is not there yet): the
    others read the server. Once it connects, it reads it, with its role: one connection,
    the leak signal that only its grant shows. A reload that puts the socket first hands the
    server to the socket's role."""
    own_server.stop()
    own_server.start(unix_socket_directories=own_server.server_path(own_server.basedir))
    passwords = {role: f"{role}-secret" for role in ("granted", "bare", "local")}
    with own_server.connect() as conn:
        for role, password in passwords.items():
            conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
        conn.execute("GRANT pg_read_all_stats TO granted")
    for role, password in passwords.items():
        if role != "granted":
            (tmp_path / role).write_text(password)
    # A lock left in an open transaction: idle in transaction, which only a role with the
    # grant can tell from any other state (without it: "unknown", no idle time).
    leak = psycopg.connect(own_server.dsn(), application_name="billing-worker")
    leak.execute("SELECT pg_advisory_xact_lock(7310001)")
    dsn = "host={} port={} user={} dbname=postgres"
    targets = [
        ("by-address", "127.0.0.1", "granted"),
        ("by-name", "localhost", "bare"),
        ("by-socket", str(own_server.basedir), "local"),
    ]
    config: Config = {
        "collection": {"min_interval": "100ms"},
        "targets": [
            {"name": name, "dsn": dsn.format(host, own_server.port, role),
             "password_file": str(tmp_path / role)}
            for name, host, role in targets
        ],
    }  # fmt: skip
    exporter = start_exporter(config=config)
    try:
        early = exporter.scrape_until(lambda s: s.value("pg_advisory_up", target="by-name") == 1)
        assert early.value("pg_advisory_up", target="by-address") == 0
        assert early.value("pg_advisory_exporter_insufficient_privilege", target="by-name") == 1
        (tmp_path / "granted").write_text(passwords["granted"])

        def read_by_the_first(scrape: Scrape) -> bool:
            return scrape.find(
                "pg_advisory_exporter_insufficient_privilege", target="by-address"
            ) == [({"target": "by-address"}, 0.0)] and _exporter_roles(own_server) == ["granted"]

        settled = exporter.scrape_until(read_by_the_first)
        for name, _, _ in targets:
            assert settled.value("pg_advisory_up", target=name) == 1
        # The whole server's series, and its leak, on the first target only.
        assert {labels["target"] for labels, _ in settled.find("pg_advisory_locks")} == {
            "by-address"
        }
        idle = settled.find("pg_advisory_idle_holder_max_seconds", state="idle_in_transaction")
        assert [labels["target"] for labels, _ in idle] == ["by-address"]
        assert 'msg="answers for its server" target=by-address' in exporter.log()

        # A reload that puts the socket first: its role reads now, and the others through it.
        config["targets"] = [config["targets"][2], *config["targets"][:2]]
        write_config(tmp_path, config, f"config-{exporter.port}.yaml")
        exporter.process.send_signal(signal.SIGHUP)
        exporter.scrape_until(
            lambda s: (
                s.find("pg_advisory_exporter_insufficient_privilege", target="by-socket")
                == [({"target": "by-socket"}, 1.0)]
                and _exporter_roles(own_server) == ["local"]
            )
        )
        for _ in range(5):  # and stays so: one connection to the server
            time.sleep(0.2)
            assert _exporter_roles(own_server) == ["local"]
    finally:
        leak.close()


def test_a_first_target_that_cannot_connect_hands_its_address_to_the_next_and_takes_it_back(
    own_server: EmbeddedPostgres, start_exporter: StartExporter, tmp_path: Path
) -> None:
    """Two targets on one address, each with its role's password file (as two Kubernetes
    Secrets give them): the first's file is missing at the start, so the second reads the
    server and answers for it; once the file is there, the first reads it and answers, the
    second through it, on one connection."""
    passwords = {role: f"{role}-secret" for role in ("first", "second")}
    with own_server.connect() as conn:
        for role, password in passwords.items():
            conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
            conn.execute(f"GRANT pg_read_all_stats TO {role}")
    (tmp_path / "second").write_text(passwords["second"])
    config: Config = {
        "collection": {"min_interval": "100ms"},
        "targets": [
            {"name": role,
             "dsn": f"host=127.0.0.1 port={own_server.port} user={role} dbname=postgres",
             "password_file": str(tmp_path / role)}
            for role in passwords
        ],
    }  # fmt: skip
    exporter = start_exporter(config=config)

    def answering(scrape: Scrape) -> list[str]:
        return [labels["target"] for labels, _ in scrape.find("pg_advisory_server_info")]

    handed = exporter.scrape_until(lambda s: answering(s) == ["second"])
    assert handed.value("pg_advisory_up", target="second") == 1
    assert handed.value("pg_advisory_up", target="first") == 0
    assert _exporter_roles(own_server) == ["second"]
    assert 'msg="answers for its server" target=second' in exporter.log()

    (tmp_path / "first").write_text(passwords["first"])
    back = exporter.scrape_until(
        lambda s: answering(s) == ["first"] and _exporter_roles(own_server) == ["first"]
    )
    for role in passwords:
        assert back.value("pg_advisory_up", target=role) == 1
    assert {labels["target"] for labels, _ in back.find("pg_advisory_locks")} <= {"first"}
    assert 'msg="answers for its server" target=first' in exporter.log()
    for _ in range(5):  # and stays so: one connection to the server
        time.sleep(0.2)
        assert _exporter_roles(own_server) == ["first"]
