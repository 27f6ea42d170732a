"""Poolers without a server: their configuration, which backends they own, and the stranded
locks counted from a snapshot. tests/test_pgbouncer.py does the same with a real PgBouncer."""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from dataclasses import replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from support import EXAMPLE_DSN, IDLE, Clock, SilentServer, load_config, snapshot_of, wait_until

from pg_advisory_exporter.collect import poolers
from pg_advisory_exporter.collect.poolers import (
    SHOW_CONFIG,
    SHOW_DATABASES,
    SHOW_POOLS,
    SHOW_SERVERS,
    PooledBackend,
    Poolers,
    PoolerView,
    _Server,
    console_view,
    owner,
)
from pg_advisory_exporter.collect.scheduling import Watchdog
from pg_advisory_exporter.collect.series import server_samples
from pg_advisory_exporter.fleet.resolver import IpAddress, Resolver
from pg_advisory_exporter.metrics import Sample
from pg_advisory_exporter.validation import ConfigError

CONSOLE = "host=pgbouncer.example port=6432 dbname=pgbouncer user=stats"
# load_config reads the environment as the command does: none from the shell that runs the tests.
pytestmark = pytest.mark.usefixtures("clean_environment")


def _load(tmp_path: Path, *poolers: dict[str, Any], **target: Any) -> Any:
    document = {
        "targets": [{"name": "main", "dsn": EXAMPLE_DSN, "poolers": list(poolers), **target}]
    }
    return load_config(tmp_path, document)


@pytest.mark.parametrize(
    ("pooler", "problem"),
    [
        ({"name": "a"}, "give exactly one of admin_dsn or addresses"),
        (
            {"name": "a", "admin_dsn": CONSOLE, "addresses": ["10.0.0.1"]},
            "give exactly one of admin_dsn or addresses",
        ),
        ({"name": "a", "addresses": ["10.0.0.0/24"]}, "addresses need pool_mode"),
        (
            {"name": "a", "admin_dsn": CONSOLE, "pool_mode": "transaction"},
            "pool_mode goes with addresses",
        ),
        (
            {"name": "a", "addresses": ["10.0.0.0/33"], "pool_mode": "session"},
            "'10.0.0.0/33' is not an IP address, a CIDR (10.0.0.0/24) or a host name",
        ),
        (
            {"name": "a", "addresses": ["pgbouncer_1"], "pool_mode": "session"},
            "'pgbouncer_1' is not an IP address",
        ),
        ({"name": "a", "addresses": ["x"], "pool_mode": "sessions"}, "pool_mode: Input should"),
        ({"name": "a", "admin_dsn": "host=x port=y"}, "port 'y' is not a number"),
        ({"name": "a b", "admin_dsn": CONSOLE}, "name: String should match pattern"),
        (
            {
                "name": "a",
                "addresses": ["10.0.0.1"],
                "pool_mode": "session",
                "password_file": "/etc/hosts",
            },
            "password_file goes with admin_dsn",
        ),
        (
            {"name": "a", "admin_dsn": CONSOLE + " password=x", "password_file": "/etc/hosts"},
            "either in the DSN or in password_file",
        ),
        ({"name": "a", "admin_dsn": CONSOLE, "extra": 1}, "extra: unknown field"),
    ],
)
def test_a_bad_pooler_is_named_with_its_field(
    tmp_path: Path, pooler: dict[str, Any], problem: str
) -> None:
    with pytest.raises(ConfigError) as error:
        _load(tmp_path, pooler)
    message = str(error.value)
    assert message.startswith(f"{tmp_path / 'config.yaml'}: targets[0] (main).poolers[0]"), message
    assert problem in message


def test_pooler_names_are_unique_per_target(tmp_path: Path) -> None:
    twice = {"name": "a", "admin_dsn": CONSOLE}
    with pytest.raises(ConfigError, match=r"targets\[0\] \(main\).poolers: .*'a' is used twice"):
        _load(tmp_path, twice, twice)


def test_poolers_and_the_locks_page_settings_load(tmp_path: Path) -> None:
    password = tmp_path / "password"
    password.write_text("s3cret\n")
    config = _load(
        tmp_path,
        {"name": "console", "admin_dsn": CONSOLE, "password_file": str(password)},
        {"name": "pods", "addresses": ["10.1.0.0/16", "::1", "pgbouncer.example"],
         "pool_mode": "statement"},
        locks_page={"query_text": True},
    )  # fmt: skip
    target = config.targets[0]
    console, pods = target.poolers
    assert "password=s3cret" in console.conninfo()
    assert pods.addresses == ("10.1.0.0/16", "::1", "pgbouncer.example")
    assert (target.locks_page.query_text, target.locks_page.query_text_length) == (True, 200)
    assert target.locks_page.reuse_for == 5.0


def _view(*servers: tuple[int, int | None, str], **fields: Any) -> PoolerView:
    by_pid = {
        pid: _Server(PooledBackend("pgb", "app/app", mode), port) for pid, port, mode in servers
    }
    return PoolerView("pgb", by_pid=by_pid, **fields)


def test_a_backend_is_owned_by_pid_confirmed_by_its_client_port() -> None:
    view = _view((100, 50000, "transaction"))
    assert view.owner(100, "10.0.0.5", 50000) == PooledBackend("pgb", "app/app", "transaction")
    assert view.owner(100, None, None) is not None  # nothing to confirm with: the pid decides
    # One pooler in front of two servers: pid 100 on this server is another connection.
    assert view.owner(100, "10.0.0.5", 50001) is None
    assert view.owner(101, "10.0.0.5", 50000) is None


def test_a_backend_is_owned_by_its_socket_where_the_pid_is_unknown() -> None:
    server = _Server(PooledBackend("pgb", "app/app", "transaction"), 50000)
    view = PoolerView("pgb", by_socket={("10.0.0.5", 50000): server})
    assert view.owner(7, "10.0.0.5", 50000) == server.backend
    assert view.owner(7, "10.0.0.5", 50001) is None


def test_a_pooler_known_by_address_owns_its_networks() -> None:
    networks = (ipaddress.ip_network("10.1.0.0/16"), ipaddress.ip_network("::1"))
    view = PoolerView("pods", networks=networks, pool_mode="transaction")
    assert view.owner(1, "10.1.200.3", 5) == PooledBackend("pods", "", "transaction")
    assert view.owner(1, "::1", 5) is not None
    assert view.owner(1, "10.2.0.1", 5) is None
    assert view.owner(1, None, None) is None  # a Unix socket


def test_the_first_pooler_that_is_up_owns_a_backend() -> None:
    down = PoolerView("down", error="refused", networks=(ipaddress.ip_network("0.0.0.0/0"),))
    up = _view((1, None, "session"))
    assert owner([down, up], 1, "10.0.0.1", 4) == PooledBackend("pgb", "app/app", "session")
    assert owner([down], 1, "10.0.0.1", 4) is None


def _stranded(samples: list[Sample]) -> dict[tuple[str, ...], float]:
    return {s.labels: s.value for s in samples if s.name == "pg_advisory_pooled_session_locks"}


def test_only_certain_session_locks_in_sharing_pools_are_stranded() -> None:
    idle = replace(IDLE, pid=1, advisory_entries=3)  # outside a transaction: session locks
    in_tx = replace(IDLE, pid=2, state="active", in_transaction=True)  # cannot be told apart
    in_session_pool = replace(IDLE, pid=3, application_name="session-job")
    waiting = replace(
        IDLE, pid=4, state="active", in_transaction=True, awaited_mode="ExclusiveLock"
    )
    direct = replace(IDLE, pid=5, application_name="direct")
    view = _view(
        (1, None, "transaction"), (2, None, "transaction"), (3, None, "session"),
        (4, None, "statement"),
    )  # fmt: skip
    snapshot = snapshot_of(idle, in_tx, in_session_pool, waiting, direct)
    samples = server_samples("main", snapshot, [], 100, poolers=[view]).samples
    assert _stranded(samples) == {("main", "app", "billing-worker", "pgb", "app/app"): 3}
    assert [s for s in samples if s.name == "pg_advisory_pooler_up"] == [
        Sample("pg_advisory_pooler_up", ("main", "pgb"), True)
    ]


def test_a_clean_pooler_says_zero_and_one_that_is_down_says_nothing() -> None:
    clean = _view()
    down = PoolerView("gone", error="connection refused")
    samples = server_samples("main", snapshot_of(IDLE), [], 100, poolers=[clean, down]).samples
    assert _stranded(samples) == {("main", "", "", "pgb", ""): 0}
    assert {s.labels: s.value for s in samples if s.name == "pg_advisory_pooler_up"} == {
        ("main", "pgb"): 1,
        ("main", "gone"): 0,
    }
    # No pooler configured: not watched, no series at all.
    assert _stranded(server_samples("main", snapshot_of(IDLE), [], 100).samples) == {}


def test_an_unresolvable_host_name_is_reported_not_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The resolver's answer for a name that does not exist, without asking a DNS server.
    asked: list[object] = []

    def unknown(host: object, *_: object, **__: object) -> Any:
        asked.append(host)
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", unknown)
    config = _load(
        tmp_path, {"name": "pods", "addresses": ["no-such-host.invalid"], "pool_mode": "session"}
    ).targets[0]
    assert config.collection is not None
    read = Poolers(config.poolers, config.collection)
    started = time.monotonic()
    (view,) = read.read(Watchdog(), 5.0)
    assert time.monotonic() - started < 5.5
    assert view.error is not None
    assert "resolv" in view.error
    assert not view.up
    assert asked == ["no-such-host.invalid"]


# SHOW SERVERS rows as releases write them, by column name (tests/test_pgbouncer.py reads a
# real 1.18). 1.23 inserted `replication` as the 4th column and 1.24 added `id` at the end:
# the exporter reads by name, so only what a row lacks matters.
SERVER_1_18 = {"type": "S", "user": "app", "database": "orders", "state": "idle",
               "addr": "10.0.0.2", "port": 5432, "local_addr": "10.0.0.9", "local_port": 41000,
               "link": "", "remote_pid": 4242, "tls": "", "application_name": "job"}  # fmt: skip
SERVER_1_24 = {**SERVER_1_18, "replication": "none", "prepared_statements": 0, "id": 7}


def _console(tables: dict[str, list[dict[str, Any]]]) -> tuple[list[str], Any]:
    asked: list[str] = []

    def show(command: str) -> list[dict[str, Any]]:
        asked.append(command)
        return tables[command]

    return asked, show


@pytest.mark.parametrize("server", [SERVER_1_18, SERVER_1_24], ids=["1.18", "1.24"])
def test_the_console_is_read_by_column_name(server: dict[str, Any]) -> None:
    asked, show = _console({
        SHOW_SERVERS: [server],
        SHOW_POOLS: [{"database": "orders", "user": "app", "cl_active": 0,
                      "pool_mode": "transaction"}],
    })  # fmt: skip
    view = console_view("pgb", show)
    assert view.owner(4242, "10.0.0.9", 41000) == PooledBackend("pgb", "orders/app", "transaction")
    assert view.owner(4242, "10.0.0.9", 41001) is None  # another server's pid 4242
    assert asked == [SHOW_SERVERS, SHOW_POOLS]  # the mode was there: nothing else is read


def test_a_mode_the_pools_lack_comes_from_the_database_then_the_default() -> None:
    other = {**SERVER_1_18, "database": "billing", "remote_pid": 4343, "local_port": 41001}
    _, show = _console({
        SHOW_SERVERS: [SERVER_1_18, other],
        SHOW_POOLS: [{"database": "orders", "user": "app"}, {"database": "billing", "user": "app"}],
        SHOW_DATABASES: [{"name": "orders", "pool_mode": "statement"},
                         {"name": "billing", "pool_mode": None}],  # NULL: the default
        SHOW_CONFIG: [{"key": "pool_mode", "value": "transaction", "default": "session"}],
    })  # fmt: skip
    view = console_view("pgb", show)
    assert view.by_pid[4242].backend.pool_mode == "statement"
    assert view.by_pid[4343].backend.pool_mode == "transaction"


def test_a_server_without_a_usable_pid_is_matched_by_its_port() -> None:
    logging_in = {**SERVER_1_18, "remote_pid": 0}  # 0 while the connection logs in
    upstream_bouncer = {**SERVER_1_18, "remote_pid": -1246781235, "local_port": 41002}
    old = {k: v for k, v in SERVER_1_18.items() if k != "remote_pid"}
    old["local_port"] = 41003
    _, show = _console({
        SHOW_SERVERS: [logging_in, upstream_bouncer, old],
        SHOW_POOLS: [{"database": "orders", "user": "app", "pool_mode": "transaction"}],
    })  # fmt: skip
    view = console_view("pgb", show)
    assert view.by_pid == {}
    for port in (41000, 41002, 41003):
        assert view.owner(1, "10.0.0.9", port) == PooledBackend("pgb", "orders/app", "transaction")


def test_host_names_are_resolved_at_most_once_a_minute() -> None:
    asked: list[str] = []

    def lookup(host: str) -> list[IpAddress]:
        asked.append(host)
        return [ipaddress.IPv4Address("10.9.0.1")]

    clock = Clock()
    names = Resolver(lookup, clock)
    addresses = poolers._Addresses(["10.1.0.0/16", "pgbouncer.example"], clock, names)
    for _ in range(3):
        networks, error = addresses.networks(1.0)
        assert error is None
        assert [str(n) for n in networks] == ["10.1.0.0/16", "10.9.0.1/32"]
        clock.now += 20
    assert asked == ["pgbouncer.example"]
    clock.now += 1  # 61s since it resolved
    addresses.networks(1.0)
    assert asked == ["pgbouncer.example"] * 2


def test_a_console_that_failed_answers_with_its_failure_until_the_backoff_passed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _load(tmp_path, {"name": "pgb", "admin_dsn": CONSOLE + " password=s3cret"})
    target = config.targets[0]
    attempts: list[dict[str, Any]] = []

    def refused(conninfo: str, connect_timeout: float, **options: Any) -> Any:
        attempts.append(options)
        raise psycopg.OperationalError(f'connection to "{conninfo}" failed: refused')

    monkeypatch.setattr(poolers, "connect", refused)
    watchdog, clock = Watchdog(), Clock()
    console = poolers._Console(target.poolers[0], target.collection, clock)
    failure = console.read(watchdog, 5.0)
    assert failure.error is not None
    assert "refused" in failure.error
    assert "s3cret" not in failure.error
    # The first backoff is a second: meanwhile the failure is the answer, and nothing is tried.
    assert console.read(watchdog, 5.0) is failure
    # The console takes no prepared statements.
    assert attempts == [{"prepare_threshold": None}]
    clock.now += 0.999
    assert console.read(watchdog, 5.0) is failure
    clock.now += 0.001
    assert console.read(watchdog, 5.0) is not failure  # tried again
    assert len(attempts) == 2


@pytest.mark.parametrize(
    ("table", "row", "column"),
    [
        (SHOW_SERVERS, {**SERVER_1_18, "remote_pid": "4242"}, "remote_pid"),
        (SHOW_SERVERS, {**SERVER_1_18, "remote_pid": float("nan")}, "remote_pid"),
        (SHOW_SERVERS, {**SERVER_1_18, "remote_pid": Decimal("NaN")}, "remote_pid"),
        (SHOW_SERVERS, {**SERVER_1_18, "remote_pid": True}, "remote_pid"),
        (SHOW_SERVERS, {**SERVER_1_18, "local_port": "41000"}, "local_port"),
        (SHOW_SERVERS, {**SERVER_1_18, "local_addr": 167772169}, "local_addr"),
        (SHOW_SERVERS, {**SERVER_1_18, "database": 5}, "database"),
        (SHOW_POOLS, {"database": "orders", "user": "app", "pool_mode": 1}, "pool_mode"),
    ],
    ids=["pid-text", "pid-nan", "pid-decimal-nan", "pid-bool", "port-text", "addr-number",
         "database-number", "mode-number"],
)  # fmt: skip
def test_a_value_of_the_wrong_type_is_the_consoles_failure(
    table: str, row: dict[str, Any], column: str
) -> None:
    tables: dict[str, list[dict[str, Any]]] = {
        SHOW_SERVERS: [SERVER_1_18],
        SHOW_POOLS: [{"database": "orders", "user": "app", "pool_mode": "transaction"}],
    }
    _, show = _console({**tables, table: [row]})
    with pytest.raises(ValueError, match=f"^{table} gave {column} = .*, not "):
        console_view("pgb", show)


def test_missing_columns_and_nulls_are_done_without() -> None:
    bare = {"database": None, "user": None, "remote_pid": None, "local_port": None}
    _, show = _console({SHOW_SERVERS: [bare, {}], SHOW_POOLS: [{}], SHOW_DATABASES: [{}],
                        SHOW_CONFIG: [{"key": None}]})  # fmt: skip
    view = console_view("pgb", show)
    assert (view.by_pid, view.by_socket) == ({}, {})


class _Opened:
    """What connect() returns where the console's answer is replaced: only closed."""

    closed = False

    def close(self) -> None:
        self.closed = True


def test_anything_a_console_read_raises_is_that_poolers_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _load(tmp_path, {"name": "pgb", "admin_dsn": CONSOLE}).targets[0]
    opened = _Opened()
    monkeypatch.setattr(poolers, "connect", lambda *_, **__: opened)

    def odd(name: str, show: Any) -> PoolerView:
        raise KeyError("remote_pid")

    monkeypatch.setattr(poolers, "console_view", odd)
    (view,) = Poolers(config.poolers, config.collection).read(Watchdog(), 5.0)
    assert view.error == "unexpected KeyError: 'remote_pid'"
    assert opened.closed  # and backing off, as after any failure


def test_a_console_that_never_answers_is_waited_for_once(
    tmp_path: Path, silent_server: SilentServer
) -> None:
    dsn = f"host=127.0.0.1 port={silent_server.port} dbname=pgbouncer user=stats"
    config = _load(tmp_path, {"name": "hung", "admin_dsn": dsn}).targets[0]
    read = Poolers(config.poolers, config.collection)  # its own read: 3s connect_timeout
    watchdog = Watchdog()
    try:
        started = time.monotonic()
        (view,) = read.read(watchdog, 0.3)
        first = time.monotonic() - started
        assert view.error == "no answer within 300ms"
        started = time.monotonic()
        (view,) = read.read(watchdog, 0.3)  # the same read, still under way
        again = time.monotonic() - started
        assert view.error == "no answer within 300ms"
        assert 0.3 <= first < 2.5  # its 0.3s wait, not libpq's connect timeout (3s)
        assert again < first / 3  # only looked at, however long that took
    finally:
        read.close()


def test_a_resolver_that_never_answers_is_waited_for_once() -> None:
    released = threading.Event()

    def hangs(host: str) -> list[IpAddress]:
        released.wait(10)  # as getaddrinfo waits on a DNS server that never answers
        return [ipaddress.IPv4Address("10.9.0.1")]

    clock = Clock()
    addresses = poolers._Addresses(["10.1.0.0/16", "pgbouncer.example"], clock, Resolver(hangs))
    try:
        started = time.monotonic()
        _, error = addresses.networks(0.3)
        first = time.monotonic() - started
        assert (
            error == "cannot resolve its host names: pgbouncer.example did not resolve within 0.3s"
        )
        started = time.monotonic()
        _, error = addresses.networks(0.3)
        again = time.monotonic() - started
        assert error is not None
        # The first call waited its 0.3s; the next only looks, however long that took.
        assert again < first / 3, (first, again)
    finally:
        released.set()
    # The late answer is used once it comes, without waiting for it.
    wait_until(lambda: addresses.networks(0.0)[1] is None, 5, "the late resolution")
    networks, _ = addresses.networks(0.0)
    assert [str(n) for n in networks] == ["10.1.0.0/16", "10.9.0.1/32"]
