"""The targets that probes name through an auth module: checked, kept like configured ones,
forgotten when no probe has asked for them for a while, and counted."""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from .config import AuthModuleSettings, DiscoveredTargetsSettings, TargetSettings
from .discovery import AllowList, IpAddress, Refused, TargetAddress, parse_target, resolve
from .metrics import Sample, families
from .target import Target

log = logging.getLogger(__name__)

# The longest a probe waits for its host name to resolve; it is refused after that.
RESOLVE_WAIT = 2.0


class Refusal(enum.Enum):
    """Why a probe of a discovered target was refused: the `reason` label and the answer."""

    UNKNOWN_AUTH_MODULE = "404 Not Found"
    MALFORMED_TARGET = "400 Bad Request"
    NOT_RESOLVED = "502 Bad Gateway"
    NOT_ALLOWED = "403 Forbidden"
    LIMIT_REACHED = "503 Service Unavailable"

    @property
    def status(self) -> str:
        return str(self.value)

    @property
    def reason(self) -> str:
        return self.name.lower()


@dataclass(frozen=True)
class ProbeRefused:
    """A probe that was refused: what to answer, and nothing was connected to."""

    refusal: Refusal
    message: str


@dataclass
class _Kept:
    target: Target
    pinned: IpAddress  # the checked address it connects to
    last_probe: float  # monotonic clock


class DiscoveredTargets:
    """Targets by their normalised name (HOST:PORT/DBNAME), made on their first probe.

    A target is refused before anything connects: an unknown module, a malformed target,
    a name that does not resolve, an address outside the module's allow-list, or one more
    target than `max`. A kept target is connected to the address checked when it was made,
    and made anew if its name comes to resolve elsewhere.
    """

    def __init__(
        self,
        make_target: Callable[[TargetSettings], Target],
        modules: Mapping[str, AuthModuleSettings],
        settings: DiscoveredTargetsSettings,
    ) -> None:
        self._make_target = make_target
        # Each module with its allow-list, parsed here and on reload rather than per probe.
        self._modules = _with_allow_lists(modules)
        self._settings = settings
        self._lock = threading.Lock()
        # By module and name: two modules that name one server each keep their own.
        self._kept: dict[tuple[str, str], _Kept] = {}
        self._refusals = dict.fromkeys(Refusal, 0)
        self._stop = threading.Event()
        self._sweeper: threading.Thread | None = None

    def probe(self, target: str, module_name: str) -> Target | ProbeRefused:
        """The target to collect for this probe, or why it is refused."""
        found = self._modules.get(module_name)
        if found is None:
            known = ", ".join(self._modules) or "none are configured"
            return self._refuse(
                Refusal.UNKNOWN_AUTH_MODULE, f"unknown auth_module {module_name!r} ({known})"
            )
        module, allowed = found
        try:
            address = parse_target(target, module.dbname)
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
        return self._keep(module, address, addresses)

    def _keep(
        self, module: AuthModuleSettings, address: TargetAddress, addresses: list[IpAddress]
    ) -> Target | ProbeRefused:
        now = time.monotonic()
        with self._lock:
            key = (module.name, address.name)
            kept = self._kept.get(key)
            # Kept while its name still resolves to the address it is connected to (a name
            # with several, in an order that changes, keeps its connection): its module is
            # the same (update() closes the targets of one that changed), so its settings are.
            if kept is not None and kept.pinned in addresses:
                kept.last_probe = now
                return kept.target
            pinned = addresses[0]
            settings = module.target(address, pinned)
            full = kept is None and len(self._kept) >= self._settings.max
            if not full:  # new, or its name resolves elsewhere now: a new target
                target = self._make_target(settings)
                self._kept[key] = _Kept(target, pinned, now)
                self._start_sweeping()
        if full:
            return self._refuse(
                Refusal.LIMIT_REACHED,
                f"{self._settings.max} discovered targets are kept (discovered_targets.max): "
                f"{settings.name} is refused until one is idle for discovered_targets.idle_after",
            )
        if kept is not None:
            self._close([kept.target], "its host name resolves to another address now")
        log.info("discovered target", extra={"target": settings.name, "auth_module": module.name})
        return target

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
        (the next probe checks them against the module as it is now)."""
        with self._lock:
            changed = {n for n, (m, _) in self._modules.items() if modules.get(n) != m}
            self._modules, self._settings = _with_allow_lists(modules), settings
            gone = [key for key in self._kept if key[0] in changed]
            closed = [self._kept.pop(key).target for key in gone]
        self._close(closed, "its auth module changed")

    def sweep(self) -> None:
        """Close and forget the targets not probed for idle_after."""
        now = time.monotonic()
        with self._lock:
            idle_after = self._settings.idle_after
            idle = [k for k, kept in self._kept.items() if now - kept.last_probe >= idle_after]
            closed = [self._kept.pop(key).target for key in idle]
        self._close(closed, "not probed for discovered_targets.idle_after")

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
            self._kept.clear()
        for target in closed:
            target.close()

    def samples(self) -> list[Sample]:
        with self._lock:
            count, refusals = len(self._kept), dict(self._refusals)
        return [Sample("pg_advisory_exporter_discovered_targets", (), count)] + [
            Sample("pg_advisory_exporter_probe_refusals_total", (refusal.reason,), total)
            for refusal, total in refusals.items()
        ]


def _with_allow_lists(
    modules: Mapping[str, AuthModuleSettings],
) -> dict[str, tuple[AuthModuleSettings, AllowList]]:
    return {name: (module, module.allow_list()) for name, module in modules.items()}


class DiscoveredCollector(Collector):
    """How many discovered targets are kept, and the probes refused: on /metrics (their
    series are served by their probes only)."""

    def __init__(self, discovered: DiscoveredTargets) -> None:
        self._discovered = discovered

    def describe(self) -> Iterable[Metric]:
        return ()

    def collect(self) -> Iterable[Metric]:
        return families(self._discovered.samples())
