"""The running exporter: targets, registry and HTTP server, started and stopped together."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor

from prometheus_client import CollectorRegistry, ProcessCollector

from . import __version__
from .collector import ExporterCollector
from .config import Config, split_listen_address
from .http import make_app, serve
from .target import Target

log = logging.getLogger(__name__)


class Daemon:
    """Binds the listen address on creation (so a taken port fails at once)."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self._executor = ThreadPoolExecutor(
            max_workers=len(config.targets), thread_name_prefix="collect"
        )
        self.targets = [Target(target, self._executor) for target in config.targets]
        self.registry = CollectorRegistry()
        self.registry.register(ExporterCollector(self.targets))
        ProcessCollector(registry=self.registry)
        host, port = split_listen_address(config.web.listen_address)
        app = make_app(self.registry, config.web.telemetry_path, self.targets)
        self._server = serve(app, host, port)
        self._thread: threading.Thread | None = None
        self._serving = threading.Event()

    @property
    def url(self) -> str:
        """The metrics URL, as a local client reaches it."""
        host, port = str(self._server.server_address[0]), self._server.server_address[1]
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{port}{self.config.web.telemetry_path}"

    def serve_forever(self) -> None:
        log.info(
            "listening",
            extra={
                "address": self.config.web.listen_address,
                "telemetry_path": self.config.web.telemetry_path,
                "targets": ",".join(t.name for t in self.targets),
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
        self._executor.shutdown(wait=False, cancel_futures=True)
        for target in self.targets:
            target.close()
