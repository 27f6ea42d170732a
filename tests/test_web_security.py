"""The exporter behind its web configuration: TLS, basic auth and headers on every endpoint,
certificates and users reloaded without a restart, client certificates held to their SANs,
and a real Prometheus scraping it."""

from __future__ import annotations

import json
import logging
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import bcrypt
import pytest
import yaml
from support import (
    REFUSED_DSN,
    Cli,
    RunningExporter,
    StartExporter,
    StartService,
    Tls,
    basic_auth,
    start_prometheus,
    wait_until,
)

from pg_advisory_exporter.http.server import serve
from pg_advisory_exporter.http.web_access import CHALLENGE, WebAccess, certificate_sans
from pg_advisory_exporter.http.web_config import read_web_config

PASSWORD = "scrape-Pw-7f3e"
# How a client sees a TLS connection the exporter refused or closed.
REFUSED = (ConnectionError, ssl.SSLError, urllib.error.URLError)
# Every endpoint of the exporter, none left open.
READ_PATHS = [
    "/metrics",
    "/probe?target=default",
    "/locks?target=default",
    "/",
    "/health",
    "/-/healthy",
    "/-/ready",
]

Answer = tuple[int, Mapping[str, str], str]


def _hash(password: str) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(4)).decode()


def _web_file(tls: Tls, password: str = PASSWORD, client_auth: str = "") -> Path:
    tls_config: dict[str, str] = {"cert_file": "server.pem", "key_file": "server-key.pem"}
    if client_auth:
        tls_config.update(client_auth_type=client_auth, client_ca_file="ca.pem")
    path = tls.folder / "web.yml"
    path.write_text(
        yaml.safe_dump(
            {
                "tls_server_config": tls_config,
                "basic_auth_users": {"prometheus": _hash(password)},
                "http_server_config": {"headers": {"X-Frame-Options": "deny"}},
            }
        )
    )
    return path


def _start(start_exporter: StartExporter, web_file: Path, *args: str) -> RunningExporter:
    return start_exporter("--dsn", REFUSED_DSN, "--web.config.file", str(web_file), *args)


def _request(
    exporter: RunningExporter,
    path: str,
    context: ssl.SSLContext | None,
    headers: Mapping[str, str] | None = None,
    method: str = "GET",
    scheme: str = "https",
) -> Answer:
    url = f"{scheme}://127.0.0.1:{exporter.port}{path}"
    request = urllib.request.Request(url, headers=dict(headers or {}), method=method)
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            return response.status, dict(response.headers), response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read().decode()


def _served_certificate(exporter: RunningExporter, tls: Tls) -> bytes:
    with (
        socket.create_connection(("127.0.0.1", exporter.port), timeout=10) as raw,
        tls.client().wrap_socket(raw, server_hostname="127.0.0.1") as conn,
    ):
        certificate = conn.getpeercert(binary_form=True)
    assert certificate is not None
    return certificate


@pytest.fixture
def secured(start_exporter: StartExporter, tls: Tls) -> RunningExporter:
    return _start(start_exporter, _web_file(tls))


def test_every_endpoint_asks_for_the_password(secured: RunningExporter, tls: Tls) -> None:
    client = tls.client()
    right = basic_auth("prometheus", PASSWORD)
    for path in READ_PATHS:
        for headers in ({}, basic_auth("prometheus", "wrong"), basic_auth("nobody", PASSWORD)):
            status, answer_headers, body = _request(secured, path, client, headers)
            assert (status, body) == (401, "Unauthorized\n"), (path, headers)
            assert answer_headers["WWW-Authenticate"] == CHALLENGE
            assert answer_headers["X-Frame-Options"] == "deny"
        status, answer_headers, body = _request(secured, path, client, right)
        assert status != 401, path
        assert answer_headers["X-Frame-Options"] == "deny"
    assert _request(secured, "/metrics", client, right)[2].count("pg_advisory_up") >= 1
    assert _request(secured, "/-/reload", client, method="POST")[0] == 401
    status, _, body = _request(secured, "/-/reload", client, right, method="POST")
    assert status == 403  # authenticated, and still off without --web.enable-lifecycle
    assert "--web.enable-lifecycle" in body


def test_the_lifecycle_flag_opens_reload_to_authenticated_clients(
    start_exporter: StartExporter, tls: Tls
) -> None:
    exporter = start_exporter(
        "--web.config.file",
        str(_web_file(tls)),
        "--web.enable-lifecycle",
        config={"targets": [{"name": "default", "dsn": REFUSED_DSN}]},
    )
    client = tls.client()
    assert _request(exporter, "/-/reload", client, method="POST")[0] == 401
    right = basic_auth("prometheus", PASSWORD)
    assert _request(exporter, "/-/reload", client, right, method="POST")[:3:2] == (
        200,
        "reloaded\n",
    )


def test_plain_http_to_the_tls_port_fails(secured: RunningExporter) -> None:
    # The server reads a ClientHello that is not one, and hangs up.
    with pytest.raises((ConnectionError, urllib.error.URLError)):
        _request(secured, "/-/healthy", None, scheme="http")


def test_a_client_certificate_is_required_when_configured(
    start_exporter: StartExporter, tls: Tls
) -> None:
    exporter = _start(start_exporter, _web_file(tls, client_auth="RequireAndVerifyClientCert"))
    right = basic_auth("prometheus", PASSWORD)
    with pytest.raises(REFUSED):
        _request(exporter, "/-/healthy", tls.client(certificate=False), right)
    assert _request(exporter, "/-/healthy", tls.client(certificate=True), right)[0] == 200


def test_certificates_and_users_change_without_a_restart(
    secured: RunningExporter, tls: Tls
) -> None:
    first = _served_certificate(secured, tls)
    assert first == ssl.PEM_cert_to_DER_cert(tls.cert_file.read_text())
    rotated = tls.rotate()
    assert rotated != first
    wait_until(lambda: _served_certificate(secured, tls) == rotated, 10, "the new certificate")

    _web_file(tls, password="the-new-one")
    client = tls.client()
    wait_until(
        lambda: (
            _request(secured, "/-/healthy", client, basic_auth("prometheus", "the-new-one"))[0]
            == 200
        ),
        10,
        "the new password accepted",
    )
    assert _request(secured, "/-/healthy", client, basic_auth("prometheus", PASSWORD))[0] == 401
    assert secured.process.poll() is None
    assert "web configuration reloaded" in secured.log()


def test_a_change_that_cannot_be_loaded_keeps_the_last_configuration(
    secured: RunningExporter, tls: Tls
) -> None:
    web_file = tls.folder / "web.yml"
    good = web_file.read_text()
    web_file.write_text(good + "tls_server_config: {min_version: TLS14}\n")
    client, right = tls.client(), basic_auth("prometheus", PASSWORD)
    assert _request(secured, "/-/healthy", client, right)[0] == 200
    assert _request(secured, "/-/healthy", client)[0] == 401
    wait_until(lambda: "web configuration not reloaded" in secured.log(), 10, "the error logged")
    assert f"{web_file}: " in secured.log()


def test_a_bad_web_config_exits_2_with_a_located_message(cli: Cli, tls: Tls) -> None:
    web_file = tls.folder / "web.yml"
    web_file.write_text("tls_server_config:\n  cert_file: server.pem\n  min_version: TLS14\n")
    result = cli("--dsn", REFUSED_DSN, "--web.config.file", str(web_file))
    assert result.returncode == 2
    assert f"{web_file}: tls_server_config.min_version: unknown TLS version" in result.stderr
    checked = cli("--dsn", REFUSED_DSN, "--web.config.file", str(_web_file(tls)), "--config.check")
    assert checked.returncode == 0, checked.stderr
    assert "web configuration is valid: TLS on, 1 basic auth user(s), 1 header(s)" in checked.stdout


def test_failed_logins_leave_no_password_in_the_log(
    start_exporter: StartExporter, tls: Tls
) -> None:
    exporter = _start(start_exporter, _web_file(tls), "--log.level", "debug")
    client = tls.client()
    for password in ("Wr0ng-Secret-1", PASSWORD):
        _request(exporter, "/metrics", client, basic_auth("prometheus", password))
    log = exporter.log()
    for secret in ("Wr0ng-Secret-1", PASSWORD):
        assert secret not in log


def _prometheus_targets(port: int) -> dict[str, dict[str, str]]:
    """Each scrape job's target health and last error, from Prometheus's API."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/targets", timeout=10) as answer:
        active = json.load(answer)["data"]["activeTargets"]
    return {t["labels"]["job"]: {"health": t["health"], "error": t["lastError"]} for t in active}


def test_a_real_prometheus_scrapes_over_tls_with_basic_auth(
    secured: RunningExporter, tls: Tls, start_service: StartService, tmp_path: Path
) -> None:
    def job(name: str, password: str) -> dict[str, object]:
        return {
            "job_name": name,
            "scheme": "https",
            "basic_auth": {"username": "prometheus", "password": password},
            "tls_config": {"ca_file": str(tls.ca_file)},
            "static_configs": [{"targets": [f"127.0.0.1:{secured.port}"]}],
        }

    port = start_prometheus(
        start_service,
        tmp_path,
        {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
            "scrape_configs": [
                job("pg-advisory-exporter", PASSWORD),
                job("wrong-password", "guess"),
            ],
        },
    )
    targets: list[dict[str, dict[str, str]]] = []

    def both_scraped() -> bool:
        targets[:] = [_prometheus_targets(port)]
        return all(t["health"] != "unknown" for t in targets[0].values()) and len(targets[0]) == 2

    wait_until(both_scraped, 30, lambda: f"both jobs scraped: {targets}", 0.5)
    assert targets[0]["pg-advisory-exporter"] == {"health": "up", "error": ""}
    assert targets[0]["wrong-password"]["health"] == "down"
    assert "401" in targets[0]["wrong-password"]["error"]


def test_a_burst_of_100_scrapes_waits_for_no_tcp_retry(start_exporter: StartExporter) -> None:
    """With the old listen backlog of 5, a burst overflowed the queue: Linux drops the SYNs it
    cannot queue, and the client sends them again after one second."""
    exporter = start_exporter("--dsn", REFUSED_DSN)
    url = f"http://127.0.0.1:{exporter.port}/metrics"

    def timed(_: int) -> float:
        started = time.monotonic()
        with urllib.request.urlopen(url, timeout=30) as answer:
            answer.read()
        return time.monotonic() - started

    timed(0)  # the first collection, out of the burst
    with ThreadPoolExecutor(100) as pool:
        seconds = sorted(pool.map(timed, range(100)))
    assert seconds[-1] < 1.0, f"slowest {seconds[-1]:.2f}s, p95 {seconds[94]:.2f}s"


def test_sans_are_spelled_as_go_spells_them() -> None:
    # What Python's ssl gives for each kind (IPv6 in full, upper case) and what Go's
    # crypto/x509 would have made of it, which the list in the file is written against.
    certificate = {
        "subjectAltName": (
            ("DNS", "prometheus.monitoring.svc"),
            ("IP Address", "10.0.0.7"),
            ("IP Address", "2001:DB8:0:0:0:0:0:1\n"),
            ("IP Address", "0:0:0:0:0:FFFF:A00:7"),
            ("IP Address", "<invalid>"),
            ("email", "prometheus@example.com"),
            ("URI", "spiffe://cluster.local/ns/monitoring/sa/prometheus"),
            ("othername", "<unsupported>"),
            ("DirName", ((("commonName", "x"),),)),
        )
    }
    assert certificate_sans(certificate) == [
        "prometheus.monitoring.svc",
        "10.0.0.7",
        "2001:db8::1",
        "10.0.0.7",
        "prometheus@example.com",
        "spiffe://cluster.local/ns/monitoring/sa/prometheus",
    ]


def _sans_file(tls: Tls, *allowed: str) -> Path:
    path = tls.folder / "web.yml"
    tls_config: dict[str, object] = {
        "cert_file": "server.pem",
        "key_file": "server-key.pem",
        "client_auth_type": "RequireAndVerifyClientCert",
        "client_ca_file": "ca.pem",
    }
    if allowed:
        tls_config["client_allowed_sans"] = list(allowed)
    config = {"tls_server_config": tls_config}
    beside = path.with_suffix(".new")  # renamed over: a reload sees it whole
    beside.write_text(yaml.safe_dump(config))
    beside.rename(path)
    return path


def _hello(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"hello\n"]


@pytest.fixture
def sans_server(tls: Tls) -> Iterator[tuple[str, WebAccess]]:
    """The exporter's HTTP server in this process, over mutual TLS, admitting only client
    certificates with the SAN prometheus.monitoring.svc or 10.0.0.7; its base URL."""
    access = WebAccess(read_web_config(_sans_file(tls, "prometheus.monitoring.svc", "10.0.0.7")))
    server = serve(_hello, "127.0.0.1", 0, access)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"https://127.0.0.1:{server.server_address[1]}/", access
    server.shutdown()
    server.server_close()


def _hello_with(url: str, context: ssl.SSLContext) -> str:
    with urllib.request.urlopen(url, timeout=10, context=context) as answer:
        return str(answer.read().decode())


def test_only_a_client_certificate_with_an_allowed_san_is_served(
    sans_server: tuple[str, WebAccess], tls: Tls, caplog: pytest.LogCaptureFixture
) -> None:
    url, _ = sans_server
    by_name = tls.client_cert("by-name", "prometheus.monitoring.svc")
    by_address = tls.client_cert("by-address", "10.0.0.7", "other.example")
    assert _hello_with(url, tls.client(by_name)) == "hello\n"
    assert _hello_with(url, tls.client(by_address)) == "hello\n"
    with caplog.at_level(logging.WARNING, logger="pg_advisory_exporter.http.web_access"):
        for intruder in (
            tls.client_cert("intruder", "grafana.monitoring.svc", "10.0.0.8"),
            tls.client_file,  # the e-mail address prometheus@example.com only
        ):
            for _ in range(3):  # closed before any request is read; said once, not each time
                with pytest.raises(REFUSED):
                    _hello_with(url, tls.client(intruder))
        with pytest.raises(REFUSED):  # and no certificate at all: the handshake fails
            _hello_with(url, tls.client(False))
    refused = [r for r in caplog.records if "client_allowed_sans" in r.getMessage()]
    assert [getattr(r, "sans", None) for r in refused] == [
        "grafana.monitoring.svc, 10.0.0.8",
        "prometheus@example.com",
    ]
    assert all(getattr(r, "client", None) == "127.0.0.1" for r in refused)


def test_a_reload_changes_the_allowed_sans_but_cannot_remove_them(
    sans_server: tuple[str, WebAccess], tls: Tls
) -> None:
    url, access = sans_server
    grafana = tls.client(tls.client_cert("grafana", "grafana.monitoring.svc"))
    with pytest.raises(REFUSED):
        _hello_with(url, grafana)
    _sans_file(tls, "grafana.monitoring.svc")
    assert _hello_with(url, grafana) == "hello\n"
    _sans_file(tls)
    by_name = tls.client(tls.client_cert("by-name", "prometheus.monitoring.svc"))
    with pytest.raises(REFUSED):  # every verified client would be let in: refused
        _hello_with(url, by_name)
    assert not access.last_reload_successful
    assert _hello_with(url, grafana) == "hello\n"


def _san_file_inline(tls: Tls, allowed: str) -> Path:
    """Everything inline (certificate, key, client CA), allowed SANs and a rate limit."""
    config = {
        "tls_server_config": {
            "cert": tls.cert_file.read_text(),
            "key": tls.key_file.read_text(),
            "client_auth_type": "RequireAndVerifyClientCert",
            "client_ca": tls.ca_file.read_text(),
            "client_allowed_sans": [allowed],
        },
        "rate_limit": {"interval": "1s", "burst": 100},
    }
    path = tls.folder / "web-inline.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_the_check_of_an_inline_file_names_what_it_enforces_and_no_key(cli: Cli, tls: Tls) -> None:
    checked = cli(
        "--dsn", REFUSED_DSN, "--web.config.file", str(_san_file_inline(tls, "x")), "--config.check"
    )
    assert checked.returncode == 0, checked.stderr
    assert (
        "web configuration is valid: TLS on, client certificates required with one of 1 allowed "
        "SAN(s), 0 basic auth user(s), 0 header(s), rate limit of 100 request(s) then one per 1s"
    ) in checked.stdout
    key_line = tls.key_file.read_text().splitlines()[1]
    assert key_line not in checked.stdout + checked.stderr


def test_a_real_prometheus_scrapes_over_mutual_tls_with_an_allowed_san(
    start_exporter: StartExporter, tls: Tls, start_service: StartService, tmp_path: Path
) -> None:
    exporter = start_exporter(
        "--dsn",
        REFUSED_DSN,
        "--web.config.file",
        str(_san_file_inline(tls, "prometheus.monitoring.svc")),
    )

    def job(name: str, *identities: str) -> dict[str, object]:
        certificate = tls.client_cert(name, *identities)
        return {
            "job_name": name,
            "scheme": "https",
            "tls_config": {
                "ca_file": str(tls.ca_file),
                "cert_file": str(certificate),
                "key_file": str(tls.folder / f"{name}-key.pem"),
            },
            "static_configs": [{"targets": [f"127.0.0.1:{exporter.port}"]}],
        }

    port = start_prometheus(
        start_service,
        tmp_path,
        {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
            "scrape_configs": [
                job("allowed", "prometheus.monitoring.svc"),
                job("other-san", "grafana.monitoring.svc"),
            ],
        },
    )
    targets: list[dict[str, dict[str, str]]] = []

    def both_scraped() -> bool:
        targets[:] = [_prometheus_targets(port)]
        return len(targets[0]) == 2 and all(t["health"] != "unknown" for t in targets[0].values())

    wait_until(both_scraped, 30, lambda: f"both jobs scraped: {targets}", 0.5)
    assert targets[0]["allowed"] == {"health": "up", "error": ""}
    assert targets[0]["other-san"]["health"] == "down"
    log = exporter.log()
    assert "TLS client refused" in log
    assert "grafana.monitoring.svc" in log
    assert "BEGIN PRIVATE KEY" not in log
