"""One exporter for a fleet: /probe, concurrent targets, one of them stopped, and reloads."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import psycopg
import pytest
import yaml
from support import (
    PG_MAJOR,
    Config,
    Scrape,
    Session,
    SilentServer,
    StartExporter,
    exporter_sessions,
    wait_until,
)

from devtools.embedded_postgres import EmbeddedPostgres, free_port

# Version-independent (tests/conftest.py): scheduling, reloads and deadlines across targets: the
# exporter's side.
pytestmark = pytest.mark.any_version


@pytest.fixture(scope="module")
def fleet() -> Iterator[list[EmbeddedPostgres]]:
    """Two servers besides the suite's own: three in all."""
    servers = [EmbeddedPostgres(major=PG_MAJOR) for _ in range(2)]
    try:
        for server in servers:
            server.start()
        yield servers
    finally:
        for server in servers:
            server.cleanup()


def _config(targets: dict[str, str], **extra: Any) -> Config:
    return {
        "collection": {"min_interval": "1ms", "reconnect_backoff_max": "1s"},
        "targets": [{"name": name, "dsn": dsn} for name, dsn in targets.items()],
        **extra,
    }


def test_probe_serves_one_named_target_and_nothing_else(
    start_exporter: StartExporter,
    monitor_dsn: str,
    fleet: list[EmbeddedPostgres],
    silent_server: SilentServer,
) -> None:
    port, accepted = silent_server.port, silent_server.accepted
    # A target of the silent server: the probe that shows where a connection would go.
    canary = f"host=127.0.0.1 port={port} user=x dbname=x sslmode=disable"
    exporter = start_exporter(
        config=_config({"orders": monitor_dsn, "billing": fleet[0].dsn(), "canary": canary})
    )
    status, body = exporter.get("/probe?target=billing")
    assert status == 200
    probe = Scrape(body)
    assert probe.label_values("target") == {"billing"}
    assert probe.value("pg_advisory_up", target="billing") == 1
    assert probe.find("pg_advisory_exporter_build_info") == []

    for bad in (
        f"host=127.0.0.1 port={port} user=x",
        f"postgresql://x@127.0.0.1:{port}/x",
        f"127.0.0.1:{port}",
        "unknown",
    ):
        status, body = exporter.get("/probe?" + urlencode({"target": bad}))
        assert status == 404, body
        assert "never a host or a DSN" in body
        assert "orders, billing, canary" in body
    assert exporter.get("/probe")[0] == 400
    assert exporter.get("/probe?target=a&target=b")[0] == 400
    # The proof: the canary's probe, made after all of them, reaches the silent server once.
    # A connection that a refused probe made, before its answer, was accepted before it, in
    # the order they came. (The canary's own probe times out: the server never answers.)
    assert accepted == [], "the exporter connected to a host given in a URL"
    timeout = {"X-Prometheus-Scrape-Timeout-Seconds": "1"}
    assert exporter.get("/probe?target=canary", timeout)[0] == 200
    wait_until(lambda: len(accepted) > 0, 10, "the canary's connection")
    assert len(accepted) == 1, "the exporter connected to a host given in a URL"


@pytest.mark.slow
def test_a_stopped_server_never_blanks_the_others(
    start_exporter: StartExporter,
    monitor_dsn: str,
    fleet: list[EmbeddedPostgres],
    session: Session,
) -> None:
    session("on-the-suite-server").execute("SELECT pg_advisory_lock(1)")
    with psycopg.connect(fleet[1].dsn(), autocommit=True, application_name="on-c") as other:
        other.execute("SELECT pg_advisory_lock(2)")
        exporter = start_exporter(
            config=_config({"a": monitor_dsn, "b": fleet[0].dsn(), "c": fleet[1].dsn()})
        )
        before = exporter.scrape()
        assert {before.value("pg_advisory_up", target=t) for t in "abc"} == {1.0}

        fleet[0].stop("immediate")
        try:
            for _ in range(3):
                started = time.monotonic()
                during = exporter.scrape()
                assert time.monotonic() - started < 3.0
                assert during.value("pg_advisory_up", target="b") == 0
                assert during.value("pg_advisory_up", target="a") == 1
                assert during.value("pg_advisory_up", target="c") == 1
                assert (
                    during.value(
                        "pg_advisory_holders", target="a", application_name="on-the-suite-server"
                    )
                    == 1
                )
                assert during.value("pg_advisory_holders", target="c", application_name="on-c") == 1
                assert during.find("pg_advisory_lock_table_entries", target="b") == []
        finally:
            fleet[0].start()
        exporter.scrape_until(lambda s: s.value("pg_advisory_up", target="b") == 1, timeout=15)


def test_reload_adds_removes_and_keeps_unchanged_targets(
    start_exporter: StartExporter,
    monitor_dsn: str,
    pg: EmbeddedPostgres,
    fleet: list[EmbeddedPostgres],
    session: Session,
) -> None:
    keys = [{"name": "nightly_billing", "key": 7310001}]
    exporter = start_exporter(
        "--web.enable-lifecycle", config=_config({"a": monitor_dsn, "b": fleet[0].dsn()}, keys=keys)
    )
    config_path = next(exporter.log_path.parent.glob(f"config-{exporter.port}.yaml"))
    session("billing-worker").execute("SELECT pg_advisory_lock(7310001)")
    before = exporter.scrape()
    assert before.value("pg_advisory_key_holders", target="a", key="nightly_billing") == 1
    sessions = exporter_sessions(pg)
    assert len(sessions) == 1

    # b is removed, c added, a unchanged; the registry is global, so change it per target:
    # give b's replacement, c, its own key.
    config_path.write_text(
        yaml.safe_dump(
            {
                **_config({"a": monitor_dsn}, keys=keys),
                "targets": [
                    {"name": "a", "dsn": monitor_dsn},
                    {"name": "c", "dsn": fleet[1].dsn(), "keys": [{"name": "leader", "key": 42,
                                                                      "expect_held": True}]},
                ],
            }
        )
    )  # fmt: skip
    exporter.process.send_signal(signal.SIGHUP)
    after = exporter.scrape_until(lambda s: s.label_values("target") == {"a", "c"})
    assert after.value("pg_advisory_key_holders", target="c", key="leader") == 0
    assert after.value("pg_advisory_key_holders", target="a", key="nightly_billing") == 1
    # The unchanged target kept its connection (same backend) and its counters.
    assert exporter_sessions(pg) == sessions
    assert exporter_sessions(fleet[0]) == []  # the removed target's connection is closed
    assert "configuration reloaded" in exporter.log()

    # An invalid file is refused over HTTP too, and the running configuration stays.
    config_path.write_text("targets: [{name: a, dsn: 'host=x', oops: 1}]")
    status, body = exporter.get("/-/reload", method="POST")
    assert status == 500
    assert "targets[0] (a).oops: unknown field" in body
    assert exporter.scrape().label_values("target") == {"a", "c"}
    assert "reload refused" in exporter.log()
    assert exporter.get("/-/reload")[0] == 405

    # A changed registry takes effect on the next collection of that target.
    config_path.write_text(
        yaml.safe_dump(_config({"a": monitor_dsn}, keys=[{"name": "billing", "key": 7310001}]))
    )
    assert exporter.get("/-/reload", method="POST") == (200, "reloaded\n")
    renamed = exporter.scrape()
    assert renamed.value("pg_advisory_key_holders", target="a", key="billing") == 1
    assert renamed.find("pg_advisory_key_holders", key="nightly_billing") == []
    assert renamed.label_values("target") == {"a"}


RELOADED = "pg_advisory_exporter_config_last_reload_successful"
RELOADED_AT = "pg_advisory_exporter_config_last_reload_success_timestamp_seconds"


def test_a_refused_reload_is_in_the_series_until_a_good_one(
    start_exporter: StartExporter, monitor_dsn: str
) -> None:
    """The file broken (an unknown field, then bad YAML) and reloaded by SIGHUP and over
    HTTP: the series says 0 and the time of the configuration still running; fixed and
    reloaded, 1 and the reload's time. Without a file, neither series."""
    started = time.time()
    exporter = start_exporter("--web.enable-lifecycle", config=_config({"a": monitor_dsn}))
    config_path = next(exporter.log_path.parent.glob(f"config-{exporter.port}.yaml"))
    good = config_path.read_text()
    first = exporter.scrape()
    assert first.value(RELOADED) == 1
    loaded = first.value(RELOADED_AT)
    assert started - 1 <= loaded <= time.time()

    config_path.write_text(good + "oops: 1\n")
    exporter.process.send_signal(signal.SIGHUP)
    refused = exporter.scrape_until(lambda s: s.value(RELOADED) == 0)
    assert refused.value(RELOADED_AT) == loaded
    assert refused.value("pg_advisory_up", target="a") == 1  # the previous one runs
    assert "reload refused" in exporter.log()
    config_path.write_text("targets: [unclosed")
    status, body = exporter.get("/-/reload", method="POST")
    assert status == 500
    assert "not valid YAML" in body
    still = exporter.scrape()
    assert (still.value(RELOADED), still.value(RELOADED_AT)) == (0, loaded)

    config_path.write_text(good)
    assert exporter.get("/-/reload", method="POST")[0] == 200
    fixed = exporter.scrape()
    assert fixed.value(RELOADED) == 1
    assert loaded < fixed.value(RELOADED_AT) <= time.time()
    assert exporter.process.poll() is None

    # Without a file (--dsn), there is no reload of one to report.
    without = start_exporter("--dsn", monitor_dsn).scrape()
    assert without.value("pg_advisory_up", target="default") == 1
    assert without.find(RELOADED) == without.find(RELOADED_AT) == []


def test_many_targets_are_collected_at_once(
    start_exporter: StartExporter,
    monitor_dsn: str,
    fleet: list[EmbeddedPostgres],
    silent_server: SilentServer,
) -> None:
    port = silent_server.port
    hung = f"host=127.0.0.1 port={port} user=x dbname=x"
    targets = {"hung-1": hung, "hung-2": hung, "a": monitor_dsn, "b": fleet[0].dsn()}
    config = _config(targets, max_parallel_collections=4)
    config["collection"]["connect_timeout"] = "10s"
    exporter = start_exporter(config=config)
    started = time.monotonic()
    status, body = exporter.get("/metrics", {"X-Prometheus-Scrape-Timeout-Seconds": "3"})
    assert time.monotonic() - started < 3.0
    assert status == 200
    scrape = Scrape(body)
    assert scrape.value("pg_advisory_up", target="a") == 1
    assert scrape.value("pg_advisory_up", target="b") == 1
    assert scrape.value("pg_advisory_up", target="hung-1") == 0
    assert scrape.value("pg_advisory_up", target="hung-2") == 0


@pytest.mark.slow
def test_a_fleet_of_ten_thousand_answers_within_the_scrape_timeout(
    start_exporter: StartExporter,
    monitor_dsn: str,
    silent_server: SilentServer,
) -> None:
    # Mostly servers that refuse connections, some that hang, one that answers. Each refusing
    # one has an address of its own (any of 127.0.0.0/8 reaches this host, where nothing
    # listens on the port): targets that name one address are one server, read once.
    port = free_port()
    targets = {
        f"refused-{i}": f"host=127.0.{i // 250}.{i % 250 + 2} port={port} user=x dbname=x"
        for i in range(9_990)
    }
    hung = f"host=127.0.0.1 port={silent_server.port} user=x dbname=x"
    targets |= {f"hung-{i}": hung for i in range(9)}
    targets["healthy"] = monitor_dsn
    config = _config(targets)
    config["collection"]["connect_timeout"] = "10s"
    exporter = start_exporter(config=config)
    timeout = 10.0
    answers: list[tuple[float, int, str]] = []

    def scrape() -> None:
        started = time.monotonic()
        status, body = exporter.get(
            "/metrics", {"X-Prometheus-Scrape-Timeout-Seconds": str(timeout)}
        )
        answers.append((time.monotonic() - started, status, body))

    for _ in range(2):
        answers.clear()
        fleet_scrape = threading.Thread(target=scrape)
        fleet_scrape.start()
        time.sleep(1)  # the fleet's collections fill the queue
        started = time.monotonic()
        status, body = exporter.get("/probe?target=healthy")
        probe_seconds = time.monotonic() - started
        fleet_scrape.join()
        assert status == 200
        assert Scrape(body).value("pg_advisory_up", target="healthy") == 1
        [(elapsed, status, body)] = answers
        assert status == 200
        assert elapsed < timeout
        # The probe jumps the fleet's queue: it answers in about 0.05 s, and took up to 1.6 s
        # in full runs of the suite. Queued behind the fleet instead, it took half the fleet's
        # scrape (4.5 of 8.8 s). So the bound is this run's own scrape, which slows with it.
        assert probe_seconds < elapsed / 3, f"/probe {probe_seconds:.2f} s, fleet {elapsed:.2f} s"
        scraped = Scrape(body)
        assert len(scraped.find("pg_advisory_up")) == len(targets)
        assert scraped.value("pg_advisory_up", target="hung-0") == 0
        # Servers that hang or refuse never starve the one that answers.
        assert scraped.value("pg_advisory_up", target="healthy") == 1
    # A server that stays down is logged once, not at every attempt.
    assert exporter.log().count("collection failed") <= len(targets)
