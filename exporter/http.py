"""The HTTP endpoints: metrics, a landing page and a health report."""

from __future__ import annotations

import html
import json
import logging
import socket
from collections.abc import Callable, Iterable, Sequence
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from . import __version__
from .collector import scrape_timeout
from .target import Target

log = logging.getLogger(__name__)

HEALTH_PATH = "/health"

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


def _landing_page(telemetry_path: str, targets: Sequence[Target]) -> bytes:
    names = "".join(f"<li><code>{html.escape(t.name)}</code></li>" for t in targets)
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>pg-advisory-exporter</title></head>
<body>
<h1>pg-advisory-exporter {html.escape(__version__)}</h1>
<p>Prometheus exporter for PostgreSQL advisory locks.</p>
<ul>
<li><a href="{html.escape(telemetry_path)}">Metrics</a></li>
<li><a href="{HEALTH_PATH}">Health</a> (the last collection of each target)</li>
</ul>
<h2>Targets</h2>
<ul>{names}</ul>
</body></html>
""".encode()


def _health(targets: Sequence[Target]) -> tuple[str, bytes]:
    reports = [target.health() for target in targets]
    # A target not collected yet is not failing: health reflects the last collection.
    failing = [r.target for r in reports if r.last_collection_unix is not None and not r.up]
    body = {
        "status": "failing" if failing else "ok",
        "targets": [
            {
                "target": r.target,
                "up": r.up,
                "last_collection_unix": r.last_collection_unix,
                "last_success_unix": r.last_success_unix,
                "duration_seconds": r.duration_seconds,
                "error": r.error,
            }
            for r in reports
        ],
    }
    status = "503 Service Unavailable" if failing else "200 OK"
    return status, json.dumps(body, indent=2).encode()


def _scrape_timeout(environ: dict[str, Any]) -> float | None:
    try:
        return float(environ["HTTP_X_PROMETHEUS_SCRAPE_TIMEOUT_SECONDS"])
    except (KeyError, ValueError):
        return None


def make_app(
    registry: CollectorRegistry, telemetry_path: str, targets: Sequence[Target]
) -> WsgiApp:
    metrics_app = make_wsgi_app(registry)  # content negotiation, gzip and name[] filters
    landing = _landing_page(telemetry_path, targets)

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == telemetry_path:
            token = scrape_timeout.set(_scrape_timeout(environ))
            try:
                exposition: Iterable[bytes] = metrics_app(environ, start_response)
                return exposition
            finally:
                scrape_timeout.reset(token)
        if path == "/":
            start_response("200 OK", [("Content-Type", "text/html; charset=utf-8")])
            return [landing]
        if path == HEALTH_PATH:
            status, body = _health(targets)
            start_response(status, [("Content-Type", "application/json")])
            return [body]
        start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
        return [f"not found; try {telemetry_path}\n".encode()]

    return app


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a scrape left hanging by its client never blocks shutdown


class _IPv6Server(_ThreadingServer):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        log.debug(format, *args)


def serve(app: WsgiApp, host: str, port: int) -> WSGIServer:
    """Bind now (so a taken port fails at start-up); the caller runs serve_forever()."""
    server_class = _IPv6Server if ":" in host else _ThreadingServer
    return make_server(host, port, app, server_class=server_class, handler_class=_QuietHandler)
