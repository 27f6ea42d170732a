"""The WSGI app: a handler per endpoint (metrics, probe, locks, landing page, health, reload)."""

from __future__ import annotations

import html
import json
import math
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any, Protocol
from urllib.parse import parse_qs, quote, urlsplit

from prometheus_client import CollectorRegistry, make_wsgi_app

from pg_advisory_exporter import __version__
from pg_advisory_exporter.collect.scheduling import CollectionPool
from pg_advisory_exporter.collect.target import Target
from pg_advisory_exporter.endpoints import (
    HEALTH_PATH,
    HEALTHY_PATH,
    LANDING_PATH,
    LOCKS_PATH,
    PROBE_PATH,
    READY_PATH,
    RELOAD_PATH,
)
from pg_advisory_exporter.forensics.answers import Answer
from pg_advisory_exporter.forensics.page import CONTENT_SECURITY_POLICY, render

from .collector import ProbeCollector, ScrapeContext, current_scrape
from .discovered import ProbeRefused
from .web_access import StartResponse, WsgiApp


class Exported(Protocol):
    """What the endpoints need from the running exporter."""

    collectors: CollectorRegistry  # prometheus_client's, not the key registry
    pool: CollectionPool

    @property
    def telemetry_path(self) -> str: ...

    @property
    def lifecycle_enabled(self) -> bool: ...

    @property
    def max_requests(self) -> int:
        """Scrapes of the metrics path answered at once (--web.max-requests); 0: no limit."""
        ...

    def targets(self) -> list[Target]: ...

    def target(self, name: str) -> Target | None: ...

    def reload(self) -> str | None: ...

    def locks(self, name: str) -> tuple[Answer, float] | None: ...

    def discover(
        self, target: str, auth_module: str, timeout: float | None = None
    ) -> Target | ProbeRefused: ...

    def elsewhere(self, name: str) -> str | None:
        """Why a configured target of another shard is not served here."""
        ...


def _landing_page(telemetry_path: str, targets: Sequence[Target]) -> bytes:
    names = "".join(
        f'<li><code>{html.escape(t.name)}</code> (<a href="{PROBE_PATH}?target='
        f'{html.escape(quote(t.name))}">probe</a>, <a href="{LOCKS_PATH}?target='
        f'{html.escape(quote(t.name))}">locks</a>)</li>'
        for t in targets
    )
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>pg-advisory-exporter</title></head>
<body>
<h1>pg-advisory-exporter {html.escape(__version__)}</h1>
<p>Prometheus exporter for PostgreSQL advisory locks.</p>
<ul>
<li><a href="{html.escape(telemetry_path)}">Metrics</a> (every target)</li>
<li><a href="{HEALTH_PATH}">Health</a> (the last collection of each target)</li>
<li><a href="{HEALTHY_PATH}">{HEALTHY_PATH}</a> (liveness) and
<a href="{READY_PATH}">{READY_PATH}</a> (readiness)</li>
</ul>
<h2>Targets</h2>
<ul>{names}</ul>
</body></html>
""".encode()


def _health(targets: Sequence[Target]) -> tuple[str, bytes]:
    reports = [target.health() for target in targets]
    # A target not collected yet is not failing, and not known to be fine either.
    failing = [r.target for r in reports if r.last_collection_unix is not None and not r.up]
    pending = [r.target for r in reports if r.last_collection_unix is None]
    body = {
        "status": "failing" if failing else ("not yet collected" if pending else "ok"),
        "targets": [
            {
                "target": r.target,
                "up": r.up,
                "collected": r.last_collection_unix is not None,
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


def _text(start_response: StartResponse, status: str, message: str) -> list[bytes]:
    start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
    return [f"{message}\n".encode()]


def _wants_json(environ: dict[str, Any], query: dict[str, list[str]]) -> bool | None:
    """JSON for `format=json` or a client that accepts it and not HTML; None: a bad format."""
    formats = query.get("format", [])
    if formats:
        return {"json": True, "html": False}.get(formats[-1])
    accept = environ.get("HTTP_ACCEPT", "")
    return "application/json" in accept and "text/html" not in accept


def _locks_answer(
    start_response: StartResponse, name: str, reply: tuple[Answer, float], as_json: bool
) -> list[bytes]:
    answer, age = reply
    # Rendered by the first request that gets this answer in this format, for all of them.
    page = answer.made(("page", as_json), lambda made: render(name, made, as_json))
    body = page.body(age)
    # Who holds what, from where, maybe with query text: no cache may keep it.
    start_response(
        page.status,
        [
            ("Content-Type", page.content_type),
            ("Content-Length", str(sum(map(len, body)))),
            ("Cache-Control", "no-store"),
            ("Content-Security-Policy", CONTENT_SECURITY_POLICY),
        ],
    )
    return body


# The most /locks requests answered at once, across targets; the others are told at once to
# come back (429 and Retry-After) rather than wait. Requests for an answer already read take
# a slot for microseconds; those that wait for a server that hangs take one for up to its
# deadline, and without a cap would take every thread and connection of the exporter.
LOCKS_AT_ONCE = 8


# Reading is GET (and HEAD, which sends no body); only a change of state is POST.
_READ = ("GET", "HEAD")


def make_app(exported: Exported) -> WsgiApp:
    return _Endpoints(exported)


class _Endpoints:
    """The WSGI app: each request routed by its path to the handler of that endpoint, a
    method each."""

    def __init__(self, exported: Exported) -> None:
        self.exported = exported
        # prometheus_client's app: content negotiation, gzip and name[] filters.
        self.metrics_app = make_wsgi_app(exported.collectors)
        self.locks_at_once = threading.BoundedSemaphore(LOCKS_AT_ONCE)
        limit = exported.max_requests
        self.scrapes_at_once = threading.BoundedSemaphore(limit) if limit else None
        self.routes: dict[str, tuple[tuple[str, ...], WsgiApp]] = {
            exported.telemetry_path: (_READ, self._limited(self.metrics)),
            PROBE_PATH: (_READ, self.probe),
            LOCKS_PATH: (_READ, self.locks),
            LANDING_PATH: (_READ, self.landing),
            HEALTH_PATH: (_READ, self.health),
            HEALTHY_PATH: (_READ, _alive),
            READY_PATH: (_READ, _alive),  # the configuration is loaded once anything is served
            RELOAD_PATH: (("POST",), self.reload),
        }

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        route = self.routes.get(environ.get("PATH_INFO", "/"))
        if route is None:
            return _text(
                start_response, "404 Not Found", f"not found; try {self.exported.telemetry_path}"
            )
        methods, handler = route
        method = environ.get("REQUEST_METHOD", "GET")
        if method not in methods:
            start_response(
                "405 Method Not Allowed",
                [("Allow", ", ".join(methods)), ("Content-Type", "text/plain; charset=utf-8")],
            )
            return [f"use {' or '.join(methods)}\n".encode()]
        if method != "HEAD":
            return handler(environ, start_response)
        # The same answer as GET without its body (prometheus_client's app refuses HEAD).
        handler({**environ, "REQUEST_METHOD": "GET"}, start_response)
        return []

    def _limited(self, handler: WsgiApp) -> WsgiApp:
        """The metrics handler within --web.max-requests, as promhttp's MaxRequestsInFlight:
        past it, 503 at once, never a queue that a scrape's timeout runs out in. Not /probe:
        a fleet's Prometheus probes each of its targets at once, one request each, as it
        does a blackbox exporter's."""
        limit = self.scrapes_at_once
        if limit is None:
            return handler

        def limited(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
            if not limit.acquire(blocking=False):
                return _text(
                    start_response,
                    "503 Service Unavailable",
                    f"limit of concurrent requests reached ({self.exported.max_requests}), "
                    "try again later",
                )
            try:
                return handler(environ, start_response)
            finally:
                limit.release()

        return limited

    def metrics(self, environ: dict[str, Any], start_response: StartResponse) -> list[bytes]:
        return _exposition(self.metrics_app, environ, start_response)

    def probe(self, environ: dict[str, Any], start_response: StartResponse) -> list[bytes]:
        # A name from the configuration, or a host that an auth module's allow-list admits:
        # a host or a DSN taken as it comes would let anyone who can reach the exporter
        # make it connect anywhere.
        query = parse_qs(environ.get("QUERY_STRING", ""))
        names, modules = query.get("target", []), query.get("auth_module", [])
        if len(names) != 1 or len(modules) > 1:
            return _text(
                start_response,
                "400 Bad Request",
                "give one ?target=NAME, or ?target=HOST[:PORT][/DBNAME]&auth_module=MODULE",
            )
        started = time.monotonic()
        target = (
            self.exported.discover(names[0], modules[0], _scrape_timeout(environ))
            if modules
            else self.exported.target(names[0])
        )
        if target is None:
            return self._unknown(start_response, PROBE_PATH, names[0])
        if isinstance(target, ProbeRefused):  # before any connection for it
            return _text(start_response, target.refusal.status, target.message)
        registry = CollectorRegistry()
        registry.register(ProbeCollector(target, self.exported.pool))
        spent = time.monotonic() - started  # a discovered server's first list of databases
        return _exposition(make_wsgi_app(registry), environ, start_response, spent)

    def locks(self, environ: dict[str, Any], start_response: StartResponse) -> list[bytes]:
        # Read on request only, in this request's thread, at most once per reuse_for: the
        # daemon's OnDemand answers the requests that come close together from one read.
        query = parse_qs(environ.get("QUERY_STRING", ""))
        names = query.get("target", [])
        if len(names) != 1:
            return _text(start_response, "400 Bad Request", "give one ?target=NAME")
        as_json = _wants_json(environ, query)
        if as_json is None:
            return _text(start_response, "400 Bad Request", "format is json or html")
        target = self.exported.target(names[0])
        if target is None:
            return self._unknown(start_response, LOCKS_PATH, names[0])
        if not self.locks_at_once.acquire(blocking=False):
            return _too_many_locks_requests(start_response, target)
        try:
            reply = self.exported.locks(names[0])
            if reply is None:  # removed by a reload meanwhile
                return self._unknown(start_response, LOCKS_PATH, names[0])
            return _locks_answer(start_response, names[0], reply, as_json)
        finally:
            self.locks_at_once.release()  # the answer is sent after: its bytes are shared

    def reload(self, environ: dict[str, Any], start_response: StartResponse) -> list[bytes]:
        if not self.exported.lifecycle_enabled:
            return _text(
                start_response,
                "403 Forbidden",
                "the lifecycle API is off: start with --web.enable-lifecycle to reload over "
                "HTTP (SIGHUP reloads either way)",
            )
        # A web page elsewhere can make a browser POST here (no preflight for a form): its
        # Origin names that page. Tools such as curl send none.
        origin = environ.get("HTTP_ORIGIN")
        if origin is not None and urlsplit(origin).netloc != environ.get("HTTP_HOST"):
            return _text(
                start_response,
                "403 Forbidden",
                f"a request from the web page of {origin} cannot reload the exporter",
            )
        error = self.exported.reload()
        if error is not None:
            return _text(start_response, "500 Internal Server Error", f"reload refused: {error}")
        return _text(start_response, "200 OK", "reloaded")

    def landing(self, environ: dict[str, Any], start_response: StartResponse) -> list[bytes]:
        start_response("200 OK", [("Content-Type", "text/html; charset=utf-8")])
        return [_landing_page(self.exported.telemetry_path, self.exported.targets())]

    def health(self, environ: dict[str, Any], start_response: StartResponse) -> list[bytes]:
        status, body = _health(self.exported.targets())
        start_response(status, [("Content-Type", "application/json")])
        return [body]

    def _unknown(self, start_response: StartResponse, path: str, name: str) -> list[bytes]:
        elsewhere = self.exported.elsewhere(name)
        if elsewhere is not None:  # never collected here: a second connection to its server
            return _text(start_response, "404 Not Found", elsewhere)
        known = ", ".join(t.name for t in self.exported.targets())
        return _text(
            start_response,
            "404 Not Found",
            f"unknown target {name!r}: {path} takes the name of a configured target "
            f"({known}), never a host or a DSN",
        )


def _alive(environ: dict[str, Any], start_response: StartResponse) -> list[bytes]:
    # Serving this answer is the proof: a database that is down never fails it.
    return _text(start_response, "200 OK", "OK")


def _exposition(
    app: WsgiApp, environ: dict[str, Any], start_response: StartResponse, spent: float = 0.0
) -> list[bytes]:
    """prometheus_client's answer, its collections within the scrape's timeout less `spent`
    (seconds of it already used before the collection)."""
    timeout = _scrape_timeout(environ)
    scrape = ScrapeContext(timeout=None if timeout is None else timeout - spent)
    token = current_scrape.set(scrape)
    try:
        with scrape.rendering:
            return list(app(environ, start_response))
    finally:
        current_scrape.reset(token)


def _too_many_locks_requests(start_response: StartResponse, target: Target) -> list[bytes]:
    # By then the answer being read is there to reuse, or the next read is due.
    retry = max(1, math.ceil(target.config.locks_page.reuse_for))
    start_response(
        "429 Too Many Requests",
        [("Retry-After", str(retry)), ("Content-Type", "text/plain; charset=utf-8")],
    )
    return [f"{LOCKS_AT_ONCE} /locks requests are being answered; retry in {retry}s\n".encode()]
