"""The running exporter: targets, registry and HTTP server, started, reloaded and stopped."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Hashable, Mapping, Sequence

from prometheus_client import CollectorRegistry, ProcessCollector

from . import __version__, logs
from .collect.arrangement import Arrangement, arrange, connects_as
from .collect.directory import Directory, Rank
from .collect.pg_stat_statements import READERS_POOL
from .collect.scheduling import CollectionPool, Watchdog
from .collect.server import Server
from .collect.target import Target
from .config.exporter_settings import split_listen_address
from .config.settings import Config, TargetSettings
from .forensics.answers import Answer, OnDemand, on_demand
from .http.app import make_app
from .http.collector import ExporterCollector
from .http.discovered import DiscoveredCollector, DiscoveredTargets, ProbeRefused
from .http.server import serve
from .http.web_access import WebAccess
from .http.web_config import WebSettings
from .metrics import Sample, config_reload
from .validation import ConfigError

log = logging.getLogger(__name__)


class Daemon:
    """Binds the listen address on creation (so a taken port fails at once).

    `reread` gives the configuration anew for a reload (SIGHUP or POST /-/reload); `web`
    is the web configuration file, read (and then watched for changes) apart from it.
    """

    def __init__(
        self,
        config: Config,
        reread: Callable[[], Config] | None = None,
        web: WebSettings | None = None,
    ) -> None:
        self.config = config
        self._reread = reread
        # Bounded: a fleet of servers never opens more than this many collections at once.
        self.pool = CollectionPool(config.max_parallel_collections)
        self._watchdog = Watchdog()  # every collection's deadline
        self._reload_lock = threading.Lock()
        # The last reload's outcome, and when the configuration last took effect (the start
        # first): one tuple, replaced whole, for the scrapes that read it meanwhile.
        self._reloaded: tuple[bool, float] = (True, time.time())
        # The configured targets' servers by identity: two targets that reach one server
        # under two names read it once.
        self._directory: Directory[Server] = Directory()
        # Another shard's targets are not connected to at all.
        self._arranged = self._arrange(_own(config), Arrangement())
        # Their /locks answers, read on request only: a reload that changes a target makes
        # a new Target, and with it new answers.
        self._locks = self._answers(self._arranged.targets, {})
        for note in config.notes:
            log.warning(note)
        # The servers that probes name through an auth module; never in /metrics.
        self._discovered = DiscoveredTargets(
            self.pool, self._watchdog, config.auth_modules, config.discovered_targets
        )
        self._access = None if web is None else WebAccess(web)
        self.collectors = CollectorRegistry()  # prometheus_client's, not the key registry
        web_samples = None if self._access is None else self._access.samples
        config_samples = None if config.config_file is None else self._reload_samples
        self.collectors.register(
            ExporterCollector(
                self.targets, self.pool, lambda: self.config.shard, web_samples, config_samples
            )
        )
        if not config.web.disable_exporter_metrics:
            ProcessCollector(registry=self.collectors)
        self.collectors.register(DiscoveredCollector(self._discovered))
        host, port = split_listen_address(config.web.listen_address)
        self._server = serve(make_app(self), host, port, self._access, config.web.systemd_socket)
        self._thread: threading.Thread | None = None
        self._serving = threading.Event()

    def _arrange(self, configs: Sequence[TargetSettings], old: Arrangement) -> Arrangement:
        """The targets of this shard on their servers (collect/arrangement.py)."""

        def make_target(config: TargetSettings, server: Server, rank: Rank) -> Target:
            return Target(config, self.config.web.external_url, server=server, rank=rank)

        return arrange(configs, old, self._make_server, make_target, self._server_key)

    def _make_server(self, config: TargetSettings) -> Server:
        return Server(config, self.pool, self._watchdog, self._directory)

    def _server_key(self, config: TargetSettings) -> Hashable:
        """Targets alike in this share a server."""
        return connects_as(config)

    def discover(
        self, target: str, auth_module: str, timeout: float | None = None
    ) -> Target | ProbeRefused:
        """The target a probe names through an auth module, or why it is refused."""
        return self._discovered.probe(target, auth_module, timeout)

    @property
    def telemetry_path(self) -> str:
        return self.config.web.telemetry_path

    @property
    def lifecycle_enabled(self) -> bool:
        return self.config.web.enable_lifecycle

    @property
    def max_requests(self) -> int:
        return self.config.web.max_requests

    def targets(self) -> list[Target]:
        return list(self._arranged.targets.values())

    def target(self, name: str) -> Target | None:
        return self._arranged.targets.get(name)

    def elsewhere(self, name: str) -> str | None:
        """Why a configured target of another shard is not served here; None for the others.

        Only its own replica connects to it, so a server never gets a second connection.
        """
        shard = self.config.shard
        if name in self._arranged.targets or all(t.name != name for t in self.config.targets):
            return None
        return (
            f"target {name!r} is collected by shard {shard.owner(name)} of {shard.total}; "
            f"this exporter is shard {shard.index}: ask that replica"
        )

    def locks(self, name: str) -> tuple[Answer, float] | None:
        """The target's holders and waiters, and the answer's age (forensics.OnDemand: read
        in the caller's thread, a /locks request's, never on the collection pool); None for
        an unknown name."""
        answers = self._locks.get(name)
        return None if answers is None else answers.get()

    def _answers(
        self, targets: Mapping[str, Target], old: Mapping[str, tuple[Target, OnDemand]]
    ) -> dict[str, OnDemand]:
        """The /locks answers of each target, kept where the target is."""
        answers = {}
        for name, target in targets.items():
            kept = old.get(name)
            if kept is not None and kept[0] is target:
                answers[name] = kept[1]
            else:
                answers[name] = on_demand(
                    target.config, target.server, self._watchdog, target.statements, target.holds
                )
        return answers

    def reload(self) -> str | None:
        """Read the configuration again; None when it took effect, else why it did not.

        Targets whose configuration is unchanged keep their connection and their last
        collection, so their series go on without a gap. An invalid configuration is
        refused and the running one stays.
        """
        if self._reread is None:
            return "this exporter was started without a configuration to reread"
        with self._reload_lock:
            try:
                config = self._reread()
            except ConfigError as exc:
                log.error(
                    "reload refused; the running configuration stays", extra={"error": str(exc)}
                )
                self._reloaded = (False, self._reloaded[1])
                return str(exc)
            except Exception:  # a bug must not take down the exporter that is running
                log.exception("reload failed; the running configuration stays")
                self._reloaded = (False, self._reloaded[1])
                return "internal error, see the exporter's log"
            self._apply(config)
            self._reloaded = (True, time.time())
        return None

    def _reload_samples(self) -> list[Sample]:
        """pg_advisory_exporter_config_last_reload_*: the last reload's outcome, and when
        the configuration file last took effect."""
        return config_reload(*self._reloaded)

    def _apply(self, config: Config) -> None:
        for setting in ("web", "max_parallel_collections"):
            if getattr(config, setting) != getattr(self.config, setting):
                log.warning(
                    "a reload cannot change this; restart to apply", extra={"setting": setting}
                )
        logs.setup(config.log.level, config.log.format)
        for note in config.notes:
            log.warning(note)
        arranged = self._arranged
        old = arranged.targets
        answers = {name: (old[name], self._locks[name]) for name in old}
        new = self._arrange(_own(config), arranged)
        self._locks = self._answers(new.targets, answers)
        self._arranged = new  # one assignment: a scrape sees the old set or the new one
        self.config = dataclasses.replace(
            config,
            web=self.config.web,
            max_parallel_collections=self.config.max_parallel_collections,
        )
        self._discovered.update(config.auth_modules, config.discovered_targets)
        new.close_unused(arranged)
        now = new.targets
        log.info(
            "configuration reloaded",
            extra={
                "targets": ",".join(now),
                "added": ",".join(n for n in now if n not in old),
                "removed": ",".join(n for n in old if n not in now),
                "changed": ",".join(n for n in now if n in old and now[n] is not old[n]),
                "shard": f"{config.shard.index}/{config.shard.total}",
            },
        )

    @property
    def url(self) -> str:
        """The metrics URL, as a local client reaches it."""
        host, port = str(self._server.server_address[0]), self._server.server_address[1]
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"
        host = f"[{host}]" if ":" in host else host
        scheme = "https" if self._access is not None and self._access.tls else "http"
        return f"{scheme}://{host}:{port}{self.telemetry_path}"

    def serve_forever(self) -> None:
        log.info(
            "listening",
            extra={
                "address": (
                    "systemd socket {}:{}".format(*self._server.server_address[:2])
                    if self.config.web.systemd_socket
                    else self.config.web.listen_address
                ),
                "telemetry_path": self.telemetry_path,
                "targets": ",".join(self._arranged.targets),
                "shard": f"{self.config.shard.index}/{self.config.shard.total}",
                "web_config": "none" if self._access is None else self._access.current().summary,
                "version": __version__,
            },
        )
        self._serving.set()
        try:
            self._server.serve_forever()
        finally:
            self._close()

    def start(self) -> None:
        """Serve from a background thread."""
        self._thread = threading.Thread(target=self.serve_forever, name="http", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        """Stop serving (or just close, if it never served); call it from any thread."""
        if not self._serving.is_set():
            self._close()
            return
        self._server.shutdown()
        if self._thread is not None:
            self._thread.join()

    def _close(self) -> None:
        self._server.server_close()
        self.pool.shutdown()
        self._arranged.close()
        self._discovered.close()
        READERS_POOL.shutdown()


def _own(config: Config) -> list[TargetSettings]:
    """The configured targets of this replica's shard."""
    return [t for t in config.targets if config.shard.owns(t.name)]
