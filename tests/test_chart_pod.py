"""The chart's rendered pod, run: `podman kube play` of the Deployment, ConfigMap and Secret
on the image built from the Dockerfile, against the test PostgreSQL; and of a sharded
release's StatefulSet, replica by replica.

podman 4.3 runs Deployments and ConfigMaps as Kubernetes does, but not Secrets (a `secret`
volume crashes `kube play`, a played Secret is stored in a form its own references reject).
So for this run only, the user's Secret becomes a ConfigMap with the same keys, and the
pod's `secret` volumes become `configMap` volumes; test_chart.py checks the real Secret
references by schema. The exporter is also told to listen on a free port of 127.0.0.1, and
the pod's probes follow it, since the pod shares the host's network.

podman cannot run a StatefulSet either. Each replica is played as the Pod its controller
would make: named NAME-i and labelled apps.kubernetes.io/pod-index: "i", which podman's
downward API passes to the container as Kubernetes' does. The kubelet then expands
$(SHARD_INDEX) in the arguments; podman does not, so the variable is handed to the exporter
under its own name (PG_ADVISORY_EXPORTER_SHARD_INDEX) in place of that argument.
"""

from __future__ import annotations

import copy
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from containers import Podman
from helm_python.chart import Chart
from support import MONITOR_PASSWORD, Scrape, Session, load_yaml_all, wait_until

from devtools.embedded_postgres import EmbeddedPostgres, free_port
from pg_advisory_exporter.collect.kept_connection import APPLICATION_NAME
from pg_advisory_exporter.config.sources import SETTINGS
from pg_advisory_exporter.fleet.sharding import Shard

# Version-independent (tests/conftest.py): the chart's pod and the image; the server only gives it
# a lock to show.
pytestmark = pytest.mark.any_version

CHART = Path(__file__).parent.parent / "deploy" / "helm" / "pg-advisory-exporter"
UID = 65532
Document = dict[str, Any]
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"
(SHARD_INDEX,) = (s for s in SETTINGS if s.flag == "--shard.index")


def _secret_as_configmap(secret: Document) -> Document:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": secret["metadata"],
        "data": {**secret.get("stringData", {})},
    }


def _on_host_network(pod: dict[str, Any], port: int) -> None:
    """A pod spec as podman can run it on the host's network, its exporter on `port`."""
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


def _replicas(statefulset: Document, ports: list[int]) -> Iterator[Document]:
    """The Pods the StatefulSet's controller would make, replica i listening on ports[i]."""
    assert statefulset["spec"]["replicas"] == len(ports)
    for index, port in enumerate(ports):
        template = copy.deepcopy(statefulset["spec"]["template"])
        labels = {**template["metadata"]["labels"], POD_INDEX_LABEL: str(index)}
        # podman 4.3 refuses a Pod's annotation longer than a label value may be (63
        # characters), which Kubernetes allows: checksum/config is left out (it only rolls
        # the pods when the configuration changes).
        metadata = {"name": f"{statefulset['metadata']['name']}-{index}", "labels": labels}
        pod = template["spec"]
        (container,) = pod["containers"]
        (variable,) = (v for v in container["env"] if v["name"] == "SHARD_INDEX")
        container["args"].remove("--shard.index=$(SHARD_INDEX)")
        variable["name"] = SHARD_INDEX.variables[0]
        container["args"].append(f"--web.listen-address=127.0.0.1:{port}")
        _on_host_network(pod, port)
        yield {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod}


def _for_podman(documents: list[Document], ports: list[int]) -> list[Document]:
    played: list[Document] = []
    for doc in documents:
        if doc["kind"] == "Secret":
            played.append(_secret_as_configmap(doc))
        elif doc["kind"] == "StatefulSet":
            played.extend(_replicas(doc, ports))
        else:
            if doc["kind"] == "Deployment":
                (port,) = ports
                _on_host_network(doc["spec"]["template"]["spec"], port)
            played.append(doc)
    return played


def _render(podman: Podman, values: dict[str, Any], *templates: str) -> list[Document]:
    """The templates rendered as a release named for the session, as are its pods."""
    rendered = Chart.load(str(CHART)).render(values, name=podman.prefix, namespace="monitoring")
    return [
        doc
        for path, text in rendered.items()
        if path.endswith(templates)
        for doc in load_yaml_all(text)
        if doc
    ]


# The Secret the README tells users to create, holding the monitoring role's password.
def _secret(key: str) -> Document:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "pg-monitor"},
        "stringData": {key: MONITOR_PASSWORD},
    }


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
    documents = _render(podman, values, "/deployment.yaml", "/configmap.yaml")
    assert {doc["kind"] for doc in documents} == {"Deployment", "ConfigMap"}
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(yaml.safe_dump_all(_for_podman([*documents, _secret("orders")], [port])))

    leaked = session("billing-worker")
    leaked.execute("SELECT pg_advisory_lock(7310001)")
    try:
        # Under a second: its hangs were a lock that a killed podman left held (containers.py).
        podman.run("kube", "play", "--network", "host", str(manifest), timeout=180)
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

        (deployment,) = (doc for doc in documents if doc["kind"] == "Deployment")
        container = f"{deployment['metadata']['name']}-pod-0-exporter"  # podman's name for it
        inspected = json.loads(podman.run("inspect", container).stdout)[0]
        assert inspected["State"]["Running"]
        assert inspected["HostConfig"]["ReadonlyRootfs"] is True
        assert inspected["Config"]["User"].split(":")[0] == str(UID)
        assert podman.run("exec", container, "id", "-u").stdout.strip() == str(UID)
    finally:
        podman.run("kube", "down", str(manifest), check=False)


def _exporter_backends(pg: EmbeddedPostgres) -> int:
    with pg.connect() as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
            (APPLICATION_NAME,),
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_two_shards_of_the_chart_split_the_targets(
    podman: Podman, image: str, pg: EmbeddedPostgres, tmp_path: Path
) -> None:
    """Two replicas of the rendered StatefulSet, each with the same ten targets (all on the
    suite's server): each collects its own, none collects one twice, together all of them."""
    ports = [free_port(), free_port()]
    names = [f"db{i:02d}" for i in range(10)]
    repository, _, tag = image.rpartition(":")
    dsn = f"host=127.0.0.1 port={pg.port} dbname=postgres user=monitor"
    values = {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "sharding": {"shards": 2},
        "config": {
            "collection": {"min_interval": "1ms"},
            "targets": [
                {"name": name, "dsn": dsn, "passwordSecret": {"name": "pg-monitor", "key": "pw"}}
                for name in names
            ],
        },
    }
    documents = _render(podman, values, "/statefulset.yaml", "/configmap.yaml")
    assert {doc["kind"] for doc in documents} == {"StatefulSet", "ConfigMap"}
    manifest = tmp_path / "shards.yaml"
    manifest.write_text(yaml.safe_dump_all(_for_podman([*documents, _secret("pw")], ports)))
    expected = [{n for n in names if Shard(index, 2).owns(n)} for index in range(2)]
    assert all(expected), expected  # both shards have targets, or the test shows little

    before = _exporter_backends(pg)
    try:
        # Under a second: its hangs were a lock that a killed podman left held (containers.py).
        podman.run("kube", "play", "--network", "host", str(manifest), timeout=180)
        last: list[Scrape] = []

        def every_own_target_up() -> bool:
            try:
                last[:] = [_scrape(port) for port in ports]
            except OSError:
                return False
            return all(
                {labels["target"] for labels, up in scrape.find("pg_advisory_up") if up == 1} == own
                for scrape, own in zip(last, expected, strict=True)
            )

        def served() -> list[list[str]]:
            return [sorted(scrape.label_values("target")) for scrape in last]

        wait_until(every_own_target_up, 90, lambda: f"shards {expected} up, not {served()}", 0.5)
        shards = [set(targets) for targets in served()]
        assert shards == expected
        assert not shards[0] & shards[1]
        assert shards[0] | shards[1] == set(names)
        for index, scrape in enumerate(last):
            assert scrape.value("pg_advisory_exporter_shard_index") == index
            assert scrape.value("pg_advisory_exporter_shards") == 2
        # One connection from each shard on the server, for all of its targets (they name
        # one server): no shard reads the server twice, nor for another's targets.
        assert _exporter_backends(pg) - before == len(ports)
    finally:
        podman.run("kube", "down", str(manifest), check=False)
