"""Who reads a running server and which target answers for it (collect/directory.py): of the
servers found to reach one, the first in rank reads it whichever connected first; of the
targets that read it, the first in rank answers. Without a server: identities given, the
clock driven."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from support import Clock

from pg_advisory_exporter.collect.collection import ReadThrough
from pg_advisory_exporter.collect.connection import ServerIdentity
from pg_advisory_exporter.collect.directory import SAME_SERVER_RECHECK, Directory
from pg_advisory_exporter.collect.scheduling import CollectionPool, Watchdog
from pg_advisory_exporter.collect.server import Server
from pg_advisory_exporter.collect.target import Target
from pg_advisory_exporter.config.collection import CollectionSettings
from pg_advisory_exporter.config.settings import TargetSettings

STARTED = datetime(2026, 12, 1, 2, 0, tzinfo=UTC)
PRIMARY = ServerIdentity(STARTED, 7714447076430879015)
# A physical standby shares its primary's system identifier; its postmaster started apart.
STANDBY = ServerIdentity(STARTED.replace(second=5), 7714447076430879015)

Parts = tuple[CollectionPool, Watchdog]


@pytest.fixture
def parts() -> Iterator[Parts]:
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


def _made(
    parts: Parts, directory: Directory[Server], clock: Clock, *names: str
) -> list[tuple[Server, Target]]:
    """A server for each name, and its one target, ranked in the order given (the file's)."""
    found = []
    for rank, name in enumerate(names):
        server = Server(_settings(name), *parts, directory, clock)
        found.append((server, Target(_settings(name), server=server, rank=(rank,))))
    return found


def test_the_first_in_rank_reads_a_server_whichever_connected_first(parts: Parts) -> None:
    directory: Directory[Server] = Directory()
    clock = Clock()
    (ip, on_ip), (name, _), (socket, _), (standby, _) = _made(
        parts, directory, clock, "by-ip", "by-name", "by-socket", "standby"
    )
    # The socket connects first: it reads, until one first in rank finds the same server.
    assert directory.claim(socket, PRIMARY) is socket
    assert directory.claim(name, PRIMARY) is name
    assert directory.reading_server(socket) is name
    assert directory.claim(ip, PRIMARY) is ip
    assert [directory.reading_server(s) for s in (ip, name, socket)] == [ip, ip, ip]
    assert directory.claim(standby, STANDBY) is standby  # another server
    # Its targets answer for it: the first in rank of those that read it.
    assert directory.answering(ip, None) is on_ip
    # A restart gives the server a new identity: each finds it anew.
    restarted = ServerIdentity(STARTED.replace(minute=9), PRIMARY.system_identifier)
    assert directory.claim(socket, restarted) is socket
    assert directory.reading_server(name) is ip
    # The first cannot connect any more (or is closed by a reload): the next in rank reads.
    directory.forget(ip)
    assert directory.reading_server(name) is name
    assert directory.claim(ip, PRIMARY) is ip


def test_a_second_address_reads_through_the_first_until_the_recheck(parts: Parts) -> None:
    clock = Clock()
    directory: Directory[Server] = Directory(clock)
    (node, on_node), (vip, on_vip) = _made(parts, directory, clock, "orders", "primary")
    node._claim(PRIMARY)
    with pytest.raises(ReadThrough) as through:
        vip._claim(ServerIdentity(PRIMARY.started, PRIMARY.system_identifier))
    assert through.value.collection.error == "the same server as orders, not read yet"
    assert through.value.collection.answering is on_node
    assert vip.reading_server() is node
    assert directory.answering(node, None) is on_node
    # The virtual address may come to reach another server: it is checked again.
    clock.now += SAME_SERVER_RECHECK
    assert vip.reading_server() is vip
    assert directory.answering(node, None) is on_node
    assert directory.answering(vip, None) is on_vip
    # A reader that is closed (a reload removed it) leaves the other to read on its own.
    with pytest.raises(ReadThrough):
        vip._claim(ServerIdentity(PRIMARY.started, PRIMARY.system_identifier))
    assert vip.reading_server() is node
    node.close()
    assert vip.reading_server() is vip


def test_a_whole_server_target_answers_for_it_before_any_database_target(parts: Parts) -> None:
    directory: Directory[Server] = Directory()
    server = Server(_settings("pg-1:5432"), *parts, directory, Clock())
    made = [
        Target(_settings(f"pg-1:5432/{db}"), server=server, database=db, rank=(1, i))
        for i, db in enumerate(("orders", "billing"))
    ]
    assert directory.answering(server, None) is made[0]
    # Of a database the server does not have (dropped since), never.
    assert directory.answering(server, frozenset({"billing"})) is made[1]
    whole = Target(_settings("pg-1:5432"), server=server, rank=(0, 2))
    assert directory.answering(server, frozenset({"orders", "billing"})) is whole
    whole.close()  # not the server: its other targets read on
    assert directory.answering(server, None) is made[0]
    assert not server.closed
    # A reload reorders them: the next collection says which answers.
    made[1].rank = (0, 0)
    assert directory.answering(server, None) is made[1]


def test_a_recheck_refused_for_the_full_table_reads_through_the_first_again(
    parts: Parts,
) -> None:
    """No new connection can start while the lock table is full: the server that read through
    another goes on doing so (the full table pages once, on the first), and checks again
    later; one that read through none, or read on its own, is not renewed."""
    clock = Clock()
    directory: Directory[Server] = Directory(clock)
    (node, _), (vip, _) = _made(parts, directory, clock, "orders", "primary")
    assert not directory.renew(vip)  # it never connected
    node._claim(PRIMARY)
    with pytest.raises(ReadThrough):
        vip._claim(ServerIdentity(PRIMARY.started, PRIMARY.system_identifier))
    assert not directory.renew(node)  # the first reads on its own
    clock.now += SAME_SERVER_RECHECK
    assert vip.reading_server() is vip  # time to check again; its connection is refused
    assert directory.renew(vip)
    assert vip.reading_server() is node
    clock.now += SAME_SERVER_RECHECK - 1
    assert vip.reading_server() is node
    clock.now += 1
    assert vip.reading_server() is vip
