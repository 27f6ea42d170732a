"""Targets arranged on servers: the configured ones (which share a connection, kept across
reloads where nothing changed), and the targets probes name through an auth module (their
rank; http/discovered.py keeps them, one server per module, checked address and port).

Targets that connect the same way (one DSN, one password file) share one server and its one
connection. Targets that connect to one address in other ways (another role, another
password file, another database) each get a server of their own: which of them reads the
running server, and which target answers for it, is the directory's rule (directory.py),
decided on what each connection reaches, not on how its DSN is spelt. So a first target that
cannot connect (its secret is missing, its role is refused) hands the server to the next one
that can, and takes it back once it connects.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field

from pg_advisory_exporter.config.settings import TargetSettings

from .directory import Rank
from .server import Server
from .target import Target


def connects_as(config: TargetSettings) -> Hashable:
    """How a target connects: targets alike in this share a server."""
    return (config.dsn, config.password_file)


@dataclass(frozen=True)
class Arrangement:
    """The targets by name, and the servers they read, by how they connect."""

    targets: dict[str, Target] = field(default_factory=dict)
    servers: dict[Hashable, Server] = field(default_factory=dict)

    def close_unused(self, old: Arrangement) -> None:
        """Close what `old` had and this one does not keep (after a reload)."""
        for name, target in old.targets.items():
            if self.targets.get(name) is not target:
                target.close()
        kept = set(map(id, self.servers.values()))
        for server in old.servers.values():
            if id(server) not in kept:
                server.close()

    def close(self) -> None:
        for target in self.targets.values():
            target.close()
        for server in self.servers.values():
            server.close()


def arrange(
    configs: Sequence[TargetSettings],
    old: Arrangement,
    make_server: Callable[[TargetSettings], Server],
    make_target: Callable[[TargetSettings, Server, Rank], Target],
    key: Callable[[TargetSettings], Hashable] = connects_as,
) -> Arrangement:
    """The targets in the order of the file (their rank) on their servers, each server made
    from the first target that connects its way. What is unchanged is kept, with its
    connection and last collection; a kept target takes its new rank."""
    arranged = Arrangement()
    for rank, config in enumerate(configs):
        way = key(config)
        server = arranged.servers.get(way)
        if server is None:
            server = arranged.servers[way] = _kept_server(old.servers, way, config, make_server)
        kept = old.targets.get(config.name)
        if kept is not None and kept.config == config and kept.server is server:
            kept.rank = (rank,)
            arranged.targets[config.name] = kept
        else:
            arranged.targets[config.name] = make_target(config, server, (rank,))
    return arranged


def _kept_server(
    old: Mapping[Hashable, Server],
    way: Hashable,
    config: TargetSettings,
    make_server: Callable[[TargetSettings], Server],
) -> Server:
    found = old.get(way)
    return found if found is not None and found.config == config else make_server(config)


def probed_target(name: str, server: Server, database: str | None, made: int) -> Target:
    """A probe's target on its auth module's server: a whole server's (`database` None) ranked
    before any database's, each in the order made (`made`), so that the first whole-server
    probe answers for the server (directory.py)."""
    whole = 0 if database is None else 1
    config = server.config.model_copy(update={"name": name})
    return Target(config, server=server, database=database, rank=(whole, made))
