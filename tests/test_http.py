"""The HTTP endpoints, content negotiation, and promtool's verdict on a real scrape."""

from __future__ import annotations

import gzip
import json
import subprocess
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from support import OneTarget, RunningExporter, Scrape, Session, StartExporter


def _raw(url: str, **headers: str) -> tuple[dict[str, str], bytes]:
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, timeout=30) as response:
        return dict(response.headers), response.read()


@pytest.fixture
def exporter(
    start_exporter: StartExporter, one_target: OneTarget, monitor_dsn: str
) -> RunningExporter:
    config = one_target(monitor_dsn, name="orders-db")
    return start_exporter("--web.telemetry-path", "/custom-metrics", config=config)


def test_landing_page_names_targets_and_links_but_no_dsn(
    exporter: RunningExporter, monitor_dsn: str
) -> None:
    status, page = exporter.get("/")
    assert status == 200
    assert "orders-db" in page
    assert 'href="/custom-metrics"' in page
    assert 'href="/health"' in page
    assert "127.0.0.1" not in page
    assert "monitor" not in page


def test_health_reports_the_last_collection(exporter: RunningExporter) -> None:
    status, body = exporter.get("/health")
    assert status == 200
    assert json.loads(body)["targets"][0]["last_collection_unix"] is None  # nothing yet
    exporter.get("/custom-metrics")
    status, body = exporter.get("/health")
    report = json.loads(body)
    assert status == 200
    assert report["status"] == "ok"
    assert report["targets"][0]["target"] == "orders-db"
    assert report["targets"][0]["up"] is True
    assert report["targets"][0]["last_success_unix"] > 0


def test_unknown_path_is_404(exporter: RunningExporter) -> None:
    assert exporter.get("/metrics")[0] == 404  # the telemetry path was moved


def test_gzip_and_openmetrics_negotiation(exporter: RunningExporter) -> None:
    headers, body = _raw(exporter.base + "/custom-metrics", **{"Accept-Encoding": "gzip"})
    assert headers["Content-Encoding"] == "gzip"
    assert Scrape(gzip.decompress(body).decode()).value("pg_advisory_up", target="orders-db") == 1

    headers, body = _raw(
        exporter.base + "/custom-metrics",
        Accept="application/openmetrics-text; version=1.0.0; charset=utf-8",
    )
    assert headers["Content-Type"].startswith("application/openmetrics-text")
    text = body.decode()
    assert text.endswith("# EOF\n")
    assert "# TYPE pg_advisory_deadlocks counter" in text
    assert "# TYPE pg_advisory_exporter_collect_errors counter" in text


def test_concurrent_scrapes_all_answer(exporter: RunningExporter) -> None:
    with ThreadPoolExecutor(max_workers=16) as pool:
        statuses = list(pool.map(lambda _: exporter.get("/custom-metrics")[0], range(32)))
    assert statuses == [200] * 32


def test_promtool_accepts_a_scrape_with_every_scenario(
    exporter: RunningExporter, session: Session, promtool: str
) -> None:
    session("leaked").execute("SELECT pg_advisory_lock(1)")
    session("readers").execute("SELECT pg_advisory_lock_shared(2, 3)")
    in_transaction = session("xact", autocommit=False)
    in_transaction.execute("SELECT pg_advisory_xact_lock(4)")
    session('odd "name" \\ here').execute("SELECT pg_advisory_lock(5)")
    _, body = _raw(exporter.base + "/custom-metrics")
    text = body.decode()
    assert 'application_name="odd \\"name\\" \\\\ here"' in text
    result = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    in_transaction.rollback()
