"""What a real Prometheus records of the exporter, scraping it with its default settings: the
formats it asks for, the content types it is answered with, and every series of /metrics and
/probe, as the exporter's own page shows them."""

from __future__ import annotations

import math
import threading
import urllib.parse
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families
from support import (
    OneTarget,
    RunningExporter,
    Session,
    StartExporter,
    StartService,
    block_on,
    load_yaml,
    prometheus_query,
    start_prometheus,
    wait_until,
)

from devtools.embedded_postgres import EmbeddedPostgres, free_port

# Version-independent (tests/conftest.py): the HTTP surface and Prometheus.
pytestmark = pytest.mark.any_version

ROOT = Path(__file__).parent.parent

# The Accept header of Prometheus 3.5 with its default scrape_protocols (OpenMetricsText1.0.0,
# OpenMetricsText0.0.1, PrometheusText1.0.0, PrometheusText0.0.4) and UTF-8 names allowed;
# test_prometheus_3_asks_for_this checks it against the real one.
PROMETHEUS_3_ACCEPT = (
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,"
    "application/openmetrics-text;version=0.0.1;q=0.5,"
    "text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,"
    "text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
)
# Debian 12's Prometheus 2.42, for comparison: the exporter answers both.
PROMETHEUS_2_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
    "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"
# What each Accept header is answered with (the start of the Content-Type). A Prometheus 3
# fails a scrape whose Content-Type it does not know (no fallback_scrape_protocol is set by
# default), and parses the answer by it.
NEGOTIATED = [
    ("prometheus 3", PROMETHEUS_3_ACCEPT, OPENMETRICS),
    ("prometheus 2.42", PROMETHEUS_2_ACCEPT, OPENMETRICS),
    ("openmetrics 1.0.0", "application/openmetrics-text;version=1.0.0", OPENMETRICS),
    ("text 1.0.0", "text/plain;version=1.0.0", "text/plain; version=1.0.0; charset=utf-8"),
    ("text 0.0.4", "text/plain;version=0.0.4", "text/plain; version=0.0.4; charset=utf-8"),
    ("any", "*/*", "text/plain; version=0.0.4; charset=utf-8"),
    ("none", "", "text/plain; version=0.0.4; charset=utf-8"),
]
# Series of Prometheus' own about each scrape, not the exporter's.
SCRAPE_SERIES = {
    "up", "scrape_duration_seconds", "scrape_samples_scraped",
    "scrape_samples_post_metric_relabeling", "scrape_series_added",
}  # fmt: skip

Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


class _Recorder(BaseHTTPRequestHandler):
    """Answers every GET with one gauge, in the text format, keeping its request headers."""

    seen: list[dict[str, str]]

    def do_GET(self) -> None:
        self.seen.append(dict(self.headers))
        body = b"# TYPE recorded gauge\nrecorded 1\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def recorder() -> Iterator[tuple[int, list[dict[str, str]]]]:
    """An HTTP server that keeps the headers of each request it is sent: its port, and them."""
    seen: list[dict[str, str]] = []
    handler = type("Recorder", (_Recorder,), {"seen": seen})
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], seen
    server.shutdown()
    server.server_close()


def test_prometheus_3_asks_for_this(
    recorder: tuple[int, list[dict[str, str]]], start_service: StartService, tmp_path: Path
) -> None:
    port, seen = recorder
    config = {
        "global": {"scrape_interval": "1s"},
        "scrape_configs": [
            {"job_name": "recorded", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}
        ],
    }
    start_prometheus(start_service, tmp_path, config)
    wait_until(lambda: bool(seen), 30, "a scrape by Prometheus")
    agent = seen[0]["User-Agent"]  # Prometheus/3.5.3+ds1
    assert agent.startswith("Prometheus/3.")
    assert seen[0]["Accept"] == PROMETHEUS_3_ACCEPT
    # The chart and the docs name the Prometheus the tests ran.
    version = agent.removeprefix("Prometheus/").split("+")[0]
    chart = load_yaml((ROOT / "deploy/helm/pg-advisory-exporter/Chart.yaml").read_text())
    assert chart["annotations"]["prometheus-tested"] == version
    assert f"Prometheus 3.5 ({version})" in (ROOT / "docs" / "alerting.md").read_text()


@pytest.fixture
def exporter(
    pg: EmbeddedPostgres,
    start_exporter: StartExporter,
    one_target: OneTarget,
    monitor_dsn: str,
    session: Session,
) -> RunningExporter:
    """The exporter with series of many kinds: holders idle and in a transaction, a waiter
    behind shared holders, an infinity (no idle_in_transaction_session_timeout). Its
    collections are shared for an hour, so that every scrape (Prometheus' and the test's own)
    answers the same values."""
    session("leaked").execute("SELECT pg_advisory_lock(1)")
    session("readers").execute("SELECT pg_advisory_lock_shared(2, 3)")
    in_transaction = session("xact", autocommit=False)
    in_transaction.execute("SELECT pg_advisory_xact_lock(4)")
    block_on(pg, session("rebalancer"), "SELECT pg_advisory_lock(2, 3)")
    config = one_target(monitor_dsn, min_interval="1h")
    return start_exporter(config=config)


def _get(url: str, accept: str) -> tuple[str, str]:
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.headers["Content-Type"], response.read().decode()


@pytest.mark.parametrize("path", ["/metrics", "/probe?target=main"])
@pytest.mark.parametrize(
    ("accept", "content_type"), [c[1:] for c in NEGOTIATED], ids=[c[0] for c in NEGOTIATED]
)
def test_each_format_is_answered_with_its_content_type(
    exporter: RunningExporter, path: str, accept: str, content_type: str
) -> None:
    answered, body = _get(exporter.base + path, accept)
    assert answered.startswith(content_type), answered
    if content_type == OPENMETRICS:
        assert ("pg_advisory_up", frozenset({("target", "main")}), 1.0) in _samples(body)
    else:
        assert "# EOF" not in body
        assert 'pg_advisory_up{target="main"} 1.0' in body.splitlines()


def _samples(page: str) -> list[tuple[str, frozenset[tuple[str, str]], float]]:
    """The samples of an OpenMetrics page (which must end with `# EOF`)."""
    return [
        (sample.name, frozenset(sample.labels.items()), sample.value)
        for family in text_string_to_metric_families(page)  # type: ignore[no-untyped-call]
        for sample in family.samples
    ]


def _recorded(prometheus: int, job: str) -> Series:
    """The series Prometheus has of this job now, by name and the exporter's labels."""
    recorded: Series = {}
    for found in prometheus_query(prometheus, f'{{job="{job}"}}'):
        labels = dict(found["metric"])
        name = labels.pop("__name__")
        if name in SCRAPE_SERIES:
            continue
        del labels["job"], labels["instance"]
        recorded[name, frozenset(labels.items())] = float(found["value"][1])
    return recorded


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def _difference(expected: Series, recorded: Series) -> str:
    missing = sorted(name for name, _ in expected.keys() - recorded.keys())
    extra = sorted(name for name, _ in recorded.keys() - expected.keys())
    return f"not recorded: {missing}; recorded but not on the page: {extra}"


def _records_the_page(prometheus: int, job: str, url: str) -> None:
    """Prometheus has, of `job`, each series of the page at `url` with its value, and no
    other (process_* values change between two scrapes: their names and labels count)."""
    page = _samples(_get(url, PROMETHEUS_3_ACCEPT)[1])
    expected = {(name, labels): value for name, labels, value in page}
    assert len(expected) == len(page)  # no sample twice
    recorded: Series = {}

    def caught_up() -> bool:
        recorded.clear()
        recorded.update(_recorded(prometheus, job))
        return recorded.keys() == expected.keys()

    wait_until(caught_up, 30, lambda: f"{job}: {_difference(expected, recorded)}", 0.5)
    assert {
        key: (value, recorded[key])
        for key, value in expected.items()
        if not key[0].startswith("process_") and not _same(value, recorded[key])
    } == {}


def test_prometheus_3_with_its_defaults_records_every_series_of_the_page(
    exporter: RunningExporter, start_service: StartService, tmp_path: Path
) -> None:
    paths = {"pg-advisory-exporter": ("/metrics", {}), "probe": ("/probe", {"target": "main"})}
    target = {"static_configs": [{"targets": [f"127.0.0.1:{exporter.port}"]}]}
    config = {
        "global": {"scrape_interval": "1s"},  # else its defaults: formats, names, timeouts
        "scrape_configs": [
            {"job_name": job, "metrics_path": path, "params": {k: [v] for k, v in query.items()},
             **target}
            for job, (path, query) in paths.items()
        ],
    }  # fmt: skip
    prometheus = start_prometheus(start_service, tmp_path, config)
    for job, (path, query) in paths.items():
        _records_the_page(prometheus, job, f"{exporter.base}{path}?{urllib.parse.urlencode(query)}")
