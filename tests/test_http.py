"""The HTTP endpoints, content negotiation, and promtool's verdict on a real scrape."""

from __future__ import annotations

import gzip
import json
import socket
import subprocess
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from support import (
    REFUSED_DSN,
    OneTarget,
    RunningExporter,
    Scrape,
    Session,
    StartExporter,
    wait_until,
)

# Version-independent (tests/conftest.py): the HTTP surface.
pytestmark = pytest.mark.any_version


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
    assert 'href="/locks?target=orders-db"' in page
    assert "127.0.0.1" not in page
    assert "monitor" not in page


def test_health_reports_the_last_collection(exporter: RunningExporter) -> None:
    status, body = exporter.get("/health")
    assert status == 200
    report = json.loads(body)
    assert report["status"] == "not yet collected"  # not "ok": nothing is known yet
    assert report["targets"][0]["collected"] is False
    assert report["targets"][0]["last_collection_unix"] is None
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
    exporter: RunningExporter, session: Session, each_promtool: str
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
        [each_promtool, "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    in_transaction.rollback()


def test_reload_over_http_needs_the_lifecycle_flag(start_exporter: StartExporter) -> None:
    closed = start_exporter("--dsn", REFUSED_DSN)
    status, body = closed.get("/-/reload", method="POST")
    assert status == 403
    assert "--web.enable-lifecycle" in body
    config = {"targets": [{"name": "a", "dsn": REFUSED_DSN}]}
    opened = start_exporter("--web.enable-lifecycle", config=config)
    assert opened.get("/-/reload", method="POST") == (200, "reloaded\n")
    assert opened.get("/-/reload")[0] == 405
    # A page elsewhere cannot make a visitor's browser reload it; the landing page's origin can.
    status, body = opened.get("/-/reload", {"Origin": "https://evil.example"}, method="POST")
    assert status == 403
    assert "evil.example" in body
    own = {"Origin": f"http://127.0.0.1:{opened.port}"}
    assert opened.get("/-/reload", own, method="POST") == (200, "reloaded\n")


def test_liveness_and_readiness_never_depend_on_a_database(start_exporter: StartExporter) -> None:
    exporter = start_exporter("--dsn", REFUSED_DSN)
    assert exporter.scrape().value("pg_advisory_up", target="default") == 0
    assert exporter.get("/health")[0] == 503  # the per-target report says the truth
    assert exporter.get("/-/healthy") == (200, "OK\n")
    assert exporter.get("/-/ready") == (200, "OK\n")


def _raw_request(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


def test_methods_head_has_no_body_and_the_rest_get_405(start_exporter: StartExporter) -> None:
    exporter = start_exporter("--dsn", REFUSED_DSN)
    for path in ("/", "/metrics", "/health", "/-/healthy", "/locks?target=default"):
        answer = _raw_request(exporter.port, f"HEAD {path} HTTP/1.0\r\n\r\n".encode())
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.0 200") or head.startswith(b"HTTP/1.0 503"), head
        assert body == b"", path
    for method, path, allowed in (
        ("DELETE", "/", "GET, HEAD"),
        ("BREW", "/health", "GET, HEAD"),
        ("POST", "/metrics", "GET, HEAD"),
        ("POST", "/locks?target=default", "GET, HEAD"),
        ("GET", "/-/reload", "POST"),
    ):
        status, _ = exporter.get(path, method=method)
        assert status == 405, (method, path)
        answer = _raw_request(exporter.port, f"{method} {path} HTTP/1.0\r\n\r\n".encode())
        assert f"Allow: {allowed}".encode() in answer


@pytest.mark.skipif(not socket.has_dualstack_ipv6(), reason="this host has no IPv6")
def test_the_default_address_serves_ipv4_and_ipv6(start_exporter: StartExporter) -> None:
    exporter = start_exporter("--dsn", REFUSED_DSN, host="")
    for host in ("127.0.0.1", "[::1]"):
        with urllib.request.urlopen(f"http://{host}:{exporter.port}/-/healthy", timeout=10) as r:
            assert r.status == 200


def test_sigterm_ends_the_exporter_without_waiting_for_a_poll(
    start_exporter: StartExporter,
) -> None:
    exporter = start_exporter("--dsn", REFUSED_DSN)
    # Right after a request the server waits anew for the next one: a loop that looked for
    # a shutdown only between waits of 0.5 s (the standard one) would need all of them.
    assert exporter.get("/-/healthy")[0] == 200
    started = time.monotonic()
    exporter.process.terminate()
    assert exporter.process.wait(timeout=15) == 0
    elapsed = time.monotonic() - started
    # About 0.04 s here, the interpreter's exit included; the bound leaves ten times that.
    assert elapsed < 0.4, f"SIGTERM took {elapsed:.2f} s\n{exporter.log()}"
    assert "shutting down" in exporter.log()


def test_the_access_log_leaves_out_query_strings(start_exporter: StartExporter) -> None:
    exporter = start_exporter("--dsn", REFUSED_DSN, "--log.level", "debug")
    secret = "pr0be-s3cret"
    query = f"target=db.internal%20password%3D{secret}&auth_module=fleet"
    status, _ = exporter.get(f"/probe?{query}")
    assert status >= 400
    assert exporter.get("/-/healthy")[0] == 200

    def logged() -> bool:
        return "/-/healthy" in exporter.log()

    wait_until(logged, 5, lambda: f"the access log line:\n{exporter.log()}")
    log = exporter.log()
    assert secret not in log
    assert f"GET /probe {status}" in log
