"""Discovered targets: a real Prometheus probes databases it discovers through an auth module,
and what the allow-list and the cap refuse is refused before anything connects."""

from __future__ import annotations

import json
import socket
import threading
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from support import (
    MONITOR_PASSWORD,
    Config,
    RunningExporter,
    Scrape,
    StartExporter,
    StartService,
    databases_on,
    exporter_sessions,
    monitor_module,
    prometheus_query,
    start_prometheus,
    wait_until,
)

from devtools.embedded_postgres import EmbeddedPostgres

DATABASES = [f"d{i:02}" for i in range(1, 31)]
KEPT = DATABASES[:10]


def _connections(pg: EmbeddedPostgres) -> Counter[str]:
    """The exporter's connections on the server, by database."""
    return Counter(session.datname for session in exporter_sessions(pg))


@pytest.fixture
def databases(pg: EmbeddedPostgres) -> Iterator[list[str]]:
    with databases_on(pg, DATABASES) as made:
        yield made


def _write_targets(path: Path, targets: list[str]) -> None:
    # Renamed into place: Prometheus never reads half a file.
    partial = path.with_suffix(".tmp")
    partial.write_text(json.dumps([{"targets": targets}]))
    partial.rename(path)


@pytest.mark.any_version
def test_a_real_prometheus_probes_thirty_discovered_databases(
    pg: EmbeddedPostgres,
    databases: list[str],
    start_exporter: StartExporter,
    start_service: StartService,
    tmp_path: Path,
) -> None:
    idle_after = 2.0
    exporter = start_exporter(
        config={
            "auth_modules": {"fleet": monitor_module(tmp_path, "127.0.0.1/32")},
            "discovered_targets": {"idle_after": f"{idle_after:g}s"},
        }
    )
    targets = [f"127.0.0.1:{pg.port}/{name}" for name in databases]
    targets_file = tmp_path / "databases.json"
    _write_targets(targets_file, targets)
    prometheus = start_prometheus(
        start_service,
        tmp_path,
        {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
            "scrape_configs": [
                {
                    "job_name": "pg-advisory-exporter",
                    "metrics_path": "/probe",
                    "params": {"auth_module": ["fleet"]},
                    "file_sd_configs": [{"files": [str(targets_file)]}],
                    "relabel_configs": [
                        {"source_labels": ["__address__"], "target_label": "__param_target"},
                        {"source_labels": ["__param_target"], "target_label": "instance"},
                        {
                            "target_label": "__address__",
                            "replacement": f"127.0.0.1:{exporter.port}",
                        },
                    ],
                }
            ],
        },
    )
    up: dict[str, float] = {}

    def all_up() -> bool:
        found = prometheus_query(prometheus, "pg_advisory_up")
        up.clear()
        up.update({r["metric"]["target"]: float(r["value"][1]) for r in found})
        return len(up) == len(targets) and all(value == 1 for value in up.values())

    wait_until(all_up, 60, lambda: f"every discovered target up: {up}", 0.5)
    assert sorted(up) == sorted(targets)  # target="127.0.0.1:PORT/dNN", as normalised
    # One connection for the thirty, to the module's database: none sits in theirs.
    assert _connections(pg) == {"postgres": 1}
    # Their series are their probes' only: /metrics counts them and names none.
    metrics = exporter.scrape()
    assert metrics.value("pg_advisory_exporter_discovered_targets") == len(targets)
    assert metrics.value("pg_advisory_exporter_discovered_servers") == 1
    assert not metrics.find("pg_advisory_up")

    kept = [f"127.0.0.1:{pg.port}/{name}" for name in KEPT]
    _write_targets(targets_file, kept)
    # Prometheus stops probing them within a scrape interval or two of reading the file;
    # the exporter forgets them idle_after later, and its sweep looks every idle_after / 4.
    exporter.scrape_until(
        lambda scrape: scrape.value("pg_advisory_exporter_discovered_targets") == len(KEPT),
        timeout=idle_after + 8,
    )
    assert _connections(pg) == {"postgres": 1}  # the server is still probed
    _write_targets(targets_file, [])
    wait_until(
        lambda: not _connections(pg),
        idle_after + 8,
        lambda: f"the server's connection closed once none is probed: {_connections(pg)}",
        0.1,
    )


class _Listener:
    """A port on another loopback address that records every connection made to it."""

    def __init__(self) -> None:
        self._socket = socket.create_server(("127.0.0.2", 0))
        self.port = self._socket.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._socket.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self._socket.close()


@pytest.fixture
def listener() -> Iterator[_Listener]:
    opened = _Listener()
    yield opened
    opened.close()


def _probe(exporter: RunningExporter, target: str, module: str | None = "fleet") -> int:
    query = {"target": target} | ({} if module is None else {"auth_module": module})
    return exporter.get(f"/probe?{urllib.parse.urlencode(query)}")[0]


def _refusals(scrape: Scrape) -> dict[str, float]:
    found = scrape.find("pg_advisory_exporter_probe_refusals_total")
    return {labels["reason"]: value for labels, value in found if value}


@pytest.mark.any_version
def test_what_the_allow_list_refuses_nothing_connects_to(
    pg: EmbeddedPostgres,
    monitor_dsn: str,
    start_exporter: StartExporter,
    listener: _Listener,
    tmp_path: Path,
) -> None:
    config: Config = {
        "targets": [{"name": "main", "dsn": monitor_dsn}],
        "auth_modules": {
            "fleet": monitor_module(tmp_path, "127.0.0.1/32"),
            # An allowed name that resolves to the exporter's own host: refused, since only
            # a network of the list may admit a loopback address.
            "names": monitor_module(tmp_path, f"localhost:{listener.port}"),
            # What the listener's network admits: the probe that shows where a connection
            # would have gone.
            "canary": monitor_module(tmp_path, "127.0.0.2/32"),
        },
    }
    exporter = start_exporter(config=config)
    elsewhere = f"127.0.0.2:{listener.port}"
    assert _probe(exporter, elsewhere) == 403  # outside the allow-list
    assert _probe(exporter, f"localhost:{listener.port}", "names") == 403
    assert _probe(exporter, elsewhere, "nobody") == 404  # unknown module
    assert _probe(exporter, f"host=127.0.0.2 port={listener.port}") == 400  # libpq keywords
    assert _probe(exporter, f"monitor:{MONITOR_PASSWORD}@{elsewhere}") == 400  # a password
    assert _probe(exporter, f"[127.0.0.2]:{listener.port}") == 400  # malformed
    assert _probe(exporter, "127.0.0.2:99999") == 400
    assert _refusals(exporter.scrape()) == {
        "not_allowed": 2,
        "unknown_auth_module": 1,
        "malformed_target": 4,
    }
    # The configured target is probed by name, as before, and no discovered one is kept.
    assert _probe(exporter, "main", None) == 200
    assert exporter.scrape().label_values("target") == {"main"}
    # The proof: a probe the list admits, made after all of them, reaches the listener once
    # (sslmode=disable: one attempt). A connection that a refused probe made, before its
    # answer, was accepted before this one, in the order they came.
    assert listener.accepted == 0
    assert _probe(exporter, elsewhere, "canary") == 200
    wait_until(lambda: listener.accepted > 0, 10, "the admitted probe's connection")
    assert listener.accepted == 1


@pytest.mark.any_version
def test_the_cap_refuses_new_targets_and_a_reload_closes_what_is_no_longer_allowed(
    pg: EmbeddedPostgres, start_exporter: StartExporter, tmp_path: Path
) -> None:
    def config(*allowed: str) -> Config:
        return {
            "auth_modules": {"fleet": monitor_module(tmp_path, *allowed)},
            "discovered_targets": {"max": 2},
        }

    exporter = start_exporter("--web.enable-lifecycle", config=config("127.0.0.1/32"))
    server = f"127.0.0.1:{pg.port}"
    assert _probe(exporter, f"{server}/postgres") == 200
    assert _probe(exporter, f"{server}/postgres") == 200  # the same target
    assert _probe(exporter, server) == 200  # another: the whole server
    assert _probe(exporter, f"{server}/billing") == 503
    scrape = exporter.scrape()
    assert scrape.value("pg_advisory_exporter_discovered_targets") == 2
    assert _refusals(scrape) == {"limit_reached": 1}
    assert _connections(pg) == {"postgres": 1}  # one server, one connection

    # The same file, but the module now allows another network: its targets are closed.
    config_path = tmp_path / f"config-{exporter.port}.yaml"
    config_path.write_text(yaml.safe_dump(config("127.0.0.2/32")))
    assert exporter.get("/-/reload", method="POST")[0] == 200
    assert exporter.scrape().value("pg_advisory_exporter_discovered_targets") == 0
    wait_until(lambda: not _connections(pg), 5, lambda: f"closed: {_connections(pg)}")
    assert _probe(exporter, f"{server}/postgres") == 403
