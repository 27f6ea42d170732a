"""Optional parts never fail the core: a pooler that lies (a console answering odd types,
tests/fake_console.py), hangs (consoles that accept and never answer) or cannot be resolved
(a resolver that never answers) never reports a healthy server down, nor does a registry read
that the server refuses."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_console import FLOAT8, INT4, TEXT, Column, FakeConsole
from support import SilentServer, StartExporter, load_config

from devtools.embedded_postgres import EmbeddedPostgres
from pg_advisory_exporter.collect.arrangement import Arrangement, arrange
from pg_advisory_exporter.collect.directory import Directory
from pg_advisory_exporter.collect.poolers import POOLER_WAIT, Poolers
from pg_advisory_exporter.collect.scheduling import CollectionPool, Watchdog
from pg_advisory_exporter.collect.server import Server
from pg_advisory_exporter.collect.target import Target
from pg_advisory_exporter.config.model import DEFAULT_PARALLEL_COLLECTIONS
from pg_advisory_exporter.fleet import resolver
from pg_advisory_exporter.fleet.resolver import IpAddress
from pg_advisory_exporter.http.collector import AnswerTimer, target_samples
from pg_advisory_exporter.metrics import Sample

# Version-independent (tests/conftest.py): what the exporter does with its poolers' answers
# and with a registry read the server refuses.
# load_config reads the environment as the command does: none from the shell that runs the tests.
pytestmark = [pytest.mark.any_version, pytest.mark.usefixtures("clean_environment")]

# A 4s deadline (connect 2s + statement 1s + 1s): the poolers' wait is POOLER_WAIT.
QUICK = {"min_interval": "1ms", "reconnect_backoff_max": "1s",
         "connect_timeout": "2s", "statement_timeout": "1s"}  # fmt: skip
DEADLINE = 4.0
HUNG, PLAIN = 40, 5  # targets behind poolers that never answer, and targets without any


def _servers(remote_pid: Column) -> dict[str, list[Column]]:
    return {
        "SHOW SERVERS": [("database", TEXT, ["postgres"]), ("user", TEXT, ["app"]),
                         ("local_addr", TEXT, ["127.0.0.1"]), ("local_port", INT4, ["41000"]),
                         remote_pid],
        "SHOW POOLS": [("database", TEXT, ["postgres"]), ("user", TEXT, ["app"]),
                       ("pool_mode", TEXT, ["transaction"])],
    }  # fmt: skip


@pytest.mark.parametrize(
    "remote_pid",
    [("remote_pid", TEXT, ["4242"]), ("remote_pid", FLOAT8, ["NaN"])],
    ids=["text", "nan"],
)
def test_a_console_that_lies_is_down_and_its_server_up(
    start_exporter: StartExporter, monitor_dsn: str, remote_pid: Column
) -> None:
    with FakeConsole(_servers(remote_pid)).running() as console:
        config = {
            "collection": QUICK,
            "targets": [{"name": "main", "dsn": monitor_dsn,
                         "poolers": [{"name": "liar", "admin_dsn": console.admin_dsn()}]}],
        }  # fmt: skip
        exporter = start_exporter(config=config)
        for _ in range(3):  # the liar is read at every collection, and logged once
            scrape = exporter.scrape()  # after the collection, poolers included
            assert scrape.value("pg_advisory_up", target="main") == 1
            assert scrape.value("pg_advisory_pooler_up", target="main", pooler="liar") == 0
        status, body = exporter.get("/locks?target=main&format=json")
        assert status == 200, body
        assert "remote_pid" in body  # the pooler's failure, said on the page
        # The collections' reads (backing off after each failure) and the page's own.
        assert console.asked.count("SHOW SERVERS") >= 2
    log = exporter.log()
    assert log.count("cannot read the pooler") == 1, log
    assert "remote_pid" in log
    assert "internal error" not in log


def test_a_fleet_behind_consoles_that_never_answer_stays_up(
    monitor_dsn: str, tmp_path: Path, silent_server: SilentServer
) -> None:
    hung = f"host=127.0.0.1 port={silent_server.port} dbname=pgbouncer user=stats"
    targets = [
        {"name": f"pooled-{i}", "dsn": monitor_dsn,
         "poolers": [{"name": "bouncer", "admin_dsn": hung}]}
        for i in range(HUNG)
    ] + [{"name": f"direct-{i}", "dsn": monitor_dsn} for i in range(PLAIN)]  # fmt: skip
    timer = AnswerTimer()
    took = []
    # Each target a server of its own (in-process, as _in_process makes them): a fleet of
    # servers, each behind a console that never answers.
    with _in_process(tmp_path, targets) as (fleet, pool):
        for _ in range(4):  # the first collections, then the consoles' backoffs and retries
            started = time.monotonic()
            samples = target_samples(fleet, pool, timer)
            took.append(time.monotonic() - started)
            assert _values(samples, "pg_advisory_up") == {(t.name,): 1 for t in fleet}
            assert list(_values(samples, "pg_advisory_pooler_up").values()) == [0] * HUNG
            time.sleep(0.5)
    assert max(took) < DEADLINE, took
    assert len(silent_server.accepted) >= HUNG  # every console was tried


@pytest.fixture
def resolver_that_never_answers(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Host names resolve as getaddrinfo does when its DNS server never answers: the call
    blocks (until the test ends, here). The system resolver cannot be pointed at a test
    server without root, so the exporter's resolving function is replaced in-process."""
    released = threading.Event()
    asked: list[str] = []

    def hangs(host: str) -> list[IpAddress]:
        asked.append(host)
        released.wait(60)
        raise OSError("the test ended")

    monkeypatch.setattr(resolver, "RESOLVER", resolver.Resolver(hangs))
    yield asked
    released.set()


@contextlib.contextmanager
def _in_process(
    tmp_path: Path, targets: list[dict[str, Any]]
) -> Iterator[tuple[list[Target], CollectionPool]]:
    """The exporter's targets, pool and watchdog in this process (so that a function of the
    exporter can be replaced), collected as a scrape collects them: `target_samples`. Each
    target makes a server of its own, whatever it names: a fleet of servers on the suite's."""
    config = load_config(tmp_path, {"collection": QUICK, "targets": targets})
    pool, watchdog = CollectionPool(config.max_parallel_collections), Watchdog()
    arranged = arrange(
        config.targets,
        Arrangement(),
        lambda target: Server(target, pool, watchdog, Directory()),
        lambda target, server, rank: Target(target, server=server, rank=rank),
        key=lambda target: target.name,
    )
    try:
        yield list(arranged.targets.values()), pool
    finally:
        arranged.close()
        pool.shutdown()


def _values(samples: list[Sample], name: str) -> dict[tuple[str, ...], float]:
    return {s.labels: s.value for s in samples if s.name == name}


def test_host_names_that_never_resolve_cost_the_fleet_nothing_after_a_first_wait(
    monitor_dsn: str, tmp_path: Path, resolver_that_never_answers: list[str]
) -> None:
    by_name = {"name": "pods", "addresses": ["pgbouncer.example"], "pool_mode": "transaction"}
    targets = [
        {"name": f"pooled-{i}", "dsn": monitor_dsn, "poolers": [by_name]} for i in range(HUNG)
    ] + [{"name": f"direct-{i}", "dsn": monitor_dsn} for i in range(PLAIN)]
    timer = AnswerTimer()
    with _in_process(tmp_path, targets) as (fleet, pool):
        for scrape in range(3):
            started = time.monotonic()
            samples = target_samples(fleet, pool, timer)
            took = time.monotonic() - started
            up = _values(samples, "pg_advisory_up")
            assert up == {(target.name,): 1 for target in fleet}, (scrape, took)
            assert list(_values(samples, "pg_advisory_pooler_up").values()) == [0] * HUNG
            assert took < DEADLINE
            if scrape > 0:  # resolutions already waited out are not waited for again
                assert took < HUNG * POOLER_WAIT / DEFAULT_PARALLEL_COLLECTIONS, took
    # One lookup for the fleet, still pending: the exporter's resolver shares it.
    assert resolver_that_never_answers == ["pgbouncer.example"]


def test_a_poolers_read_that_cannot_even_start_is_theirs(
    monitor_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_thread(self: Poolers, watchdog: Watchdog, seconds: float) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(Poolers, "read", no_thread)
    console = {"name": "bouncer", "admin_dsn": "host=127.0.0.1 dbname=pgbouncer"}
    targets = [{"name": "main", "dsn": monitor_dsn, "poolers": [console]}]
    with _in_process(tmp_path, targets) as (fleet, pool):
        samples = target_samples(fleet, pool, AnswerTimer())
    assert _values(samples, "pg_advisory_up") == {("main",): 1}
    assert _values(samples, "pg_advisory_pooler_up") == {("main", "bouncer"): 0}


def test_a_registry_read_the_server_refuses_leaves_the_target_collecting(
    start_exporter: StartExporter, own_server: EmbeddedPostgres
) -> None:
    with own_server.connect() as admin:
        admin.execute("CREATE ROLE watcher LOGIN PASSWORD 'w'")
        admin.execute(
            "REVOKE EXECUTE ON FUNCTION pg_catalog.hashtextextended(text, bigint) FROM PUBLIC"
        )
        admin.execute("SELECT pg_advisory_lock(75474063)")  # the catalog's sqitch key
        config = {
            "collection": QUICK,
            "keys": [{"name": "nightly", "text": "nightly", "hash": "hashtextextended"}],
            "targets": [{"name": "main", "dsn": own_server.dsn(user="watcher", password="w")}],
        }
        exporter = start_exporter(config=config)
        for _ in range(3):
            scrape = exporter.scrape()
            assert scrape.value("pg_advisory_up", target="main") == 1, exporter.log()
            # Named still: a fixed catalog key needs no server-side read.
            assert scrape.find("pg_advisory_key_holders", target="main", key="sqitch")
    log = exporter.log()
    assert (
        log.count("could not give the keys that hashtext() and hashtextextended() compute") == 1
    ), log
