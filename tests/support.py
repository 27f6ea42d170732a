"""What the tests share besides fixtures: waiting for a condition, running the real command,
scraping the exporter, configuration files, the server's statement log, and the types of the
fixtures in conftest.py."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import psycopg
import pytest
import trustme
import yaml
from prometheus_client.parser import text_string_to_metric_families
from psycopg.rows import TupleRow

from devtools.debian_sid import InstallError, prometheus_binary
from devtools.embedded_postgres import DEFAULT_MAJOR, EmbeddedPostgres
from pg_advisory_exporter.collect.capacity import CapacitySettings
from pg_advisory_exporter.collect.dead_client import ReleaseSettings
from pg_advisory_exporter.collect.kept_connection import APPLICATION_NAME
from pg_advisory_exporter.collect.snapshot import BackendLocks, ServerSnapshot
from pg_advisory_exporter.config import loader, settings
from pg_advisory_exporter.forensics.model import Backend, LockEntry
from pg_advisory_exporter.keys.derive import local_parts

PG_MAJOR = int(os.environ.get("PG_VERSION", DEFAULT_MAJOR))
MONITOR_PASSWORD = "monitor-s3cret-pw"
PLAIN_PASSWORD = "plain-s3cret-pw"
# The suite's server's log_line_prefix: each record's SQLSTATE, user, database, application.
SUITE_LOG_PREFIX = "%m [%p] %q%e %u@%d %a "

# A server that configurations name and nothing connects to: db.example never resolves.
EXAMPLE_DSN = "postgresql://monitor@db.example:5432/postgres"
# A server that is down: port 1 of loopback (tcpmux), which no machine of the suite serves,
# refuses at once. For the exporter's daemon and command, whose tests are about something
# else (HTTP, messages); a unit test reaches no port it did not bind (tests/conftest.py).
REFUSED_DSN = "host=127.0.0.1 port=1 user=monitor dbname=postgres"

# The key registry that docs/configuration.md documents: one entry of every form.
REGISTRY: list[dict[str, Any]] = [
    {"name": "reward_points_cron", "text": "cron:recalc-reward-points", "hash": "hashtextextended",
     "max_hold": "10m"},
    {"name": "nightly_billing", "key": 7310001, "max_hold": "2h"},
    {"name": "billing_nightly_md5", "text": "billing:nightly", "hash": "md5"},
    {"name": "account_rebalance", "namespace": 2001},
    {"name": "billing_leader", "key": 42, "databases": ["billing"], "long_lived": True,
     "expect_held": True},
]  # fmt: skip


# When the snapshots of the tests without a server were read (the server's now(), Unix time).
READ_AT = 1_800_000_000.0

# A snapshot as a 15.18 server with default settings reports it, for the tests that need no
# server: one idle backend holding one lock, to vary with dataclasses.replace().
IDLE = BackendLocks(
    pid=1,
    datname="app",
    application_name="billing-worker",
    state="idle",
    state_seconds=600.0,
    in_transaction=False,
    advisory_entries=1,
    share_entries=0,
    awaited_mode=None,
    wait_seconds=None,
    table_entries=1,
)


def md5_key(text: str) -> int:
    """A 64-bit key from a text, as `('x' || left(md5(text), 16))::bit(64)::bigint` makes it."""
    return local_parts("md5", text, "bigint", "big")[0]


def snapshot_of(*backends: BackendLocks) -> ServerSnapshot:
    return ServerSnapshot(
        server_version="15.18",
        server_version_num=150018,
        current_database="app",
        read_at=READ_AT,
        capacity_settings=CapacitySettings(
            max_locks_per_transaction=64,
            max_connections=100,
            autovacuum_max_workers=3,
            max_worker_processes=8,
            max_wal_senders=10,
            max_prepared_transactions=0,
        ),
        # Linux's keepalives on a TCP session, no idle timeouts: PostgreSQL's defaults.
        release_settings=ReleaseSettings(7200, 75, 9, 0, 0.0, 0.0),
        can_read_all_stats=True,
        deadlocks={"app": 3},
        lock_table_entries=sum(b.table_entries for b in backends),
        backend_table_entries_max=max((b.table_entries for b in backends), default=0),
        backends=backends,
    )


def monitor_module(tmp_path: Path, *allowed: str) -> dict[str, Any]:
    """An auth module of the suite's monitoring role (its password in a file under
    `tmp_path`), allowed these targets, as the file gives it."""
    password_file = tmp_path / "monitor-password"
    password_file.write_text(MONITOR_PASSWORD)
    return {
        "user": "monitor",
        "password_file": str(password_file),
        "options": {"sslmode": "disable"},
        "allowed_targets": list(allowed),
    }


def write_config(folder: Path, document: Config | str, name: str = "config.yaml") -> Path:
    """A configuration file in `folder`: `document` as YAML, or a string as it is."""
    path = folder / name
    path.write_text(document if isinstance(document, str) else yaml.safe_dump(document))
    return path


def load_config_file(path: Path, **flags: object) -> settings.Config:
    """The configuration the command reads from this file, with these flags (by argparse's
    names of them) and the environment."""
    return loader.load({"config_file": str(path), **flags})


def load_config(folder: Path, document: Config | str, **flags: object) -> settings.Config:
    """The configuration the command reads from `document` written in `folder` (write_config),
    with these flags and the environment."""
    return load_config_file(write_config(folder, document), **flags)


class Clock:
    """A monotonic clock that moves only when a test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@contextlib.contextmanager
def databases_on(pg: EmbeddedPostgres, names: list[str]) -> Iterator[list[str]]:
    """These databases on the server, for the test's length."""
    with pg.connect() as conn:
        for name in names:
            conn.execute(f"CREATE DATABASE {name}")
    try:
        yield names
    finally:
        with pg.connect() as conn:
            for name in names:
                conn.execute(f"DROP DATABASE {name} WITH (FORCE)")


# What the server's statement log shows of each read (the suite's server logs every statement
# of the role `monitor`): the collection's statement is the only one with its first CTE, and
# the /locks page's the only one with this one (each reads pg_locks once, in that CTE).
COLLECTION_READ = "WITH lock_groups AS ("
FORENSICS_READ = "forensic_locks AS MATERIALIZED"


def report_section(report: str, heading: str) -> str:
    """The section of a `check` text report that begins with `heading` (an indented title,
    "Holders (" say), up to the blank line that ends it."""
    return report[report.index(f"  {heading}") :].split("\n\n", maxsplit=1)[0]


class LoggedReads:
    """Counts a statement in a server's log from the moment it is made: the reads that the
    database really saw, whatever the exporter says of them."""

    def __init__(self, server: EmbeddedPostgres, statement: str = COLLECTION_READ) -> None:
        self._log = server.logfile
        self._statement = statement
        self._start = self._log.stat().st_size

    def count(self) -> int:
        with self._log.open("rb") as log:
            log.seek(self._start)
            return log.read().decode(errors="replace").count(self._statement)


@dataclass(frozen=True)
class ExporterSession:
    """A backend of the exporter's, as pg_stat_activity shows it."""

    pid: int
    datname: str
    client_port: int | None


def exporter_sessions(server: EmbeddedPostgres) -> list[ExporterSession]:
    """The backends of every exporter connected to the server (by the application name they
    all give), in pid order."""
    with server.connect() as conn:
        rows = conn.execute(
            "SELECT pid, datname, client_port FROM pg_stat_activity"
            " WHERE application_name = %s ORDER BY pid",
            (APPLICATION_NAME,),
        ).fetchall()
    return [ExporterSession(pid, datname, port) for pid, datname, port in rows]


def wait_until(
    check: Callable[[], bool], timeout: float, what: str | Callable[[], str], interval: float = 0.1
) -> None:
    """Call `check` until it returns true; fail the test if it does not within `timeout`
    seconds, saying `what` was awaited (a callable, to describe the state at that moment).
    `check` may fail the test itself when waiting longer is pointless."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout}s: {what() if callable(what) else what}")
        time.sleep(interval)


# A backend as the /locks page's read maps it: idle, outside any transaction, holding
# `locks`; for the tests that need no server, to vary with keyword fields.
BACKEND_START = datetime(2026, 1, 1, 2, 0, tzinfo=UTC)


def forensic_backend(pid: int, *locks: LockEntry, **fields: Any) -> Backend:
    base = Backend(
        pid=pid,
        datname="app",
        application_name="billing-worker",
        client_addr="10.0.0.7",
        client_port=40000 + pid,
        backend_start=BACKEND_START,
        state="idle",
        state_seconds=600.0,
        xact_start=None,
        session_level=True,
        lock_entries=len(locks),
        locks=locks,
    )
    return replace(base, **fields)


def block_on(pg: EmbeddedPostgres, waiter: psycopg.Connection[Any], sql: str) -> threading.Thread:
    """Run `sql` (a lock someone holds) on `waiter` in a thread; return once pg_locks shows
    the waiter waiting. The thread ends when the lock is granted or the session cancelled."""

    def run() -> None:
        with contextlib.suppress(psycopg.Error):  # cancelled at the end of the test
            waiter.execute(sql)

    pid = waiter.info.backend_pid
    blocked = threading.Thread(target=run, daemon=True)
    blocked.start()
    with pg.connect() as admin:

        def waiting() -> bool:
            query = "SELECT count(*) FROM pg_locks WHERE pid = %s AND NOT granted"
            return admin.execute(query, (pid,)).fetchone() == (1,)

        wait_until(waiting, 10, f"the waiter blocked on: {sql}")
    return blocked


def cli_command(*args: str) -> list[str]:
    """`pg-advisory-exporter ARGS` from this interpreter, whatever is on PATH."""
    return [sys.executable, "-m", "pg_advisory_exporter", *args]


def run_cli(
    *args: str, env: Mapping[str, str] | None = None, check: bool = False, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    """The real command in a subprocess, with these environment variables added. Tests take
    it through the `cli` fixture, which puts them in the integration tier: each run costs
    half a second of imports."""
    return subprocess.run(
        cli_command(*args),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=check,
        env={**os.environ, **(env or {})},
    )


# Thresholds as a user of the Helm chart's values or of the mixin's _config writes them (a list
# for group_labels, a duration as text or seconds) and as --set takes them (set_flags): each
# form the command accepts, so that the chart's helpers and the mixin's meet every one.
TUNED_THRESHOLDS: dict[str, Any] = {
    "leaked_lock_after": "1h30m",
    "leaked_lock_for": 90,
    "wait_after": "500ms",
    "waiters": 3,
    "lock_table_warning": 0.55,
    "lock_table_critical": 0.9,
    "backend_lock_budget": 2.5,
    "deadlocks_window": "1d",
    "deadlocks": 2,
    "exporter_job": "locks",
    "selector": 'cluster="eu-1"',
    "group_labels": ["namespace", "region"],
    "runbook_url": "https://wiki.example.com/runbook",
}


def set_flags(thresholds: Mapping[str, Any]) -> list[str]:
    """`rules`' --set flags for these thresholds."""
    flags: list[str] = []
    for name, value in thresholds.items():
        text = ",".join(value) if isinstance(value, list) else str(value)
        flags += ["--set", f"{name}={text}"]
    return flags


def run_program(
    command: Sequence[str | Path],
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 120,
    check: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Another program in a subprocess, its output captured as text, in this environment
    (`env` replaces it). Tests take it through the `run_program` fixture, which puts them
    in the integration tier: a unit test starts no process."""
    return subprocess.run(
        [str(part) for part in command],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=check,
        cwd=cwd,
        env=None if env is None else dict(env),
    )


def http_get(
    url: str,
    headers: Mapping[str, str] | None = None,
    method: str = "GET",
    context: ssl.SSLContext | None = None,
) -> tuple[int, str]:
    """Status and body; an HTTP error status is an answer too. `context` for https URLs."""
    request = urllib.request.Request(url, headers=dict(headers or {}), method=method)
    try:
        with urllib.request.urlopen(request, timeout=30, context=context) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def basic_auth(user: str, password: str) -> dict[str, str]:
    """The request header of HTTP basic authentication."""
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


@dataclass
class Tls:
    """A throwaway CA with a server certificate for 127.0.0.1 and a client certificate, in
    files under `folder`; `rotate()` writes a new server certificate over the old one."""

    folder: Path
    ca: trustme.CA = field(default_factory=trustme.CA)

    def __post_init__(self) -> None:
        self.ca.cert_pem.write_to_path(str(self.ca_file))
        client = self.ca.issue_cert("prometheus@example.com")
        client.private_key_and_cert_chain_pem.write_to_path(str(self.client_file))
        self.rotate()

    @property
    def ca_file(self) -> Path:
        return self.folder / "ca.pem"

    @property
    def cert_file(self) -> Path:
        return self.folder / "server.pem"

    @property
    def key_file(self) -> Path:
        return self.folder / "server-key.pem"

    @property
    def client_file(self) -> Path:
        """The client's certificate and key in one file."""
        return self.folder / "client.pem"

    def rotate(self) -> bytes:
        """Issue a new server certificate into the same files; returns it (DER)."""
        cert = self.ca.issue_cert("127.0.0.1", "localhost")
        # The key first: a reader between the two writes sees a pair that does not match
        # and keeps the old one, as a real rotation may make it do.
        cert.private_key_pem.write_to_path(str(self.key_file))
        cert.cert_chain_pems[0].write_to_path(str(self.cert_file))
        return ssl.PEM_cert_to_DER_cert(self.cert_file.read_text())

    def client(self, certificate: bool | Path = False) -> ssl.SSLContext:
        """A client that trusts the CA, and shows the client certificate if asked to (or
        the one of this file, from `client_cert`)."""
        context = ssl.create_default_context(cafile=str(self.ca_file))
        if certificate:
            chosen = self.client_file if certificate is True else certificate
            context.load_cert_chain(str(chosen))
        return context

    def client_cert(self, name: str, *identities: str) -> Path:
        """A client certificate of the CA with these SANs (DNS names, IP addresses, e-mail
        addresses), its key in the same file, `name`.pem; the key alone in `name`-key.pem."""
        cert = self.ca.issue_cert(*identities)
        path = self.folder / f"{name}.pem"
        cert.private_key_and_cert_chain_pem.write_to_path(str(path))
        cert.private_key_pem.write_to_path(str(self.folder / f"{name}-key.pem"))
        return path


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


def scrape(url: str, headers: Mapping[str, str] | None = None) -> Scrape:
    """GET a metrics page that must answer 200, parsed."""
    status, body = http_get(url, headers)
    assert status == 200, body
    return Scrape(body)


@dataclass
class RunningExporter:
    process: subprocess.Popen[str]
    port: int
    log_path: Path

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get(
        self, path: str, headers: Mapping[str, str] | None = None, method: str = "GET"
    ) -> tuple[int, str]:
        return http_get(self.base + path, headers, method)

    def scrape(self) -> Scrape:
        return scrape(self.base + "/metrics")

    def timed_scrape(self, **headers: str) -> tuple[float, Scrape]:
        """A scrape of /metrics with these request headers, and the seconds it took."""
        started = time.monotonic()
        scraped = scrape(self.base + "/metrics", headers)
        return time.monotonic() - started, scraped

    def scrape_until(self, check: Callable[[Scrape], bool], timeout: float = 20.0) -> Scrape:
        """Scrape until `check` holds; fail with the last scrape if it never does."""
        last: list[Scrape] = []

        def holds() -> bool:
            last[:] = [self.scrape()]
            return check(last[0])

        wait_until(holds, timeout, lambda: f"condition not met; last scrape:\n{last[0].text}", 0.2)
        return last[0]

    def log(self) -> str:
        return self.log_path.read_text()


@dataclass
class SilentServer:
    """A port that accepts connections and never answers, like a hung server."""

    port: int
    accepted: list[socket.socket]  # every connection made to it


Connection = psycopg.Connection[TupleRow]
Config = dict[str, Any]  # a configuration file's content, as YAML loads it


class Session(Protocol):
    """The `session` fixture: opens an application session that closes after the test."""

    def __call__(
        self, application_name: str, dbname: str = "postgres", autocommit: bool = True
    ) -> Connection: ...


class StartExporter(Protocol):
    """The `start_exporter` fixture: the real daemon with these arguments, listening on a free
    port of `host` ("" for every address), run through the `prefix` command if any (which
    must exec it, so that its process is the daemon's)."""

    def __call__(
        self,
        *args: str,
        config: Config | None = None,
        env: Mapping[str, str] | None = None,
        host: str = "127.0.0.1",
        prefix: Sequence[str] = (),
    ) -> RunningExporter: ...


class OneTarget(Protocol):
    """The `one_target` fixture: a configuration with one target and these collection settings."""

    def __call__(self, dsn: str, name: str = "main", **collection: str) -> Config: ...


class StartService(Protocol):
    """The `start_service` fixture: a server, Debian-packaged by name or any by its path;
    returns its port."""

    def __call__(self, binary: str, *args: str, ready_path: str) -> int: ...


def prometheus3(name: str = "prometheus") -> str:
    """Prometheus 3's `prometheus` or `promtool`, from Debian sid (devtools/debian_sid.py)."""
    try:
        return str(prometheus_binary(name))
    except InstallError as exc:
        pytest.fail(str(exc))


def start_prometheus(start_service: StartService, folder: Path, config: dict[str, Any]) -> int:
    """Prometheus 3 with this configuration, written into `folder` (the test's tmp_path,
    where start_service runs it); its port once ready."""
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
    return start_service(
        prometheus3(),
        "--config.file=prometheus.yml",
        "--storage.tsdb.path=prometheus-data",
        ready_path="/-/ready",
    )


class QueryError(Exception):
    """Prometheus refused a query; the message is its error."""


def prometheus_api(port: int, path: str, **params: str) -> Any:
    """The `data` of an answer of the HTTP API of the Prometheus on `port`, at /api/v1/PATH
    (query, targets, alerts ...); QueryError with Prometheus' error if it refuses."""
    url = f"http://127.0.0.1:{port}/api/v1/{path}?{urllib.parse.urlencode(params)}"
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return json.load(answer)["data"]
    except urllib.error.HTTPError as error:
        raise QueryError(json.load(error).get("error")) from None


def prometheus_query(port: int, query: str) -> list[dict[str, Any]]:
    """An instant query's result: each series' `metric` (its labels) and `value`."""
    result: list[dict[str, Any]] = prometheus_api(port, "query", query=query)["result"]
    return result


class LintImports(Protocol):
    """The `lint_imports` fixture: import-linter with the project's contracts on the package
    found first on this path; its result."""

    def __call__(self, path: Path) -> subprocess.CompletedProcess[str]: ...


class RunProgram(Protocol):
    """The `run_program` fixture: `run_program`."""

    def __call__(
        self,
        command: Sequence[str | Path],
        *,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float = 120,
        check: bool = False,
    ) -> subprocess.CompletedProcess[str]: ...


class Cli(Protocol):
    """The `cli` fixture: `run_cli`."""

    def __call__(
        self,
        *args: str,
        env: Mapping[str, str] | None = None,
        check: bool = False,
        timeout: float = 30,
    ) -> subprocess.CompletedProcess[str]: ...


# libyaml's loader where PyYAML has it: the same documents, read several times faster (the
# tests read rendered charts and rule files by the hundred).
_YAML_LOADER: type[yaml.CSafeLoader] | type[yaml.SafeLoader] = getattr(
    yaml, "CSafeLoader", yaml.SafeLoader
)


def load_yaml(text: str | bytes) -> Any:
    """A YAML document, read as yaml.safe_load reads it."""
    return yaml.load(text, Loader=_YAML_LOADER)


def load_yaml_all(text: str | bytes) -> Iterator[Any]:
    """Each document of a YAML stream, read as yaml.safe_load_all reads them."""
    return yaml.load_all(text, Loader=_YAML_LOADER)
