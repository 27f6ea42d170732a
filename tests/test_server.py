"""Which target answers for a server, and how a server found under a second address reads
through the first: without a server, the identities given and the clock driven."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from support import Clock

from pg_advisory_exporter.collect.connection import ServerIdentity
from pg_advisory_exporter.collect.scheduling import CollectionPool, Watchdog
from pg_advisory_exporter.collect.server import SAME_SERVER_RECHECK, Directory, Server, _ReadThrough
from pg_advisory_exporter.collect.target import Target
from pg_advisory_exporter.config.model import CollectionSettings
from pg_advisory_exporter.config.settings import TargetSettings

STARTED = datetime(2026, 12, 1, 2, 0, tzinfo=UTC)
PRIMARY = ServerIdentity(STARTED, 7714447076430879015)
# A physical standby shares its primary's system identifier; its postmaster started apart.
STANDBY = ServerIdentity(STARTED.replace(second=5), 7714447076430879015)


@pytest.fixture
def parts() -> Iterator[tuple[CollectionPool, Watchdog]]:
    pool = CollectionPool(1)
    yield pool, Watchdog()
    pool.shutdown()


def _settings(name: str) -> TargetSettings:
    # Never connected to in these tests: nothing collects.
    return TargetSettings(
        name=name,
        dsn="host=192.0.2.1 dbname=postgres",
        collection=CollectionSettings(),
        catalog=False,
    )


def _server(
    parts: tuple[CollectionPool, Watchdog], name: str, directory: Directory, clock: Clock
) -> Server:
    return Server(_settings(name), *parts, directory, clock)


def test_the_first_to_claim_an_identity_reads_it_and_a_standby_is_another_server(
    parts: tuple[CollectionPool, Watchdog],
) -> None:
    directory, clock = Directory(), Clock()
    first, second, standby = (_server(parts, n, directory, clock) for n in ("a", "b", "c"))
    assert directory.claim(first, PRIMARY) is first
    assert directory.claim(second, PRIMARY) is first
    assert directory.claim(standby, STANDBY) is standby
    # A restart gives the server a new identity: the old one is free for whoever finds it.
    restarted = ServerIdentity(STARTED.replace(minute=9), PRIMARY.system_identifier)
    assert directory.claim(first, restarted) is first
    assert directory.claim(second, PRIMARY) is second
    # A closed reader is replaced.
    second.close()
    assert directory.claim(first, PRIMARY) is first


def test_a_second_address_reads_through_the_first_until_the_recheck(
    parts: tuple[CollectionPool, Watchdog],
) -> None:
    clock, directory = Clock(), Directory()
    node, vip = (_server(parts, name, directory, clock) for name in ("node", "vip"))
    node._claim(PRIMARY)
    with pytest.raises(_ReadThrough) as through:
        vip._claim(PRIMARY)
    assert through.value.collection.error == "the same server as node, not read yet"
    assert vip.reader() is node
    on_node = Target(_settings("orders"), *parts, server=node, rank=(0,))
    on_vip = Target(_settings("primary"), *parts, server=vip, rank=(1,))
    # Read once, through the node: the target of lowest rank answers for the server.
    assert node.targets() == [on_node, on_vip]
    assert on_node.answers_for_server()
    assert not on_vip.answers_for_server()
    # The virtual address may come to reach another server: it is checked again.
    clock.now += SAME_SERVER_RECHECK
    assert vip.reader() is vip
    assert node.targets() == [on_node]
    assert on_vip.answers_for_server()
    # A reader that is closed (a reload removed it) leaves the other to read on its own.
    with pytest.raises(_ReadThrough):
        vip._claim(PRIMARY)
    assert vip.reader() is node
    node.close()
    assert vip.reader() is vip


def test_a_whole_server_target_answers_for_it_before_any_database_target(
    parts: tuple[CollectionPool, Watchdog],
) -> None:
    server = _server(parts, "pg-1:5432", Directory(), Clock())
    made = [
        Target(_settings(f"pg-1:5432/{db}"), *parts, server=server, database=db, rank=(1, i))
        for i, db in enumerate(("orders", "billing"))
    ]
    assert [t.answers_for_server() for t in made] == [True, False]
    whole = Target(_settings("pg-1:5432"), *parts, server=server, rank=(0, 2))
    assert [t.answers_for_server() for t in (*made, whole)] == [False, False, True]
    whole.close()  # not the server: its other targets read on
    assert made[0].answers_for_server()
    assert not server.closed
