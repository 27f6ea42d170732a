"""A leaked lock pages: real PostgreSQL, exporter, Prometheus, Alertmanager and a webhook."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from support import Cli, OneTarget, StartExporter, StartService, wait_until

from pg_advisory_exporter.embedded_postgres import EmbeddedPostgres, free_port

ROOT = Path(__file__).parent.parent
ARRIVES_WITHIN = 60.0


@dataclass
class Webhook:
    """Alertmanager's webhook receiver: keeps every alert it is sent."""

    port: int
    alerts: list[dict[str, Any]] = field(default_factory=list)

    def wait_for(self, alertname: str, status: str) -> dict[str, Any]:
        found: list[dict[str, Any]] = []

        def arrived() -> bool:
            found[:] = [
                alert
                for alert in list(self.alerts)  # a copy: the server's thread appends
                if alert["labels"]["alertname"] == alertname and alert["status"] == status
            ]
            return bool(found)

        wait_until(arrived, ARRIVES_WITHIN, lambda: f"a {status} {alertname}: {self.alerts}")
        return found[0]


@pytest.fixture
def webhook() -> Iterator[Webhook]:
    hook = Webhook(free_port())

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            hook.alerts.extend(body["alerts"])
            self.send_response(200)
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", hook.port), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield hook
    server.shutdown()
    server.server_close()


def _alertmanager_config(webhook: Webhook) -> dict[str, Any]:
    """The README's example configuration, pointed at the test's webhook, with short waits."""
    config: dict[str, Any] = yaml.safe_load((ROOT / "docs" / "alertmanager.yml").read_text())
    config["route"].update(group_wait="1s", group_interval="1s", repeat_interval="1h")
    config["receivers"][0]["webhook_configs"][0]["url"] = f"http://127.0.0.1:{webhook.port}/"
    return config


@pytest.mark.slow
def test_a_leaked_lock_pages_and_resolves(
    start_exporter: StartExporter,
    one_target: OneTarget,
    monitor_dsn: str,
    pg: EmbeddedPostgres,
    webhook: Webhook,
    start_service: StartService,
    tmp_path: Path,
    cli: Cli,
) -> None:
    exporter = start_exporter(config=one_target(monitor_dsn, name="orders"))

    # The documented tuning: the generator with lowered thresholds.
    rules = tmp_path / "rules.yml"
    rules.write_text(
        cli("rules", "--set", "leaked_lock_after=2s", "--set", "leaked_lock_for=1s",
            "--set", "exporter_job=pg-advisory", check=True).stdout
    )  # fmt: skip

    (tmp_path / "alertmanager.yml").write_text(yaml.safe_dump(_alertmanager_config(webhook)))
    alertmanager = start_service(
        "prometheus-alertmanager",
        "--config.file=alertmanager.yml",
        "--storage.path=alertmanager-data",
        "--cluster.listen-address=",  # no gossip port on all interfaces
        ready_path="/-/ready",
    )
    prometheus_config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "alerting": {
            "alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{alertmanager}"]}]}]
        },
        "scrape_configs": [
            {
                "job_name": "pg-advisory",
                "static_configs": [{"targets": [f"127.0.0.1:{exporter.port}"]}],
            }
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(prometheus_config))
    start_service(
        "prometheus",
        "--config.file=prometheus.yml",
        "--storage.tsdb.path=prometheus-data",
        ready_path="/-/ready",
    )

    with psycopg.connect(pg.dsn(), autocommit=True, application_name="billing-worker") as leaked:
        leaked.execute("SELECT pg_advisory_lock(7310001)")
        firing = webhook.wait_for("PgAdvisoryLockLeaked", "firing")
        labels = firing["labels"]
        assert (labels["target"], labels["datname"], labels["application_name"]) == (
            "orders",
            "postgres",
            "billing-worker",
        )
        assert labels["severity"] == "critical"
        assert (
            "billing-worker in database postgres on orders"
            in (firing["annotations"]["description"])
        )
        assert firing["annotations"]["runbook_url"].endswith("#pgadvisorylockleaked")
        leaked.execute("SELECT pg_advisory_unlock(7310001)")
    resolved = webhook.wait_for("PgAdvisoryLockLeaked", "resolved")
    assert resolved["labels"]["application_name"] == "billing-worker"
