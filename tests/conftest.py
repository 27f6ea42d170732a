"""Fixtures: a real PostgreSQL started by the suite, real sessions, the real exporter, and
Debian-packaged Prometheus and Alertmanager."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from exporter.embedded_postgres import (
    DEFAULT_MAJOR,
    EmbeddedPostgres,
    find_server_binaries,
    free_port,
)

PG_MAJOR = int(os.environ.get("PG_VERSION", DEFAULT_MAJOR))
MONITOR_PASSWORD = "monitor-s3cret-pw"
PLAIN_PASSWORD = "plain-s3cret-pw"


def pytest_report_header() -> str:
    return f"PostgreSQL {PG_MAJOR} (server binaries in {find_server_binaries(PG_MAJOR)})"


@pytest.fixture(scope="session")
def pg() -> Iterator[EmbeddedPostgres]:
    """One server for the suite, with a monitoring role as the README recommends."""
    server = EmbeddedPostgres(major=PG_MAJOR)
    try:
        server.start(max_connections=60, deadlock_timeout="200ms")
        try:
            with server.connect() as conn:
                conn.execute("SELECT 1")
        except psycopg.Error as exc:
            pytest.exit(f"the test PostgreSQL server does not answer: {exc}", returncode=3)
        with server.connect() as conn:
            conn.execute(f"CREATE ROLE monitor LOGIN PASSWORD '{MONITOR_PASSWORD}'")
            conn.execute("GRANT pg_read_all_stats TO monitor")
            # Every statement of the exporter's role goes to the server log, so that tests
            # can count the reads of pg_locks the database really saw.
            conn.execute("ALTER ROLE monitor SET log_statement = 'all'")
            conn.execute(f"CREATE ROLE plain LOGIN PASSWORD '{PLAIN_PASSWORD}'")
            conn.execute("CREATE DATABASE billing")
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def own_server() -> Iterator[EmbeddedPostgres]:
    """A server of this test's own, to stop, start or freeze."""
    server = EmbeddedPostgres(major=PG_MAJOR)
    try:
        server.start()
        yield server
    finally:
        server.cleanup()


@pytest.fixture(scope="session")
def monitor_dsn(pg: EmbeddedPostgres) -> str:
    return pg.dsn(user="monitor", password=MONITOR_PASSWORD)


@pytest.fixture(scope="session")
def plain_dsn(pg: EmbeddedPostgres) -> str:
    return pg.dsn(user="plain", password=PLAIN_PASSWORD)


@pytest.fixture
def session(pg: EmbeddedPostgres) -> Iterator[Callable[..., psycopg.Connection[Any]]]:
    """Open application sessions (autocommit unless asked) that close at the end of the test."""
    opened: list[psycopg.Connection[Any]] = []

    def open_session(
        application_name: str, dbname: str = "postgres", autocommit: bool = True
    ) -> psycopg.Connection[Any]:
        conn = psycopg.connect(
            pg.dsn(dbname), autocommit=autocommit, application_name=application_name
        )
        opened.append(conn)
        return conn

    yield open_session
    for conn in opened:
        conn.cancel_safe()
        conn.close()


Labels = dict[str, str]


@dataclass
class Scrape:
    """One parsed answer of /metrics."""

    text: str
    samples: list[tuple[str, Labels, float]] = field(init=False)

    def __post_init__(self) -> None:
        self.samples = [
            (s.name, dict(s.labels), s.value)
            for family in text_string_to_metric_families(self.text)
            for s in family.samples
        ]

    def find(self, name: str, **labels: str) -> list[tuple[Labels, float]]:
        return [
            (sample_labels, value)
            for sample_name, sample_labels, value in self.samples
            if sample_name == name and labels.items() <= sample_labels.items()
        ]

    def value(self, name: str, **labels: str) -> float:
        """The one sample that matches; fails the test if there are none or several."""
        found = self.find(name, **labels)
        assert len(found) == 1, f"expected one {name} with {labels}, found {found}"
        return found[0][1]

    def label_values(self, label: str) -> set[str]:
        return {labels[label] for _, labels, _ in self.samples if label in labels}


@dataclass
class RunningExporter:
    process: subprocess.Popen[str]
    port: int
    log_path: Path

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get(
        self, path: str, headers: dict[str, str] | None = None, method: str = "GET"
    ) -> tuple[int, str]:
        request = urllib.request.Request(self.base + path, headers=headers or {}, method=method)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()

    def scrape(self) -> Scrape:
        status, body = self.get("/metrics")
        assert status == 200, body
        return Scrape(body)

    def scrape_until(self, check: Callable[[Scrape], bool], timeout: float = 20.0) -> Scrape:
        """Scrape until `check` holds; fail with the last scrape if it never does."""
        deadline = time.monotonic() + timeout
        while True:
            scrape = self.scrape()
            if check(scrape):
                return scrape
            if time.monotonic() > deadline:
                pytest.fail(f"condition not met within {timeout}s; last scrape:\n{scrape.text}")
            time.sleep(0.2)

    def log(self) -> str:
        return self.log_path.read_text()


@pytest.fixture
def start_exporter(tmp_path: Path) -> Iterator[Callable[..., RunningExporter]]:
    """Run the real `pg-advisory-exporter` command; it is stopped when the test ends."""
    running: list[RunningExporter] = []

    def start(
        *args: str, config: dict[str, Any] | None = None, env: dict[str, str] | None = None
    ) -> RunningExporter:
        port = free_port()
        command = [sys.executable, "-m", "exporter", "--web.listen-address", f"127.0.0.1:{port}"]
        if config is not None:
            config_path = tmp_path / f"config-{port}.yaml"
            config_path.write_text(yaml.safe_dump(config))
            command += ["--config.file", str(config_path)]
        log_path = tmp_path / f"exporter-{port}.log"
        process = subprocess.Popen(
            [*command, *args],
            stdout=log_path.open("w"),
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **(env or {})},
        )
        exporter = RunningExporter(process, port, log_path)
        running.append(exporter)
        deadline = time.monotonic() + 15
        while True:
            if process.poll() is not None:
                pytest.fail(f"exporter exited with {process.returncode}:\n{exporter.log()}")
            try:
                exporter.get("/")
                return exporter
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"exporter did not start listening:\n{exporter.log()}")
                time.sleep(0.1)

    yield start
    for exporter in running:
        exporter.process.terminate()
        exporter.process.wait(timeout=15)


@pytest.fixture
def one_target() -> Callable[..., dict[str, Any]]:
    """A config file with one target; short intervals so tests see changes at once."""

    def config(dsn: str, name: str = "main", **collection: Any) -> dict[str, Any]:
        return {
            "collection": {"min_interval": "1ms", "reconnect_backoff_max": "1s", **collection},
            "targets": [{"name": name, "dsn": dsn}],
        }

    return config


@pytest.fixture
def start_service(tmp_path: Path) -> Iterator[Callable[..., int]]:
    """Start a Debian-packaged server on 127.0.0.1; it is stopped when the test ends."""
    processes: list[subprocess.Popen[bytes]] = []

    def start(binary: str, *args: str, ready_path: str) -> int:
        path = shutil.which(binary)
        assert path, f"{binary} is not installed (the test command installs it)"
        port = free_port()
        log = (tmp_path / f"{binary}.log").open("wb")
        process = subprocess.Popen(
            [path, f"--web.listen-address=127.0.0.1:{port}", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
        )
        processes.append(process)
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}{ready_path}", timeout=2)
                return port
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(
                        f"{binary} did not start:\n{(tmp_path / f'{binary}.log').read_text()}"
                    )
                time.sleep(0.2)

    yield start
    for process in processes:
        process.terminate()
        process.wait(timeout=15)


@pytest.fixture
def exporter(
    start_exporter: Callable[..., RunningExporter],
    one_target: Callable[..., dict[str, Any]],
    monitor_dsn: str,
) -> RunningExporter:
    """The exporter watching the suite's server as the monitoring role; tests may override."""
    return start_exporter(config=one_target(monitor_dsn))


@dataclass
class SilentServer:
    """A port that accepts connections and never answers, like a hung server."""

    port: int
    accepted: list[socket.socket]  # every connection made to it


@pytest.fixture
def silent_server() -> Iterator[SilentServer]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    sock.settimeout(0.1)
    server = SilentServer(sock.getsockname()[1], [])
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                server.accepted.append(sock.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server
    stop.set()
    thread.join()
    for conn in server.accepted:
        conn.close()
    sock.close()
