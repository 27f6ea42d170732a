"""The chart's rendered pod, run: `podman kube play` of the Deployment, ConfigMap and Secret
on the image built from the Dockerfile, against the test PostgreSQL.

podman 4.3 runs Deployments and ConfigMaps as Kubernetes does, but not Secrets (a `secret`
volume crashes `kube play`, a played Secret is stored in a form its own references reject).
So for this run only, the user's Secret becomes a ConfigMap with the same keys, and the
pod's `secret` volumes become `configMap` volumes; test_chart.py checks the real Secret
references by schema. The exporter is also told to listen on a free port of 127.0.0.1, and
the pod's probes follow it, since the pod shares the host's network.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from containers import Podman
from helm_python.chart import Chart
from support import MONITOR_PASSWORD, Scrape, Session, wait_until

from devtools.embedded_postgres import EmbeddedPostgres, free_port

# Version-independent (tests/conftest.py): the chart's pod and the image; the server only gives it
# a lock to show.
pytestmark = pytest.mark.any_version

CHART = Path(__file__).parent.parent / "deploy" / "helm" / "pg-advisory-exporter"
UID = 65532


def _for_podman(documents: list[dict[str, Any]], port: int) -> list[dict[str, Any]]:
    played: list[dict[str, Any]] = []
    for given in documents:
        doc = given
        if doc["kind"] == "Secret":
            data = {**doc.get("stringData", {})}
            doc = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": doc["metadata"],
                "data": data,
            }
        if doc["kind"] == "Deployment":
            pod = doc["spec"]["template"]["spec"]
            for volume in pod["volumes"]:
                if "secret" in volume:
                    secret = volume.pop("secret")
                    volume["configMap"] = {
                        "name": secret["secretName"],
                        **{k: v for k, v in secret.items() if k in ("items", "defaultMode")},
                    }
            (container,) = pod["containers"]
            # On the host's network podman takes no port mappings; the probes name the port.
            del container["ports"]
            for probe in ("livenessProbe", "readinessProbe"):
                container[probe]["httpGet"]["port"] = port
        played.append(doc)
    return played


def _scrape(port: int) -> Scrape:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        return Scrape(answer.read().decode())


def _status(port: int, path: str) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as answer:
        return int(answer.status)


def test_the_rendered_pod_runs_and_exports(
    podman: Podman, image: str, pg: EmbeddedPostgres, session: Session, tmp_path: Path
) -> None:
    port = free_port()
    repository, _, tag = image.rpartition(":")
    values = {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "config": {
            "collection": {"min_interval": "1ms"},
            "targets": [
                {
                    "name": "orders",
                    "dsn": f"host=127.0.0.1 port={pg.port} dbname=postgres user=monitor",
                    "passwordSecret": {"name": "pg-monitor", "key": "orders"},
                }
            ],
        },
        "extraArgs": [f"--web.listen-address=127.0.0.1:{port}"],
    }
    rendered = Chart.load(str(CHART)).render(values, name="locks", namespace="monitoring")
    documents = [
        doc
        for path, text in rendered.items()
        if path.endswith(("/deployment.yaml", "/configmap.yaml"))
        for doc in yaml.safe_load_all(text)
        if doc
    ]
    # The Secret the README tells users to create.
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "pg-monitor"},
        "stringData": {"orders": MONITOR_PASSWORD},
    }
    assert {doc["kind"] for doc in documents} == {"Deployment", "ConfigMap"}
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(yaml.safe_dump_all(_for_podman([*documents, secret], port)))

    leaked = session("billing-worker")
    leaked.execute("SELECT pg_advisory_lock(7310001)")
    podman.run("kube", "play", "--network", "host", str(manifest), timeout=180)
    try:
        last: list[Scrape] = []

        def exported() -> bool:
            try:
                last[:] = [_scrape(port)]
            except OSError:
                return False
            return bool(last[0].find("pg_advisory_holders", application_name="billing-worker"))

        wait_until(exported, 60, lambda: f"the lock exported: {last}", 0.5)
        scrape = last[0]
        assert scrape.value("pg_advisory_up", target="orders") == 1
        worker = {"application_name": "billing-worker", "datname": "postgres", "state": "idle"}
        assert scrape.value("pg_advisory_holders", target="orders", **worker) == 1
        # The endpoints the chart's probes use answer while the exporter serves.
        assert (_status(port, "/-/healthy"), _status(port, "/-/ready")) == (200, 200)

        container = "locks-pg-advisory-exporter-pod-0-exporter"  # podman's name for it
        inspected = json.loads(podman.run("inspect", container).stdout)[0]
        assert inspected["State"]["Running"]
        assert inspected["HostConfig"]["ReadonlyRootfs"] is True
        assert inspected["Config"]["User"].split(":")[0] == str(UID)
        assert podman.run("exec", container, "id", "-u").stdout.strip() == str(UID)
    finally:
        podman.run("kube", "down", str(manifest), check=False)
