"""The targets that probes name through an auth module: checked, read one server at a time,
forgotten when no probe has asked for them for a while, and counted."""

from __future__ import annotations

import enum
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import CancelledError, Future
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import suppress
from dataclasses import dataclass

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from pg_advisory_exporter.collect.arrangement import probed_target
from pg_advisory_exporter.collect.directory import Directory
from pg_advisory_exporter.collect.scheduling import CollectionPool, Watchdog
from pg_advisory_exporter.collect.server import Server
from pg_advisory_exporter.collect.target import Target
from pg_advisory_exporter.config.settings import AuthModuleSettings
from pg_advisory_exporter.config.targets import DiscoveredTargetsSettings
from pg_advisory_exporter.fleet.discovery import (
    AllowList,
    Refused,
    TargetAddress,
    parse_target,
    resolve,
)
from pg_advisory_exporter.fleet.resolver import IpAddress
from pg_advisory_exporter.metrics import Sample, families

log = logging.getLogger(__name__)

# The longest a probe waits for its host name to resolve; it is refused after that.
RESOLVE_WAIT = 2.0


class Refusal(enum.Enum):
    """Why a probe of a discovered target was refused: the `reason` label, and the answer."""

    UNKNOWN_AUTH_MODULE = "unknown_auth_module"
    MALFORMED_TARGET = "malformed_target"
    NOT_RESOLVED = "not_resolved"
    NOT_ALLOWED = "not_allowed"
    LIMIT_REACHED = "limit_reached"
    NO_SUCH_DATABASE = "no_such_database"

    @property
    def status(self) -> str:
        return _STATUS[self]

    @property
    def reason(self) -> str:
        return str(self.value)


_STATUS = {
    Refusal.UNKNOWN_AUTH_MODULE: "404 Not Found",
    Refusal.MALFORMED_TARGET: "400 Bad Request",
    Refusal.NOT_RESOLVED: "502 Bad Gateway",
    Refusal.NOT_ALLOWED: "403 Forbidden",
    Refusal.LIMIT_REACHED: "503 Service Unavailable",
    Refusal.NO_SUCH_DATABASE: "404 Not Found",
}


@dataclass(frozen=True)
class ProbeRefused:
    """A probe that was refused: what to answer, and nothing was connected to for it."""

    refusal: Refusal
    message: str


# A server as an auth module reaches it: the module, the checked address and the port.
ServerKey = tuple[str, IpAddress, int]


@dataclass
class _KeptServer:
    server: Server
    last_probe: float  # monotonic clock


@dataclass
class _Kept:
    target: Target
    server: ServerKey
    last_probe: float  # monotonic clock


class DiscoveredTargets:
    """Targets by their normalised name (HOST:PORT or HOST:PORT/DBNAME), made on their first
    probe, and the servers they read, by the address checked when each was made.

    A target is refused before anything connects: an unknown module, a malformed target,
    a name that does not resolve, an address outside the module's allow-list, or one more
    target than `max`. The probes of a server's databases share one server: one connection
    (to the module's `dbname`, whichever database a probe names) and one collection; a
    database the server does not have is refused once a collection has listed them, with
    no connection of its own. Two addresses found to reach one server (Directory) read it
    once. A target is made anew when its name comes to resolve elsewhere.
    """

    def __init__(
        self,
        pool: CollectionPool,
        watchdog: Watchdog,
        modules: Mapping[str, AuthModuleSettings],
        settings: DiscoveredTargetsSettings,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._pool = pool
        self._watchdog = watchdog
        self._clock = clock
        # Each module with its allow-list, parsed here and on reload rather than per probe.
        self._modules = _with_allow_lists(modules)
        self._settings = settings
        self._lock = threading.Lock()
        # By module and name: two modules that name one server each keep their own.
        self._kept: dict[tuple[str, str], _Kept] = {}
        self._servers: dict[ServerKey, _KeptServer] = {}
        self._directories: dict[str, Directory[Server]] = {}  # by module
        self._made = itertools.count()  # the order targets are made in: part of their rank
        self._refusals = dict.fromkeys(Refusal, 0)
        self._stop = threading.Event()
        self._sweeper: threading.Thread | None = None

    def probe(
        self, target: str, module_name: str, timeout: float | None = None
    ) -> Target | ProbeRefused:
        """The target to collect for this probe, or why it is refused; within `timeout`
        seconds (the scrape's) when it must wait for its server's list of databases."""
        found = self._modules.get(module_name)
        if found is None:
            known = ", ".join(self._modules) or "none are configured"
            return self._refuse(
                Refusal.UNKNOWN_AUTH_MODULE, f"unknown auth_module {module_name!r} ({known})"
            )
        module, allowed = found
        try:
            address = parse_target(target)
        except Refused as exc:
            return self._refuse(Refusal.MALFORMED_TARGET, str(exc))
        refused = f"{address.name} is not in the allowed_targets of auth module {module.name!r}"
        # A name that no entry could allow is not even looked up.
        if isinstance(address.host, str) and not allowed.may_resolve(address.host, address.port):
            return self._refuse(Refusal.NOT_ALLOWED, refused)
        try:
            addresses = resolve(address, RESOLVE_WAIT)
        except Refused as exc:
            return self._refuse(Refusal.NOT_RESOLVED, str(exc))
        if not allowed.admits(address, addresses):
            shown = ", ".join(map(str, addresses))
            return self._refuse(Refusal.NOT_ALLOWED, f"{refused} (it resolves to {shown})")
        return self._keep(module, address, addresses, timeout)

    def _keep(
        self,
        module: AuthModuleSettings,
        address: TargetAddress,
        addresses: list[IpAddress],
        timeout: float | None,
    ) -> Target | ProbeRefused:
        key = (module.name, address.name)
        found = self._kept_or_server(key, module, address, addresses)
        if not isinstance(found, tuple):
            return found
        server_key, server = found
        if address.dbname is not None and not self._has_database(server, address, timeout):
            # Nothing kept for it: a flood of made-up names costs the server nothing.
            return self._no_database(address)
        return self._made_target(key, module, address, server_key, server)

    def _kept_or_server(
        self,
        key: tuple[str, str],
        module: AuthModuleSettings,
        address: TargetAddress,
        addresses: list[IpAddress],
    ) -> Target | ProbeRefused | tuple[ServerKey, Server]:
        """The kept target, or the server to make it on (ProbeRefused past the cap)."""
        now = self._clock()
        gone = None
        with self._lock:
            kept = self._kept.get(key)
            # Kept while its name still resolves to the address its server was checked at
            # (a name with several, in an order that changes, keeps its server): its module
            # is the same (update() closes the targets of one that changed), so its settings.
            server_kept = None if kept is None else self._servers.get(kept.server)
            if kept is None or server_kept is None or kept.server[1] not in addresses:
                found = self._server(module, address, addresses, now, new_target=kept is None)
            else:
                found = None
                kept.last_probe = server_kept.last_probe = now
                databases = server_kept.server.reading_server().databases()
                if address.dbname is None or databases is None or address.dbname in databases:
                    return kept.target
                # Kept while the server could not be read, or dropped since: forgotten.
                gone = self._kept.pop(key).target
        if gone is not None:
            self._close([gone], "its server has no such database")
            return self._no_database(address)
        return self._full(address) if found is None else found

    def _made_target(
        self,
        key: tuple[str, str],
        module: AuthModuleSettings,
        address: TargetAddress,
        server_key: ServerKey,
        server: Server,
    ) -> Target | ProbeRefused:
        """A new target on the server, in place of one whose name resolved elsewhere."""
        with self._lock:
            kept = self._kept.get(key)
            if kept is not None and kept.server == server_key:  # made meanwhile
                return kept.target
            full = kept is None and len(self._kept) >= self._settings.max
            if not full:
                target = self._new_target(address, server)
                self._kept[key] = _Kept(target, server_key, self._clock())
                self._start_sweeping()
        if full:
            return self._full(address)
        if kept is not None:
            self._close([kept.target], "its host name resolves to another address now")
        log.info("discovered target", extra={"target": address.name, "auth_module": module.name})
        return target

    def _new_target(self, address: TargetAddress, server: Server) -> Target:
        return probed_target(address.name, server, address.dbname, next(self._made))

    def _no_database(self, address: TargetAddress) -> ProbeRefused:
        return self._refuse(
            Refusal.NO_SUCH_DATABASE,
            f"{address.server} has no database {address.dbname!r} (templates are not "
            "collected); the databases are read from its last collection",
        )

    def _full(self, address: TargetAddress) -> ProbeRefused:
        return self._refuse(
            Refusal.LIMIT_REACHED,
            f"{self._settings.max} discovered targets or servers are kept "
            f"(discovered_targets.max): {address.name} is refused until one is idle for "
            "discovered_targets.idle_after",
        )

    def _server(
        self,
        module: AuthModuleSettings,
        address: TargetAddress,
        addresses: list[IpAddress],
        now: float,
        new_target: bool,
    ) -> tuple[ServerKey, Server] | None:
        """With the lock held: the server kept for one of these addresses, or a new one;
        None at the cap (`max` counts targets and servers apart)."""
        for candidate in addresses:
            key = (module.name, candidate, address.port)
            found = self._servers.get(key)
            if found is not None:
                found.last_probe = now
                return key, found.server
        if len(self._servers) >= self._settings.max or (
            new_target and len(self._kept) >= self._settings.max
        ):
            return None
        pinned = addresses[0]
        key = (module.name, pinned, address.port)
        directory = self._directories.setdefault(module.name, Directory())
        server = Server(module.target(address, pinned), self._pool, self._watchdog, directory)
        self._servers[key] = _KeptServer(server, now)
        self._start_sweeping()
        return key, server

    def _has_database(self, server: Server, address: TargetAddress, timeout: float | None) -> bool:
        """Whether the server has the database: known from its last collection, or from one
        made now (urgent, bounded by its deadline and the scrape's `timeout`); unknown, when
        it cannot be read, counts as yes (the probe then reports it down)."""
        databases = server.reading_server().databases()
        if databases is None or address.dbname not in databases:
            pending = server.begin(urgent=True)  # the last one, if it is recent
            if isinstance(pending, Future):
                wait = server.settings.collection_deadline
                if timeout is not None:
                    wait = min(wait, timeout)
                with suppress(FutureTimeout, CancelledError):
                    pending.exception(timeout=max(wait, 0.0))
            databases = server.reading_server().databases()
        return databases is None or address.dbname in databases

    def _refuse(self, refusal: Refusal, message: str) -> ProbeRefused:
        with self._lock:
            self._refusals[refusal] += 1
        # The caller reads why in the answer, the operator in the counter: a target that
        # Prometheus keeps probing in vain must not fill the log.
        log.debug("probe refused", extra={"reason": refusal.reason, "error": message})
        return ProbeRefused(refusal, message)

    def update(
        self, modules: Mapping[str, AuthModuleSettings], settings: DiscoveredTargetsSettings
    ) -> None:
        """Take a reloaded configuration: a module removed or changed closes its targets
        and servers (the next probe checks them against the module as it is now)."""
        with self._lock:
            changed = {n for n, (m, _) in self._modules.items() if modules.get(n) != m}
            self._modules, self._settings = _with_allow_lists(modules), settings
            closed = [self._kept.pop(k).target for k in list(self._kept) if k[0] in changed]
            servers = [self._servers.pop(k).server for k in list(self._servers) if k[0] in changed]
            for name in changed:
                self._directories.pop(name, None)
        self._close(closed, "its auth module changed")
        for server in servers:
            server.close()

    def sweep(self) -> None:
        """Close and forget the targets, and the servers, not probed for idle_after."""
        now = self._clock()
        with self._lock:
            idle_after = self._settings.idle_after
            idle = [k for k, kept in self._kept.items() if now - kept.last_probe >= idle_after]
            closed = [self._kept.pop(key).target for key in idle]
            gone = [k for k, kept in self._servers.items() if now - kept.last_probe >= idle_after]
            servers = [self._servers.pop(key).server for key in gone]
        self._close(closed, "not probed for discovered_targets.idle_after")
        for server in servers:
            server.close()

    def _close(self, targets: Iterable[Target], why: str) -> None:
        for target in targets:
            log.info("discovered target forgotten", extra={"target": target.name, "why": why})
            target.close()

    def _start_sweeping(self) -> None:
        """With the lock held: the sweeper starts with the first target."""
        if self._sweeper is None:
            self._sweeper = threading.Thread(target=self._sweep_forever, name="sweep", daemon=True)
            self._sweeper.start()

    def _sweep_forever(self) -> None:
        # Often enough that a target is closed within a quarter of idle_after of its time.
        while not self._stop.wait(min(60.0, self._settings.idle_after / 4)):
            self.sweep()

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            closed = [kept.target for kept in self._kept.values()]
            servers = [kept.server for kept in self._servers.values()]
            self._kept.clear()
            self._servers.clear()
        for target in closed:
            target.close()
        for server in servers:
            server.close()

    def samples(self) -> list[Sample]:
        with self._lock:
            count, refusals = len(self._kept), dict(self._refusals)
            servers = len({id(kept.server.reading_server()) for kept in self._servers.values()})
        return [
            Sample("pg_advisory_exporter_discovered_targets", (), count),
            Sample("pg_advisory_exporter_discovered_servers", (), servers),
        ] + [
            Sample("pg_advisory_exporter_probe_refusals_total", (refusal.reason,), total)
            for refusal, total in refusals.items()
        ]


def _with_allow_lists(
    modules: Mapping[str, AuthModuleSettings],
) -> dict[str, tuple[AuthModuleSettings, AllowList]]:
    return {name: (module, module.allow_list()) for name, module in modules.items()}


class DiscoveredCollector(Collector):
    """How many discovered targets and servers are kept, and the probes refused: on /metrics
    (their series are served by their probes only)."""

    def __init__(self, discovered: DiscoveredTargets) -> None:
        self._discovered = discovered

    def describe(self) -> Iterable[Metric]:
        return ()

    def collect(self) -> Iterable[Metric]:
        return families(self._discovered.samples())
