"""The Helm chart, rendered and linted by the real Helm engine (helm-python-sdk): every object
valid for Kubernetes and for the Prometheus Operator's CRDs, secure by default, scraped under
the job the alert rules expect, and with a configuration file the exporter accepts."""

from __future__ import annotations

import copy
import functools
import hashlib
import importlib
import json
import os
import re
import sys
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml
from helm_python.chart import Chart, lint
from helm_python.errors import HelmError
from psycopg.conninfo import conninfo_to_dict
from support import (
    Cli,
    StartService,
    load_yaml,
    load_yaml_all,
    prometheus_api,
    start_prometheus,
    wait_until,
)

from pg_advisory_exporter.alerting.rules import Thresholds
from pg_advisory_exporter.config.collection import CollectionSettings, RewriteRuleConfig
from pg_advisory_exporter.config.exporter_settings import LogConfig
from pg_advisory_exporter.config.loader import load
from pg_advisory_exporter.config.model import FileConfig
from pg_advisory_exporter.config.settings import Settings
from pg_advisory_exporter.config.sources import SETTINGS, Flags, settings_from
from pg_advisory_exporter.config.targets import (
    AUTH_MODULE_OPTIONS,
    AuthModuleConfig,
    DiscoveredTargetsSettings,
    LocksPageSettings,
    PoolerConfig,
    TargetConfig,
)
from pg_advisory_exporter.keys.idle_by_design import IdleByDesignConfig
from pg_advisory_exporter.keys.key_config import KeyConfig

ROOT = Path(__file__).parent.parent
CHART = ROOT / "deploy" / "helm" / "pg-advisory-exporter"
VALUES_DIR = Path(__file__).parent / "chart_values"
EXAMPLES_DIR = CHART / "examples"
# The example of discovered targets routed to shards: the chart's values, and the
# kube-prometheus-stack values whose scrape job routes them.
EXAMPLE = EXAMPLES_DIR / "sharded-discovery.yaml"
EXAMPLE_PROMETHEUS = EXAMPLES_DIR / "sharded-discovery-prometheus.yaml"
RELEASE = "locks"
NAMESPACE = "monitoring"
# A recent release among those kubernetes-validate has schemas for (the chart wants >= 1.25).
KUBERNETES = "1.33.0"
# The CRDs of prometheus-operator 0.80.1. No package on PyPI, npm or Debian ships their
# openAPIV3Schema as it is; PyPI's cloudcoil-models-prometheus-operator holds the pydantic
# models cloudcoil generates from it, whose JSON schemas keep its fields, types, enums,
# patterns and required fields. The test command installs them outside the virtualenv, since
# cloudcoil registers a pytest plugin that needs packages of its own, and they are imported by
# name, so that mypy does not analyse two megabytes of generated models.
CRD_MODELS_DIR = ROOT / "build" / "crd-models"
CRD_MODELS_INSTALL = (
    f"pip install --no-deps --target {CRD_MODELS_DIR} "
    "cloudcoil==0.6.0 cloudcoil-models-prometheus-operator==0.80.1.0"
)
OPERATOR_MODELS = "cloudcoil.models.prometheus_operator"
MONITORING_API = "monitoring.coreos.com/"  # v1, and v1alpha1 for ScrapeConfig

Values = dict[str, Any]
Document = dict[str, Any]


def _values_file(path: Path) -> Values:
    values: Values = load_yaml(path.read_text())
    return values


VALUE_SETS: dict[str, Values] = {
    "defaults": {},
    **{path.stem: _values_file(path) for path in sorted(VALUES_DIR.glob("*.yaml"))},
    "example-sharded-discovery": _values_file(EXAMPLE),
}


@functools.cache
def _chart() -> Chart:
    return Chart.load(str(CHART))


@functools.cache
def _render_json(values_json: str) -> dict[str, str]:
    return _chart().render(json.loads(values_json), name=RELEASE, namespace=NAMESPACE)


def render_files(values: Values) -> dict[str, str]:
    """Template path to rendered text, NOTES.txt included."""
    return _render_json(json.dumps(values, sort_keys=True))


@functools.cache
def _documents(values_json: str) -> tuple[Document, ...]:
    """The manifests of a render, read once: most tests render one of a few value sets."""
    return tuple(
        document
        for path, text in sorted(_render_json(values_json).items())
        if path.endswith(".yaml")
        for document in load_yaml_all(text)
        if document
    )


def render(values: Values) -> list[Document]:
    """The manifests a release of these values would apply (a copy of their own: a test may
    change what it is given)."""
    return copy.deepcopy(list(_documents(json.dumps(values, sort_keys=True))))


def only(documents: list[Document], kind: str) -> Document:
    found = [d for d in documents if d["kind"] == kind]
    assert len(found) == 1, f"{len(found)} {kind} objects"
    return found[0]


def workload(documents: list[Document]) -> Document:
    """The Deployment, or the StatefulSet of a sharded release."""
    (found,) = (d for d in documents if d["kind"] in ("Deployment", "StatefulSet"))
    return found


def pod_spec(documents: list[Document]) -> dict[str, Any]:
    spec: dict[str, Any] = workload(documents)["spec"]["template"]["spec"]
    return spec


def exporter_container(documents: list[Document]) -> dict[str, Any]:
    (container,) = (c for c in pod_spec(documents)["containers"] if c["name"] == "exporter")
    return dict(container)


def config_text(documents: list[Document]) -> str:
    configmap = next(
        d for d in documents if d["kind"] == "ConfigMap" and "config.yaml" in d["data"]
    )
    text: str = configmap["data"]["config.yaml"]
    return text


def scrape_endpoints(monitor: Document) -> list[dict[str, Any]]:
    key = "endpoints" if monitor["kind"] == "ServiceMonitor" else "podMetricsEndpoints"
    endpoints: list[dict[str, Any]] = monitor["spec"][key]
    return endpoints


parametrize_sets = pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())


# -- Helm's own checks ----------------------------------------------------------------------


@parametrize_sets
def test_lints_clean_in_strict_mode(values: Values) -> None:
    report = lint(
        str(CHART),
        values,
        strict=True,
        namespace=NAMESPACE,
        kube_version=f"v{KUBERNETES}",
    )
    # Severity 1 is information ("icon is recommended"); 2 is a warning, 3 an error.
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not problems, problems
    assert not report["errors"], report["errors"]


@pytest.mark.parametrize(
    ("values", "where"),
    [
        ({"replicas": 2}, "'replicas' not allowed"),
        ({"serviceMonitor": {"enabled": True, "intervall": "30s"}}, "'intervall' not allowed"),
        ({"replicaCount": "2"}, "/replicaCount"),
        ({"serviceMonitor": {"enabled": "yes"}}, "/serviceMonitor/enabled"),
        (
            {"config": {"targets": [{"name": "a", "dsn": "host=a", "pasword_file": "/p"}]}},
            "'pasword_file' not allowed",
        ),
        ({"config": {"log": {"level": "verbose"}}}, "/config/log/level"),
        ({"config": {"collection": {"min_interval": "soon"}}}, "/config/collection/min_interval"),
        ({"config": {"collection": {"min_interval": "5s1m"}}}, "/config/collection/min_interval"),
        # Helm holds numbers as float64: 2^53 + 1 would silently become 2^53.
        ({"config": {"keys": [{"name": "k", "key": 2**53 + 1}]}}, "/config/keys/0/key"),
        ({"config": {"web": {"listen_address": ":80"}}}, "'web' not allowed"),
        ({"podDisruptionBudget": {"enabled": True, "maxUnavailabel": 1}}, "not allowed"),
        (
            {
                "config": {
                    "targets": [
                        {
                            "name": "a",
                            "dsn": "host=a",
                            "poolers": [{"name": "p", "addresses": ["p"], "pool_mod": "session"}],
                        }
                    ]
                }
            },
            "'pool_mod' not allowed",
        ),
        (
            {
                "config": {
                    "targets": [
                        {
                            "name": "a",
                            "dsn": "host=a",
                            "poolers": [{"name": "p", "addresses": ["p"], "pool_mode": "pooled"}],
                        }
                    ]
                }
            },
            "/config/targets/0/poolers/0/pool_mode",
        ),
        ({"config": {"locks_page": {"query_txt": True}}}, "'query_txt' not allowed"),
        (
            {
                "config": {
                    "targets": [
                        {"name": "a", "dsn": "host=a", "locks_page": {"query_text_length": 0}}
                    ]
                }
            },
            "/config/targets/0/locks_page/query_text_length",
        ),
        ({"config": {"locks_page": {"reuse_for": "soon"}}}, "/config/locks_page/reuse_for"),
        ({"webExternalUrl": "locks.example.com"}, "/webExternalUrl"),
        ({"sharding": {"shards": -1}}, "/sharding/shards"),
        ({"sharding": {"shards": "3"}}, "/sharding/shards"),
        ({"sharding": {"shards": 2.5}}, "/sharding/shards"),
        ({"sharding": {"shard": 3}}, "'shard' not allowed"),
        ({"sharding": {"shards": 3, "indexFrom": "ordinal"}}, "/sharding/indexFrom"),
        (
            {"config": {"auth_modules": {"m": {"user": "monitor"}}}},
            "'allowed_targets'",
        ),
        (
            {
                "config": {
                    "auth_modules": {
                        "m": {
                            "user": "u",
                            "allowed_targets": ["10.0.0.0/8"],
                            "options": {"host": "x"},
                        }
                    }
                }
            },
            "invalid propertyName 'host'",
        ),
        ({"config": {"discovered_targets": {"max": 0}}}, "/config/discovered_targets/max"),
    ],
    ids=[
        "unknown top-level key",
        "unknown nested key",
        "string for integer",
        "string for boolean",
        "misspelt target field",
        "unknown log level",
        "not a duration",
        "duration units out of order",
        "key beyond 2^53",
        "web is the chart's",
        "misspelt pdb field",
        "misspelt pooler field",
        "unknown pool mode",
        "misspelt locks_page field",
        "query text length 0",
        "reuse_for not a duration",
        "external URL without a scheme",
        "negative shards",
        "string for shards",
        "fractional shards",
        "misspelt sharding field",
        "unknown index source",
        "auth module without allow-list",
        "auth module choosing the host",
        "no discovered targets allowed",
    ],
)
def test_a_values_mistake_fails_rendering(values: Values, where: str) -> None:
    with pytest.raises(HelmError, match="schema") as raised:
        render_files(values)
    assert where in str(raised.value)


# -- Kubernetes' and the Prometheus Operator's schemas --------------------------------------


def validate_kubernetes(document: Document) -> None:
    try:
        kubernetes_validate.validate(document, KUBERNETES, strict=True)
    except kubernetes_validate.ValidationError as exc:
        where = "/".join(map(str, exc.absolute_path))
        raise AssertionError(f"{document['kind']} {where}: {exc.message}") from None


@parametrize_sets
def test_core_objects_are_valid_kubernetes(values: Values) -> None:
    core = [d for d in render(values) if not d["apiVersion"].startswith(MONITORING_API)]
    assert {d["kind"] for d in core} >= {workload(core)["kind"], "Service"}
    for document in core:
        validate_kubernetes(document)


def test_kubernetes_validation_can_fail() -> None:
    deployment = only(render({}), "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["securityContxt"] = {}
    with pytest.raises(AssertionError, match="'securityContxt' was unexpected"):
        validate_kubernetes(deployment)


def _as_the_api_server_checks(node: Any) -> Any:
    """A generated model's JSON schema, checked as the API server checks the object.

    The API server refuses unknown fields (kubectl's default is --validate=strict), where the
    models would ignore them; and the CRDs' patterns are Go's, which take (?i) anywhere, where
    Python's re wants it first.
    """
    if isinstance(node, dict):
        if "properties" in node and "additionalProperties" not in node:
            node["additionalProperties"] = False
        pattern = node.get("pattern")
        if isinstance(pattern, str) and "(?i)" in pattern[1:]:
            node["pattern"] = "(?i)" + pattern.replace("(?i)", "")
        for value in node.values():
            _as_the_api_server_checks(value)
    elif isinstance(node, list):
        for value in node:
            _as_the_api_server_checks(value)
    return node


# Each kind the chart renders, and the API version (the models' module) it is in.
CRD_KINDS = {
    "ServiceMonitor": "v1",
    "PodMonitor": "v1",
    "PrometheusRule": "v1",
    "ScrapeConfig": "v1alpha1",
}


def _models_json_schemas() -> dict[str, Any]:
    """The models' JSON schemas of CRD_KINDS, as pydantic makes them. Importing the models
    builds two megabytes of pydantic classes (seconds of CPU in every process that runs
    one of these tests), so the schemas are kept beside them, under a name that is the hash
    of the models' source: a reinstall of other models makes them anew."""
    folder = CRD_MODELS_DIR.joinpath(*OPERATOR_MODELS.split("."))
    sources = b"".join((folder / f"{v}.py").read_bytes() for v in sorted(set(CRD_KINDS.values())))
    digest = hashlib.sha256(sources).hexdigest()[:16]
    kept = CRD_MODELS_DIR / f"json-schemas-{digest}.json"
    if kept.exists():
        schemas: dict[str, Any] = json.loads(kept.read_text())
        return schemas
    sys.path.append(str(CRD_MODELS_DIR))
    schemas = {
        kind: getattr(
            importlib.import_module(f"{OPERATOR_MODELS}.{version}"), kind
        ).model_json_schema(by_alias=True)
        for kind, version in CRD_KINDS.items()
    }
    partial = kept.with_suffix(f".{os.getpid()}.tmp")  # another worker may write it too
    partial.write_text(json.dumps(schemas))
    partial.replace(kept)
    return schemas


@pytest.fixture(scope="session")  # read-only, and costly: once, whatever the order
def crd_schemas() -> dict[str, Any]:
    """JSON schemas of CRD_KINDS from their CRDs."""
    assert (CRD_MODELS_DIR / "cloudcoil").is_dir(), (
        f"the CRD models are not installed (the test command installs them): {CRD_MODELS_INSTALL}"
    )
    return {
        kind: jsonschema.Draft202012Validator(_as_the_api_server_checks(schema))
        for kind, schema in _models_json_schemas().items()
    }


def validate_crd(document: Document, crd_schemas: dict[str, Any]) -> None:
    errors = sorted(crd_schemas[document["kind"]].iter_errors(document), key=str)
    assert not errors, "\n".join(
        f"{document['kind']} {'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors
    )


# Each value set that renders Prometheus Operator objects, with the kinds it renders: every
# kind, in single- and multi-target forms. The others (defaults, existing-secret, poolers)
# render none, which test_every_monitoring_object_is_checked_against_its_crd makes sure of.
CRD_CASES: list[tuple[str, str]] = [
    ("monitors", "ServiceMonitor"),  # one target, /metrics, the chart's defaults
    ("monitors", "PodMonitor"),
    ("monitors", "PrometheusRule"),  # tuned thresholds
    ("multi-target", "ServiceMonitor"),  # a /probe endpoint per target of the file
    ("multi-target", "PrometheusRule"),
    ("config-from-secret", "ServiceMonitor"),  # targets named in the values
    ("everything", "ServiceMonitor"),  # TLS, basic auth, relabelings, another namespace
    ("everything", "PodMonitor"),  # multi-target
    ("everything", "PrometheusRule"),
    ("sharded", "ServiceMonitor"),  # every shard's /metrics through the headless Service
    ("sharded", "PodMonitor"),
    ("example-sharded-discovery", "ServiceMonitor"),
    ("scrape-config", "ScrapeConfig"),  # probes through an auth module, routed to shards
]


@pytest.mark.parametrize(("name", "kind"), CRD_CASES, ids=[f"{n}-{k}" for n, k in CRD_CASES])
def test_prometheus_operator_objects_match_their_crds(
    name: str, kind: str, crd_schemas: dict[str, Any]
) -> None:
    found = [d for d in render(VALUE_SETS[name]) if d["kind"] == kind]
    assert found, f"the {name} values render no {kind}"
    for document in found:
        assert document["apiVersion"] == MONITORING_API + CRD_KINDS[kind]
        validate_crd(document, crd_schemas)


def test_every_monitoring_object_is_checked_against_its_crd() -> None:
    rendered = {
        (name, document["kind"])
        for name, values in VALUE_SETS.items()
        for document in render(values)
        if document["apiVersion"].startswith(MONITORING_API)
    }
    assert rendered == set(CRD_CASES)


@pytest.mark.parametrize(
    "mistake",
    [
        lambda e: e.update(relabellings=[]),
        lambda e: e.update(port=9846),
        lambda e: e.update(interval="30 seconds"),
        lambda e: e.update(scheme="ftp"),
        lambda e: e.update(params={"target": "orders"}),
    ],
    ids=["unknown field", "number for a port name", "bad interval", "bad scheme", "bad params"],
)
def test_crd_validation_can_fail(
    crd_schemas: dict[str, Any], mistake: Callable[[dict[str, Any]], None]
) -> None:
    monitor = only(render(VALUE_SETS["multi-target"]), "ServiceMonitor")
    mistake(monitor["spec"]["endpoints"][0])
    with pytest.raises(AssertionError, match="endpoints/0"):
        validate_crd(monitor, crd_schemas)


def test_kinds_of_each_set() -> None:
    def kinds(values: Values) -> list[str]:
        return sorted(d["kind"] for d in render(values))

    assert kinds({}) == ["ConfigMap", "Deployment", "Service"]
    assert kinds(VALUE_SETS["config-from-secret"]) == ["Deployment", "Service", "ServiceMonitor"]
    everything = kinds(VALUE_SETS["everything"])
    assert set(everything) == {
        "ConfigMap",
        "Deployment",
        "NetworkPolicy",
        "PodDisruptionBudget",
        "PodMonitor",
        "Service",
        "ServiceAccount",
        "ServiceMonitor",
        "PrometheusRule",
    }
    assert everything.count("ConfigMap") == 2  # the configuration and the dashboard
    assert kinds(VALUE_SETS["sharded"]) == [
        "ConfigMap",
        "NetworkPolicy",
        "PodDisruptionBudget",
        "PodMonitor",
        "Service",
        "ServiceMonitor",
        "StatefulSet",
    ]


# -- Secure defaults ------------------------------------------------------------------------


def test_secure_defaults() -> None:
    documents = render({})
    pod = pod_spec(documents)
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "runAsGroup": 65532,
        "fsGroup": 65532,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert not {"hostNetwork", "hostPID", "hostIPC"} & pod.keys()
    container = exporter_container(documents)
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }


def test_the_pod_runs_as_the_images_user() -> None:
    (user,) = re.findall(r"^USER\s+(\d+):(\d+)\s*$", (ROOT / "Dockerfile").read_text(), re.M)
    context = pod_spec(render({}))["securityContext"]
    assert (str(context["runAsUser"]), str(context["runAsGroup"])) == user


def test_the_user_id_is_a_value() -> None:
    pod = pod_spec(render({"podSecurityContext": {"runAsUser": 10001, "runAsGroup": 10001}}))
    context = pod["securityContext"]
    assert (context["runAsUser"], context["runAsGroup"], context["runAsNonRoot"]) == (
        10001,
        10001,
        True,
    )


def test_a_created_service_account_mounts_no_token() -> None:
    documents = render({"serviceAccount": {"create": True}})
    account = only(documents, "ServiceAccount")
    assert account["automountServiceAccountToken"] is False
    assert pod_spec(documents)["serviceAccountName"] == account["metadata"]["name"]
    assert pod_spec(documents)["automountServiceAccountToken"] is False


def test_image_defaults_to_the_charts_app_version() -> None:
    chart = load_yaml((CHART / "Chart.yaml").read_text())
    assert exporter_container(render({}))["image"] == (
        f"ghcr.io/pg-advisory-exporter/pg-advisory-exporter:{chart['appVersion']}"
    )
    digest = VALUE_SETS["everything"]["image"]["digest"]
    assert exporter_container(render(VALUE_SETS["everything"]))["image"].endswith(f"@{digest}")


# -- Probes ---------------------------------------------------------------------------------


def test_probes_use_the_endpoints_that_ignore_databases() -> None:
    documents = render({})
    container = exporter_container(documents)
    assert container["ports"] == [{"name": "http", "containerPort": 9846, "protocol": "TCP"}]
    assert "--web.listen-address=:9846" in container["args"]
    liveness, readiness = container["livenessProbe"], container["readinessProbe"]
    # /-/ready, not /health: a database that is down must not empty the Service.
    assert liveness["httpGet"] == {"path": "/-/healthy", "port": "http"}
    assert readiness["httpGet"] == {"path": "/-/ready", "port": "http"}
    service = only(documents, "Service")
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 9846, "targetPort": "http", "protocol": "TCP"}
    ]


def test_tls_turns_probes_and_monitors_to_https() -> None:
    documents = render(VALUE_SETS["everything"])
    container = exporter_container(documents)
    assert container["livenessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert container["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    for kind in ("ServiceMonitor", "PodMonitor"):
        for endpoint in scrape_endpoints(only(documents, kind)):
            assert endpoint["scheme"] == "https"
    assert "--web.config.file=/etc/pg-advisory-exporter/web/web-config.yml" in container["args"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec(documents)["volumes"]}
    assert mounts["web-config"] == "/etc/pg-advisory-exporter/web"
    # A directory, not a subPath: a renewed certificate reaches the exporter, which rereads it.
    assert volumes["web-config"]["secret"]["secretName"] == "pg-advisory-exporter-web"


# -- Scraping: the job label, single and multi-target ---------------------------------------


def monitors(documents: list[Document]) -> list[Document]:
    return [d for d in documents if d["kind"] in ("ServiceMonitor", "PodMonitor")]


def job_relabeling(endpoint: dict[str, Any]) -> dict[str, Any]:
    relabeling: dict[str, Any] = endpoint["relabelings"][0]
    return relabeling


@pytest.mark.parametrize("name", ["multi-target", "everything", "config-from-secret"])
def test_every_endpoint_sets_the_job_the_rules_expect(name: str) -> None:
    values = VALUE_SETS[name]
    job = values.get("prometheusJob", "pg-advisory-exporter")
    found = monitors(render(values))
    assert found
    for monitor in found:
        for endpoint in scrape_endpoints(monitor):
            assert job_relabeling(endpoint) == {
                "action": "replace",
                "targetLabel": "job",
                "replacement": job,
            }


def test_the_job_default_is_what_the_alert_rules_expect() -> None:
    assert (
        load_yaml((CHART / "values.yaml").read_text())["prometheusJob"] == Thresholds().exporter_job
    )


def test_single_target_scrapes_metrics() -> None:
    documents = render({"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}})
    for monitor in monitors(documents):
        (endpoint,) = scrape_endpoints(monitor)
        assert endpoint["path"] == "/metrics"
        assert endpoint["port"] == "http"
        assert "params" not in endpoint
        assert len(endpoint["relabelings"]) == 1
    service_monitor = only(documents, "ServiceMonitor")
    selector = service_monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= only(documents, "Service")["metadata"]["labels"].items()
    assert service_monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}


def test_multi_target_has_one_probe_endpoint_per_target() -> None:
    values = VALUE_SETS["multi-target"]
    monitor = only(render(values), "ServiceMonitor")
    names = [t["name"] for t in values["config"]["targets"]]
    endpoints = scrape_endpoints(monitor)
    assert [e["params"] for e in endpoints] == [{"target": [name]} for name in names]
    for name, endpoint in zip(names, endpoints, strict=True):
        assert endpoint["path"] == "/probe"
        assert endpoint["port"] == "http"
        assert endpoint["interval"] == "30s"
        # The relabeling tells apart the endpoints' own series (up, scrape_*), which would
        # otherwise collide; honorLabels keeps the exporter's series, which carry the same
        # target label, from getting an exported_target copy.
        assert endpoint["honorLabels"] is True
        assert endpoint["relabelings"][1] == {
            "action": "replace",
            "targetLabel": "target",
            "replacement": name,
        }
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_multi_target_names_can_be_listed() -> None:
    documents = render(VALUE_SETS["everything"])
    (endpoint,) = scrape_endpoints(only(documents, "PodMonitor"))
    assert endpoint["params"] == {"target": ["orders"]}
    monitor = only(render(VALUE_SETS["config-from-secret"]), "ServiceMonitor")
    assert [e["params"]["target"] for e in scrape_endpoints(monitor)] == [["orders"], ["billing"]]


def test_multi_target_from_an_existing_file_needs_the_names() -> None:
    values = {
        "config": {"existingConfigMap": "mine"},
        "serviceMonitor": {"enabled": True, "multipleTarget": {"enabled": True}},
    }
    with pytest.raises(HelmError, match=r"serviceMonitor\.multipleTarget\.targets"):
        render_files(values)


def test_user_relabelings_follow_the_charts() -> None:
    values = VALUE_SETS["everything"]
    (endpoint,) = scrape_endpoints(only(render(values), "ServiceMonitor"))
    assert endpoint["relabelings"][1:] == values["serviceMonitor"]["relabelings"]
    assert endpoint["metricRelabelings"] == values["serviceMonitor"]["metricRelabelings"]
    assert endpoint["scrapeTimeout"] == "20s"


def test_prometheus_rule_matches_the_monitors_job() -> None:
    documents = render(VALUE_SETS["everything"])
    rule = only(documents, "PrometheusRule")
    (down,) = (
        r for group in rule["spec"]["groups"] for r in group["rules"]
        if r.get("alert") == "PgAdvisoryExporterDown"
    )  # fmt: skip
    assert 'up{job="db-locks"}' in down["expr"]
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert rule["metadata"]["namespace"] == "observability"


# -- The configuration file and its credentials ---------------------------------------------


def test_a_config_change_rolls_the_pods() -> None:
    def checksum(values: Values) -> str | None:
        annotations = only(render(values), "Deployment")["spec"]["template"]["metadata"]
        found: str | None = annotations.get("annotations", {}).get("checksum/config")
        return found

    base = checksum({})
    assert base == hashlib.sha256(config_text(render({})).rstrip("\n").encode()).hexdigest()
    assert checksum({"replicaCount": 3, "podLabels": {"a": "b"}}) == base
    assert checksum({"config": {"log": {"level": "debug"}}}) != base
    assert checksum({"config": {"targets": [{"name": "b", "dsn": "host=b"}]}}) != base
    # The chart cannot see into a ConfigMap or Secret it does not make.
    assert checksum({"config": {"existingConfigMap": "mine"}}) is None


def mounted_files(documents: list[Document]) -> dict[str, tuple[str, str]]:
    """Path in the container to (Secret name, key) of each file mounted from a Secret."""
    container = exporter_container(documents)
    volumes = {v["name"]: v for v in pod_spec(documents)["volumes"]}
    files: dict[str, tuple[str, str]] = {}
    for mount in container["volumeMounts"]:
        secret = volumes[mount["name"]].get("secret")
        if secret is None:
            continue
        assert "subPath" not in mount
        for item in secret.get("items", []):
            files[f"{mount['mountPath']}/{item['path']}"] = (secret["secretName"], item["key"])
    return files


def test_passwords_are_mounted_from_existing_secrets() -> None:
    values = VALUE_SETS["existing-secret"]
    documents = render(values)
    config = load_yaml(config_text(documents))
    files = mounted_files(documents)
    for given, rendered in zip(values["config"]["targets"], config["targets"], strict=True):
        secret = given["passwordSecret"]
        assert "passwordSecret" not in rendered
        assert files[rendered["password_file"]] == (secret["name"], secret["key"])
    volumes = [v for v in pod_spec(documents)["volumes"] if "secret" in v]
    # One volume per Secret, holding only the keys the targets name.
    assert sorted(v["secret"]["secretName"] for v in volumes) == [
        "pg-monitor",
        "reports-db-credentials",
    ]
    for volume in volumes:
        # A Secret or key missing downs its target only: the pod starts, the others run.
        assert volume["secret"]["optional"] is True
        assert volume["secret"]["defaultMode"] == 0o440
    shared = next(v["secret"] for v in volumes if v["secret"]["secretName"] == "pg-monitor")
    assert [item["key"] for item in shared["items"]] == ["billing", "orders"]


def test_pooler_passwords_are_mounted_from_existing_secrets() -> None:
    """A pooler's passwordSecret becomes its password_file, as a target's does; a Secret
    that targets and poolers share is mounted once, with the keys they name."""
    values = VALUE_SETS["poolers"]
    documents = render(values)
    config = load_yaml(config_text(documents))
    files = mounted_files(documents)
    for given, rendered in zip(values["config"]["targets"], config["targets"], strict=True):
        secret = given["passwordSecret"]
        assert files[rendered["password_file"]] == (secret["name"], secret["key"])
        for pooler, rendered_pooler in zip(given["poolers"], rendered["poolers"], strict=True):
            assert "passwordSecret" not in rendered_pooler
            if "passwordSecret" in pooler:
                secret = pooler["passwordSecret"]
                assert files[rendered_pooler["password_file"]] == (secret["name"], secret["key"])
    assert config["targets"][0]["poolers"][0]["password_file"] == (
        "/etc/pg-advisory-exporter/secrets/pg-monitor/pgbouncer-stats"
    )
    volumes = [v for v in pod_spec(documents)["volumes"] if "secret" in v]
    assert sorted(v["secret"]["secretName"] for v in volumes) == [
        "billing-db-credentials",
        "pg-monitor",
    ]
    shared = next(v for v in volumes if v["secret"]["secretName"] == "pg-monitor")
    assert [item["key"] for item in shared["secret"]["items"]] == ["orders", "pgbouncer-stats"]
    mounts = [
        m for m in exporter_container(documents)["volumeMounts"] if m["name"] == shared["name"]
    ]
    assert [m["mountPath"] for m in mounts] == ["/etc/pg-advisory-exporter/secrets/pg-monitor"]


def test_poolers_known_by_address_pass_through() -> None:
    values = VALUE_SETS["poolers"]
    config = load_yaml(config_text(render(values)))
    given = values["config"]["targets"][0]["poolers"][1]
    assert config["targets"][0]["poolers"][1] == given


def test_no_password_in_a_configmap_or_the_environment() -> None:
    for name, values in VALUE_SETS.items():
        documents = render(values)
        assert not [d for d in documents if d["kind"] == "Secret"], name
        container = exporter_container(documents)
        assert "envFrom" not in container, name
        env, extra = container.get("env", []), values.get("extraEnv", [])
        assert env[len(env) - len(extra) :] == extra, name
        # The chart's own variables only come from the pod's own fields (a shard's index).
        for variable in env[: len(env) - len(extra)]:
            assert variable["valueFrom"].keys() == {"fieldRef"}, (name, variable)
        if values.get("config", {}).get("existingSecret"):
            continue
        for target in load_yaml(config_text(documents)).get("targets", []):
            assert "password" not in conninfo_to_dict(target["dsn"]), (name, target["name"])
            for pooler in target.get("poolers", []):
                if "admin_dsn" in pooler:
                    assert "password" not in conninfo_to_dict(pooler["admin_dsn"]), name


parametrize_password_dsns = pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://monitor:s3cret@db:5432/postgres",
        "host=db user=monitor password=s3cret",
        "host=db password = 's3 cret' user=monitor",
        "postgresql://db/postgres?user=monitor&password=s3cret",
        "host=db sslkey=/k sslpassword=s3cret",
    ],
    ids=["URI", "keyword", "quoted keyword", "URI parameter", "key passphrase"],
)


@parametrize_password_dsns
def test_a_password_in_a_dsn_is_refused(dsn: str) -> None:
    values = {"config": {"targets": [{"name": "db", "dsn": dsn}]}}
    with pytest.raises(HelmError, match="passwordSecret") as raised:
        render_files(values)
    assert "s3" not in str(raised.value)


@parametrize_password_dsns
def test_a_password_in_an_admin_dsn_is_refused(dsn: str) -> None:
    pooler = {"name": "pgbouncer", "admin_dsn": dsn}
    values = {"config": {"targets": [{"name": "db", "dsn": "host=db", "poolers": [pooler]}]}}
    with pytest.raises(HelmError, match="passwordSecret") as raised:
        render_files(values)
    message = str(raised.value)
    assert 'pooler "pgbouncer" of target "db" has a password in its admin_dsn' in message
    assert "s3" not in message


@pytest.mark.parametrize(
    ("targets", "message"),
    [
        ([], "config.targets is empty"),
        ([{"name": "a", "dsn": "host=a"}, {"name": "a", "dsn": "host=b"}], '"a" is used twice'),
        (
            [
                {
                    "name": "a",
                    "dsn": "host=a",
                    "password_file": "/p",
                    "passwordSecret": {"name": "s", "key": "k"},
                }
            ],
            "both passwordSecret and password_file",
        ),
    ],
    ids=["none", "a name twice", "two passwords"],
)
def test_targets_the_exporter_would_refuse_fail_the_render(
    targets: list[dict[str, Any]], message: str
) -> None:
    with pytest.raises(HelmError, match=message):
        render_files({"config": {"targets": targets}})


SECRET = {"name": "s", "key": "k"}


@pytest.mark.parametrize(
    ("poolers", "message"),
    [
        (
            [{"name": "p", "admin_dsn": "host=p"}, {"name": "p", "addresses": ["p"]}],
            'target "a" names the pooler "p" twice',
        ),
        (
            [{"name": "p", "admin_dsn": "host=p", "addresses": ["p"], "pool_mode": "session"}],
            "exactly one of admin_dsn",
        ),
        ([{"name": "p"}], "exactly one of admin_dsn"),
        ([{"name": "p", "addresses": ["p"]}], "addresses need pool_mode"),
        (
            [{"name": "p", "admin_dsn": "host=p", "pool_mode": "session"}],
            "pool_mode goes with addresses",
        ),
        (
            [{"name": "p", "addresses": ["p"], "pool_mode": "session", "passwordSecret": SECRET}],
            "go with admin_dsn",
        ),
        (
            [
                {
                    "name": "p",
                    "admin_dsn": "host=p",
                    "password_file": "/p",
                    "passwordSecret": SECRET,
                }
            ],
            'pooler "p" of target "a" has both passwordSecret and password_file',
        ),
    ],
    ids=[
        "a name twice",
        "both sources",
        "no source",
        "no pool mode",
        "pool mode with the console",
        "password with addresses",
        "two passwords",
    ],
)
def test_poolers_the_exporter_would_refuse_fail_the_render(
    poolers: list[dict[str, Any]], message: str
) -> None:
    """Said at install, in the exporter's words, rather than by a pod that will not start."""
    with pytest.raises(HelmError, match=message):
        render_files({"config": {"targets": [{"name": "a", "dsn": "host=a", "poolers": poolers}]}})


def test_auth_modules_take_passwords_from_existing_secrets() -> None:
    values = VALUE_SETS["example-sharded-discovery"]
    documents = render(values)
    config = load_yaml(config_text(documents))
    assert "targets" not in config
    given = values["config"]["auth_modules"]["fleet"]
    module = config["auth_modules"]["fleet"]
    assert "passwordSecret" not in module
    secret = given["passwordSecret"]
    assert mounted_files(documents)[module["password_file"]] == (secret["name"], secret["key"])
    assert {k: v for k, v in module.items() if k != "password_file"} == {
        k: v for k, v in given.items() if k != "passwordSecret"
    }


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {
                "config": {
                    "auth_modules": {
                        "fleet": {
                            "user": "monitor",
                            "allowed_targets": ["10.0.0.0/8"],
                            "password_file": "/p",
                            "passwordSecret": SECRET,
                        }
                    }
                }
            },
            'module "fleet" has both passwordSecret and password_file',
        ),
        (
            {
                "config": {
                    "targets": [],
                    "auth_modules": {"fleet": {"user": "u", "allowed_targets": ["10.0.0.0/8"]}},
                },
                "serviceMonitor": {"enabled": True, "multipleTarget": {"enabled": True}},
            },
            "probes of discovered targets are routed by Prometheus",
        ),
    ],
    ids=["two passwords", "multi-target without targets"],
)
def test_auth_modules_the_exporter_would_refuse_fail_the_render(
    values: Values, message: str
) -> None:
    with pytest.raises(HelmError, match=message):
        render_files(values)


def test_the_whole_file_can_come_from_a_secret() -> None:
    documents = render(VALUE_SETS["config-from-secret"])
    container = exporter_container(documents)
    assert "--config.file=/etc/pg-advisory-exporter/config/exporter.yaml" in container["args"]
    (volume,) = (v for v in pod_spec(documents)["volumes"] if v["name"] == "config")
    assert volume["secret"] == {
        "secretName": "pg-advisory-exporter-config",
        "defaultMode": 0o440,
        "optional": False,
    }


def exporter_readable(documents: list[Document], folder: Path) -> Path:
    """The rendered configuration file, its password files replaced by files in `folder`
    after checking that each is where a Secret is mounted or a volume of the user's is."""
    config = load_yaml(config_text(documents))
    mounted = mounted_files(documents)
    user_mounts = [m["mountPath"] for m in exporter_container(documents)["volumeMounts"]]
    for i, target in enumerate(config.get("targets", [])):
        for j, holder in enumerate([target, *target.get("poolers", [])]):
            if "password_file" in holder:
                path = holder["password_file"]
                assert path in mounted or any(path.startswith(f"{m}/") for m in user_mounts), path
                local = folder / f"password-{i}-{j}"
                local.write_text("not-a-real-password\n")
                holder["password_file"] = str(local)
    for name, module in config.get("auth_modules", {}).items():
        if "password_file" in module:
            assert module["password_file"] in mounted, (name, module["password_file"])
            local = folder / f"password-{name}"
            local.write_text("not-a-real-password\n")
            module["password_file"] = str(local)
    config_path = folder / "config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    return config_path


DEFAULT_TARGETS = load_yaml((CHART / "values.yaml").read_text())["config"]["targets"]
OWN_CONFIG = [n for n, v in VALUE_SETS.items() if not v.get("config", {}).get("existingSecret")]


@pytest.mark.parametrize("name", OWN_CONFIG)
def test_the_exporter_loads_the_rendered_configuration(name: str, tmp_path: Path) -> None:
    values = VALUE_SETS[name]
    config = load({"config_file": exporter_readable(render(values), tmp_path)})
    given = values.get("config", {}).get("targets", DEFAULT_TARGETS)
    assert [t.name for t in config.targets] == [t["name"] for t in given]
    modules = values.get("config", {}).get("auth_modules", {})
    assert [m.name for m in config.auth_modules.values()] == list(modules)
    if name == "multi-target":
        keys = {k.name: k for k in config.targets[1].keys}
        assert keys["nightly_billing"].key == 7310001
        assert keys["far_key"].key == -8817278947285098745
        assert keys["tenant_7_export"].pair == (3001, 7)
        assert config.targets[0].collection is not None
        assert config.targets[0].collection.min_interval == 10
    if name == "poolers":
        orders, billing = config.targets
        # The file's locks_page for every target, a target's own fields winning.
        assert orders.locks_page == LocksPageSettings(
            query_text=True, query_text_length=500, reuse_for=10
        )
        assert billing.locks_page == LocksPageSettings(query_text_length=500, reuse_for=10)
        console, by_address = orders.poolers
        assert conninfo_to_dict(console.conninfo())["password"] == "not-a-real-password"
        assert by_address.addresses == ("10.12.0.0/16", "pgbouncer.orders.svc")
        assert by_address.pool_mode == "transaction"
        assert [p.name for p in billing.poolers] == ["pgbouncer"]


@pytest.mark.parametrize("name", ["multi-target", "poolers"])
def test_the_command_accepts_the_rendered_configuration(
    cli: Cli, tmp_path: Path, name: str
) -> None:
    path = exporter_readable(render(VALUE_SETS[name]), tmp_path)
    result = cli("--config.file", str(path), "--config.check")
    assert result.returncode == 0, result.stderr
    assert "2 target(s): orders, billing" in result.stdout


def _fields(model: Any) -> set[str]:
    return set(model.model_fields)


def _properties(schema: dict[str, Any], *path: str) -> set[str]:
    node = schema
    for step in path:
        node = node[step]
        if "$ref" in node:
            node = schema["definitions"][node["$ref"].rsplit("/", 1)[1]]
    return set(node["properties"])


def test_the_values_schema_knows_every_setting_of_the_file() -> None:
    """A setting added to the exporter's file must be added to values.schema.json, which
    otherwise refuses it as a typo."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    config = ("properties", "config")
    chart_only = {"existingConfigMap", "existingSecret", "existingKey"}
    # web and shard are the chart's to set: the port, and sharding.
    assert _properties(schema, *config) - chart_only == _fields(FileConfig) - {"web", "shard"}
    assert _properties(schema, *config, "properties", "log") == _fields(LogConfig)
    assert _properties(schema, *config, "properties", "collection") == _fields(CollectionSettings)
    rewrites = (*config, "properties", "collection", "properties", "application_name_rewrites")
    assert _properties(schema, *rewrites, "items") == _fields(RewriteRuleConfig)
    idle = (*config, "properties", "collection", "properties", "idle_by_design")
    assert _properties(schema, *idle, "items") == _fields(IdleByDesignConfig)
    targets = (*config, "properties", "targets", "items")
    assert _properties(schema, *targets) - {"passwordSecret"} == _fields(TargetConfig)
    poolers = (*targets, "properties", "poolers", "items")
    assert _properties(schema, *poolers) - {"passwordSecret"} == _fields(PoolerConfig)
    locks_page = _fields(LocksPageSettings)
    assert _properties(schema, *config, "properties", "locks_page") == locks_page
    assert _properties(schema, *targets, "properties", "locks_page") == locks_page
    assert _properties(schema, *config, "properties", "keys", "items") == _fields(KeyConfig)
    module = (*config, "properties", "auth_modules", "additionalProperties")
    assert _properties(schema, *module) - {"passwordSecret"} == _fields(AuthModuleConfig)
    options = schema["properties"]["config"]["properties"]["auth_modules"]
    options = options["additionalProperties"]["properties"]["options"]
    assert set(options["propertyNames"]["enum"]) == AUTH_MODULE_OPTIONS
    discovered = (*config, "properties", "discovered_targets")
    assert _properties(schema, *discovered) == _fields(DiscoveredTargetsSettings)


# -- The dashboard --------------------------------------------------------------------------


def test_the_dashboard_copy_is_the_shipped_file() -> None:
    copy = CHART / "dashboards" / "pg-advisory-exporter.json"
    shipped = ROOT / "grafana" / "pg-advisory-exporter.json"
    assert copy.read_bytes() == shipped.read_bytes(), (
        f"{copy} differs from {shipped}: run `make generate`"
    )


def test_the_dashboard_configmap_holds_the_shipped_file() -> None:
    values = VALUE_SETS["everything"]
    (dashboard,) = (
        d
        for d in render(values)
        if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard")
    )
    shipped = (ROOT / "grafana" / "pg-advisory-exporter.json").read_text()
    assert dashboard["data"] == {"pg-advisory-exporter.json": shipped}
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["metadata"]["annotations"] == {"grafana_folder": "PostgreSQL"}
    assert dashboard["metadata"]["namespace"] == "observability"


def test_the_dashboard_label_is_configurable() -> None:
    values = {"dashboard": {"enabled": True, "labels": {"grafana_dashboard": "pg"}}}
    dashboard = next(d for d in render(values) if d["metadata"]["name"].endswith("-dashboard"))
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "pg"


# -- The other optional parts ---------------------------------------------------------------


def test_pod_disruption_budget_and_network_policy() -> None:
    values = VALUE_SETS["everything"]
    documents = render(values)
    selector = only(documents, "Deployment")["spec"]["selector"]
    budget = only(documents, "PodDisruptionBudget")
    assert budget["spec"] == {"minAvailable": 1, "selector": selector}
    default_budget = only(render({"podDisruptionBudget": {"enabled": True}}), "PodDisruptionBudget")
    assert default_budget["spec"]["maxUnavailable"] == 1
    policy = only(documents, "NetworkPolicy")
    assert policy["spec"]["podSelector"] == selector
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"]["ingress"] == [
        {"ports": [{"port": "http", "protocol": "TCP"}], "from": values["networkPolicy"]["from"]}
    ]


def test_pass_through_values_reach_the_pod() -> None:
    values = VALUE_SETS["everything"]
    documents = render(values)
    pod = pod_spec(documents)
    container = exporter_container(documents)
    assert container["args"][-1] == "--web.enable-lifecycle"
    assert container["resources"] == values["resources"]
    assert pod["tolerations"] == values["tolerations"]
    assert pod["nodeSelector"] == values["nodeSelector"]
    assert pod["affinity"] == values["affinity"]
    assert pod["topologySpreadConstraints"] == values["topologySpreadConstraints"]
    assert pod["priorityClassName"] == "monitoring"
    assert pod["imagePullSecrets"] == [{"name": "registry-credentials"}]
    assert [c["name"] for c in pod["containers"]] == ["exporter", "vault-agent"]
    template = only(documents, "Deployment")["spec"]["template"]["metadata"]
    assert template["labels"]["team"] == "dba"
    assert template["annotations"]["example.com/owner"] == "dba"
    assert only(documents, "Deployment")["spec"]["replicas"] == 2
    # The servers' logs: the volume given, read-only where the targets' server_log say.
    (volume,) = (v for v in pod["volumes"] if v["name"] == "server-log")
    assert volume["persistentVolumeClaim"] == values["serverLog"]["volume"]["persistentVolumeClaim"]
    (mount,) = (m for m in container["volumeMounts"] if m["name"] == "server-log")
    assert mount == {"name": "server-log", "mountPath": "/var/log/postgresql", "readOnly": True}


def read_chart_flags(args: list[str]) -> Settings:
    """The exporter's reading of these --flag=value arguments, each a flag of its own, before
    load() resolves them (a shard index of `auto` stays so)."""
    values: dict[str, str] = {}
    for arg in args:
        flag, _, value = arg.partition("=")
        (setting,) = (s for s in SETTINGS if s.flag == flag)
        values[setting.dest] = value
    return settings_from(Flags(Settings, values))


def test_the_external_url_is_passed_as_the_exporters_flag() -> None:
    assert not [a for a in exporter_container(render({}))["args"] if "external-url" in a]
    url = VALUE_SETS["poolers"]["webExternalUrl"]
    args = exporter_container(render(VALUE_SETS["poolers"]))["args"]
    assert f"--web.external-url={url}" in args
    # The flag is the exporter's, and the exporter takes the value.
    external_url = [a for a in args if "external-url" in a]
    assert read_chart_flags(external_url).web.external_url == url.rstrip("/")
    notes = render_files(VALUE_SETS["poolers"])["pg-advisory-exporter/templates/NOTES.txt"]
    assert f"{url.rstrip('/')}/locks?target=NAME" in notes


def test_notes_name_the_job_and_the_release_label() -> None:
    notes = render_files({"serviceMonitor": {"enabled": True}})[
        "pg-advisory-exporter/templates/NOTES.txt"
    ]
    assert 'job="pg-advisory-exporter"' in notes
    assert "serviceMonitor.labels.release=" in notes
    assert "port-forward service/locks-pg-advisory-exporter 9846" in notes


def _all_documents() -> Iterator[tuple[str, Document]]:
    for name, values in VALUE_SETS.items():
        for document in render(values):
            yield name, document


def test_every_object_carries_the_standard_labels() -> None:
    for name, document in _all_documents():
        labels = document["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "pg-advisory-exporter", (name, document)
        assert labels["app.kubernetes.io/instance"] == RELEASE
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["helm.sh/chart"].startswith("pg-advisory-exporter-")


@pytest.mark.parametrize("catalog", [False, ["rails_migration", "airflow_migration"]])
def test_the_catalog_setting_reaches_the_exporter(catalog: bool | list[str]) -> None:
    """`catalog: false` is a value, not an empty one the chart may drop."""
    target = {"name": "orders", "dsn": "postgresql://monitor@orders-db/postgres"}
    values = {"config": {"catalog": catalog, "targets": [{**target, "catalog": catalog}]}}
    config = load_yaml(config_text(render(values)))
    assert config["catalog"] == catalog
    assert config["targets"][0]["catalog"] == catalog


# -- Shards ---------------------------------------------------------------------------------

SHARDED = VALUE_SETS["sharded"]
POD_INDEX = "metadata.labels['apps.kubernetes.io/pod-index']"


def shard_args(documents: list[Document]) -> list[str]:
    return [a for a in exporter_container(documents)["args"] if a.startswith("--shard.")]


def test_shards_render_a_statefulset_behind_a_headless_service() -> None:
    documents = render(SHARDED)
    assert not [d for d in documents if d["kind"] == "Deployment"]
    statefulset, service = only(documents, "StatefulSet"), only(documents, "Service")
    assert statefulset["spec"]["replicas"] == SHARDED["sharding"]["shards"] == 3
    assert statefulset["spec"]["serviceName"] == service["metadata"]["name"]
    assert service["metadata"]["name"] == "locks-pg-advisory-exporter-headless"
    assert statefulset["spec"]["podManagementPolicy"] == "Parallel"
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    pod_labels = statefulset["spec"]["template"]["metadata"]["labels"].items()
    assert service["spec"]["selector"].items() <= pod_labels
    assert statefulset["spec"]["selector"]["matchLabels"].items() <= pod_labels


def test_each_shard_takes_its_index_from_its_pod_index_label() -> None:
    container = exporter_container(render(SHARDED))
    args = shard_args(render(SHARDED))
    assert args == ["--shard.total=3", "--shard.index=$(SHARD_INDEX)"]
    variable = container["env"][0]
    assert variable == {"name": "SHARD_INDEX", "valueFrom": {"fieldRef": {"fieldPath": POD_INDEX}}}
    # The exporter takes the arguments as the kubelet expands them in each pod.
    for index in range(3):
        expanded = [a.replace("$(SHARD_INDEX)", str(index)) for a in args]
        shard = read_chart_flags(expanded).shard
        assert (shard.total, shard.index) == (3, index)


def test_each_shard_can_take_its_index_from_its_host_name() -> None:
    documents = render({"sharding": {"shards": 2, "indexFrom": "hostname"}})
    assert shard_args(documents) == ["--shard.total=2", "--shard.index=auto"]
    assert "env" not in exporter_container(documents)
    shard = read_chart_flags(shard_args(documents)).shard
    assert (shard.total, shard.index) == (2, "auto")


@pytest.mark.parametrize("name", ["defaults", "everything", "multi-target"])
@pytest.mark.parametrize("shards", [0, 1])
def test_one_shard_or_none_renders_the_deployment_as_before(name: str, shards: int) -> None:
    values = VALUE_SETS[name]
    assert render_files({**values, "sharding": {"shards": shards}}) == render_files(values)
    assert only(render(values), "Deployment")
    assert not shard_args(render(values))


def test_the_monitors_and_policies_reach_every_shard() -> None:
    documents = render(SHARDED)
    statefulset = only(documents, "StatefulSet")
    selector = statefulset["spec"]["selector"]
    pod_labels = statefulset["spec"]["template"]["metadata"]["labels"].items()
    service_labels = only(documents, "Service")["metadata"]["labels"].items()
    # The ServiceMonitor finds the headless Service, whose endpoints are every shard's pod;
    # the PodMonitor finds the pods themselves. Each scrapes /metrics, the shard's targets.
    service_monitor = only(documents, "ServiceMonitor")
    assert service_monitor["spec"]["selector"]["matchLabels"].items() <= service_labels
    pod_monitor = only(documents, "PodMonitor")
    assert pod_monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels
    for monitor in (service_monitor, pod_monitor):
        (endpoint,) = scrape_endpoints(monitor)
        assert (endpoint["path"], endpoint["port"]) == ("/metrics", "http")
    assert only(documents, "PodDisruptionBudget")["spec"]["selector"] == selector
    assert only(documents, "NetworkPolicy")["spec"]["podSelector"] == selector


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"serviceMonitor": {"enabled": True, "multipleTarget": {"enabled": True}}},
            "serviceMonitor.multipleTarget",
        ),
        (
            {"podMonitor": {"enabled": True, "multipleTarget": {"enabled": True}}},
            "podMonitor.multipleTarget",
        ),
        ({"replicaCount": 2}, "leave replicaCount at 1"),
        ({"service": {"type": "NodePort"}}, "the Service is headless"),
    ],
    ids=["multi-target ServiceMonitor", "multi-target PodMonitor", "replicaCount", "NodePort"],
)
def test_what_sharding_cannot_do_fails_the_render(values: Values, message: str) -> None:
    with pytest.raises(HelmError, match=message):
        render_files({**values, "sharding": {"shards": 2}})


def _example_job_without_kubernetes(static_configs: list[dict[str, Any]]) -> dict[str, Any]:
    """The example's Prometheus job, the Services that Kubernetes discovery would find given
    as static targets carrying its labels: the tests' Prometheus has no Kubernetes to discover."""
    prometheus = load_yaml(EXAMPLE_PROMETHEUS.read_text())
    (job,) = prometheus["prometheus"]["prometheusSpec"]["additionalScrapeConfigs"]
    assert job.pop("kubernetes_sd_configs") == [{"role": "service"}]
    job["static_configs"] = static_configs
    return dict(job)


def _cnpg_service(cluster: str, role: str = "rw") -> dict[str, str]:
    """The labels Kubernetes discovery gives a CloudNativePG cluster's Service."""
    return {
        "__meta_kubernetes_service_label_cnpg_io_cluster": cluster,
        "__meta_kubernetes_service_name": f"{cluster}-{role}",
        "__meta_kubernetes_namespace": "payments",
    }


def _hashmod(value: str, modulus: int) -> int:
    """Prometheus' hashmod: the last 8 bytes of the value's MD5, big-endian, modulo."""
    return int.from_bytes(hashlib.md5(value.encode()).digest()[8:], "big") % modulus


def _routed_by_a_real_prometheus(
    start_service: StartService, tmp_path: Path, job: dict[str, Any], count: int
) -> tuple[dict[str, int], int]:
    """The job in Prometheus 3, once it has its `count` targets: the shard each probe's
    target goes to (a pod of the example chart's StatefulSet, by its stable name, with its
    auth module), and the number of shards."""
    documents = render(VALUE_SETS["example-sharded-discovery"])
    statefulset, service = only(documents, "StatefulSet"), only(documents, "Service")
    assert job["job_name"] == Thresholds().exporter_job
    modules = list(load_yaml(config_text(documents))["auth_modules"])
    config = {"global": {"scrape_interval": "1h"}, "scrape_configs": [job]}
    port = start_prometheus(start_service, tmp_path, config)
    active: list[dict[str, Any]] = []

    def every_target_found() -> bool:
        active[:] = prometheus_api(port, "targets", state="active")["activeTargets"]
        return len(active) == count

    wait_until(every_target_found, 30, lambda: f"{count} targets, not {active}", 0.5)
    name, headless = statefulset["metadata"]["name"], service["metadata"]["name"]
    pod = re.compile(rf"{re.escape(name)}-([0-9]+)\.{re.escape(headless)}\.{NAMESPACE}\.svc:9846")
    routed: dict[str, int] = {}
    for target in active:
        url = urllib.parse.urlsplit(target["scrapeUrl"])
        query = urllib.parse.parse_qs(url.query)
        assert query["auth_module"] == modules
        (probed,) = query["target"]
        assert target["labels"]["instance"] == probed
        address = pod.fullmatch(url.netloc)
        assert address, f"{probed} is probed at {url.netloc}, no pod of {name}"
        routed[probed] = int(address[1])
    return routed, statefulset["spec"]["replicas"]


def test_a_real_prometheus_routes_each_discovered_database_to_one_shard(
    start_service: StartService, tmp_path: Path
) -> None:
    """The example's job in Prometheus 3: every CloudNativePG read-write Service is probed
    at one pod of the StatefulSet, the one hashmod of its host picks, by its stable name."""
    clusters = [f"c{i:02d}" for i in range(30)]
    services = [
        {"targets": [f"{cluster}-{role}:5432"], "labels": _cnpg_service(cluster, role)}
        for cluster in clusters
        for role in ("rw", "ro")  # only the read-write ones are kept
    ]
    job = _example_job_without_kubernetes(services)
    routed, shards = _routed_by_a_real_prometheus(start_service, tmp_path, job, len(clusters))
    hosts = [f"{c}-rw.payments.svc.cluster.local" for c in clusters]
    assert routed == {f"{host}:5432": _hashmod(host, shards) for host in hosts}
    assert set(routed.values()) == set(range(shards))  # every shard gets databases


def test_a_real_prometheus_routes_every_database_of_a_server_to_its_shard(
    start_service: StartService, tmp_path: Path
) -> None:
    """The example's job in Prometheus 3, probing several databases of each server, the
    port written or left out: every database of a server is probed at the one pod that
    hashmod of the server's host picks, and every pod gets servers."""
    hosts = [f"c{i:02d}-rw.payments.svc.cluster.local" for i in range(30)]
    hosts += ["10.96.7.12", "[fd00:10:96::7:12]"]
    spellings = ("{}:5432/app", "{}:5432/orders", "{}/billing", "{}")
    # A name in capitals with a trailing dot is the same server to the exporter.
    shouted = [f"{host.upper()}.:5432/shop" for host in hosts if host[0].isalpha()]
    # Static targets carry their __param_target in place of the example's rule that makes it
    # from a Service's name (which names no database); every other rule is the example's.
    static_configs = [
        {
            "targets": [f"c{index:02d}-rw:5432"],
            "labels": {**_cnpg_service(f"c{index:02d}"), "__param_target": spelling.format(host)},
        }
        for index, host in enumerate(hosts)
        for spelling in spellings
    ] + [
        {
            "targets": [f"c{index:02d}-rw:5432"],
            "labels": {**_cnpg_service(f"c{index:02d}"), "__param_target": target},
        }
        for index, target in enumerate(shouted)
    ]
    job = _example_job_without_kubernetes(static_configs)
    rules = job["relabel_configs"]
    (setting,) = [rule for rule in rules if rule.get("target_label") == "__param_target"]
    rules.remove(setting)
    count = len(hosts) * len(spellings) + len(shouted)
    routed, shards = _routed_by_a_real_prometheus(start_service, tmp_path, job, count)
    written = [s.format(host) for host in hosts for s in spellings]
    assert sorted(routed) == sorted(written + shouted)
    servers = {host: {routed[s.format(host)] for s in spellings} for host in hosts}
    for target in shouted:
        servers[target.split(".:")[0].lower()].add(routed[target])
    assert servers == {host: {_hashmod(host, shards)} for host in hosts}
    assert set(routed.values()) == set(range(shards))  # every shard gets servers


def _snake(name: str) -> str:
    """A ScrapeConfig field as Prometheus' configuration spells it (sourceLabels:
    source_labels), as the operator writes it."""
    return re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()


def _as_prometheus_job(scrape_config: Document) -> dict[str, Any]:
    """The job the Prometheus Operator makes of the chart's ScrapeConfig: the fields the chart
    sets, under Prometheus' names (the operator names the job scrapeConfig/NAMESPACE/NAME;
    the chart's rules set the `job` label)."""
    spec = scrape_config["spec"]
    metadata = scrape_config["metadata"]
    fields = {"metricsPath", "params", "honorLabels", "scrapeInterval", "scrapeTimeout"}
    assert set(spec) <= fields | {"staticConfigs", "relabelings", "metricRelabelings"}, spec
    return {
        "job_name": f"scrapeConfig/{metadata['namespace']}/{metadata['name']}",
        **{_snake(name): spec[name] for name in fields & set(spec)},
        "static_configs": spec["staticConfigs"],
        "relabel_configs": [
            {_snake(k): v for k, v in rule.items()} for rule in spec["relabelings"]
        ],
        "metric_relabel_configs": [
            {_snake(k): v for k, v in rule.items()} for rule in spec.get("metricRelabelings", [])
        ],
    }


@pytest.mark.parametrize("shards", [3, 1])
def test_a_real_prometheus_probes_through_the_scrape_config(
    start_service: StartService, tmp_path: Path, shards: int
) -> None:
    """The chart's ScrapeConfig, as the operator hands it to Prometheus 3: each discovered
    server probed at /probe through the auth module, its target in `instance` and the
    rules' `job`; sharded, at the pod that hashmod of its host picks (every database of a
    server at one), else at the Service."""
    values = {**VALUE_SETS["scrape-config"], "sharding": {"shards": shards}}
    documents = render(values)
    job = _as_prometheus_job(only(documents, "ScrapeConfig"))
    (group,) = job["static_configs"]
    config = {"global": {"scrape_interval": "1h"}, "scrape_configs": [job]}
    port = start_prometheus(start_service, tmp_path, config)
    active: list[dict[str, Any]] = []

    def every_target_found() -> bool:
        active[:] = prometheus_api(port, "targets", state="active")["activeTargets"]
        return len(active) == len(group["targets"])

    wait_until(every_target_found, 30, lambda: f"{group['targets']}, not {active}", 0.5)
    service = only(documents, "Service")["metadata"]["name"]
    probed: dict[str, str] = {}
    for target in active:
        url = urllib.parse.urlsplit(target["scrapeUrl"])
        query = urllib.parse.parse_qs(url.query)
        assert (url.path, query["auth_module"]) == ("/probe", ["fleet"])
        (name,) = query["target"]
        labels = target["labels"]
        assert (labels["instance"], labels["job"], labels["team"]) == (
            name,
            Thresholds().exporter_job,
            "payments",
        )
        probed[name] = url.netloc
    assert sorted(probed) == sorted(group["targets"])
    for name, address in probed.items():
        if shards == 1:
            assert address == f"{service}.{NAMESPACE}.svc:9846"
        else:
            pod = f"{RELEASE}-pg-advisory-exporter-{_hashmod(name.split(':')[0], shards)}"
            assert address == f"{pod}.{service}.{NAMESPACE}.svc:9846"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"authModule": "rds"},
            r'scrapeConfig.authModule: "rds" is not one of config.auth_modules \(fleet\)',
        ),
        ({"authModule": ""}, r'scrapeConfig.authModule: "" is not one of'),
        ({"discovery": {}}, "scrapeConfig.discovery: give where Prometheus finds the servers"),
    ],
    ids=["unknown module", "no module", "no discovery"],
)
def test_a_scrape_config_that_cannot_probe_fails_the_render(change: Values, message: str) -> None:
    values = copy.deepcopy(VALUE_SETS["scrape-config"])
    values["scrapeConfig"].update(change)
    with pytest.raises(HelmError, match=message):
        render_files(values)
