"""Replicas that split one file of 200 targets: each target served by one replica, few moved on
resize."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support import Config, RunningExporter, Scrape, StartExporter, exporter_sessions, wait_until

from devtools.embedded_postgres import EmbeddedPostgres

# Version-independent (tests/conftest.py): which replica connects is the exporter's side.
pytestmark = pytest.mark.any_version

TARGETS = [f"db-{i:03d}" for i in range(200)]


@pytest.fixture
def server(own_server: EmbeddedPostgres) -> EmbeddedPostgres:
    return own_server


def _config(dsn: str) -> Config:
    return {
        # Every target names one server: a fleet in one file, and each replica reads that
        # server once for all of its targets.
        "collection": {"min_interval": "1ms"},
        "targets": [{"name": name, "dsn": dsn} for name in TARGETS],
    }


def _client_ports(pid: int) -> set[int]:
    """The local TCP ports of a process's sockets, from /proc (no psutil here)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            link = str(fd.readlink())
        except FileNotFoundError:  # closed meanwhile
            continue
        if found := re.fullmatch(r"socket:\[([0-9]+)\]", link):
            inodes.add(found.group(1))
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[9] in inodes:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def _exporter_connections(server: EmbeddedPostgres) -> list[int | None]:
    """The client ports of the exporters' connections the server has."""
    return [session.client_port for session in exporter_sessions(server)]


def _all_up(scrape: Scrape) -> bool:
    ups = scrape.find("pg_advisory_up")
    return bool(ups) and all(value == 1 for _, value in ups)


def _run_shards(
    start_exporter: StartExporter, server: EmbeddedPostgres, total: int
) -> tuple[list[RunningExporter], dict[str, int]]:
    """`total` replicas of one file; the shard that collects each target."""
    config = _config(server.dsn())
    replicas = [
        start_exporter("--shard.total", str(total), "--shard.index", str(index), config=config)
        for index in range(total)
    ]
    owner: dict[str, int] = {}
    for index, replica in enumerate(replicas):
        scrape = replica.scrape_until(_all_up, timeout=60)
        assert scrape.value("pg_advisory_exporter_shard_index") == index
        assert scrape.value("pg_advisory_exporter_shards") == total
        mine = scrape.label_values("target")
        assert not mine & owner.keys(), f"collected by two replicas: {mine & owner.keys()}"
        owner.update(dict.fromkeys(mine, index))
    assert sorted(owner) == TARGETS  # the union is the whole file

    # Counted on the server: one connection from each replica, for all the targets it owns
    # (they name one server), and none from a replica for another's.
    wait_until(lambda: len(_exporter_connections(server)) == total, 10, f"{total} connections")
    connections = _exporter_connections(server)
    for replica in replicas:
        ports = _client_ports(replica.process.pid)
        assert sum(port in ports for port in connections) == 1
    return replicas, owner


def _stop(replicas: list[RunningExporter], server: EmbeddedPostgres) -> None:
    for replica in replicas:
        replica.process.terminate()
        replica.process.wait(timeout=15)
    wait_until(lambda: not _exporter_connections(server), 10, "the replicas' connections close")


def test_two_then_three_replicas_split_200_targets(
    start_exporter: StartExporter, server: EmbeddedPostgres
) -> None:
    two, before = _run_shards(start_exporter, server, 2)

    # Another shard's target: refused without a connection, naming the shard that owns it.
    theirs = next(name for name, index in before.items() if index == 1)
    status, body = two[0].get(f"/probe?target={theirs}")
    assert (status, body.strip()) == (
        404,
        f"target {theirs!r} is collected by shard 1 of 2; this exporter is shard 0: "
        "ask that replica",
    )
    assert two[1].get(f"/probe?target={theirs}")[0] == 200
    assert len(_exporter_connections(server)) == 2

    _stop(two, server)
    _, after = _run_shards(start_exporter, server, 3)
    moved = [name for name in TARGETS if before[name] != after[name]]
    assert len(moved) <= 0.4 * len(TARGETS)
    assert {after[name] for name in moved} == {2}  # only to the new shard
