"""The chart's PrometheusRule: generated from the same code as `rules`, and equal to what the
command prints for the same thresholds and labels, rendered by the real Helm engine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helm_python.chart import Chart
from helm_python.errors import HelmValuesError
from support import TUNED_THRESHOLDS, Cli, load_yaml, load_yaml_all, set_flags

from devtools.rules_chart import (
    DURATION_TEXT,
    catalog_schema,
    duration_texts,
    helm_template,
    thresholds_schema,
)
from pg_advisory_exporter.alerting.rules import Thresholds, rule_groups

ROOT = Path(__file__).parent.parent
CHART = ROOT / "deploy" / "helm" / "pg-advisory-exporter"
TEMPLATE = CHART / "templates" / "prometheusrule.yaml"


def _chart_rule(values: dict[str, Any]) -> dict[str, Any]:
    rendered = Chart.load(str(CHART)).render(values, name="locks", namespace="monitoring")
    documents: list[dict[str, Any]] = [
        doc
        for path, text in rendered.items()
        if path.endswith(".yaml")  # not NOTES.txt
        for doc in load_yaml_all(text)
        if doc and doc.get("kind") == "PrometheusRule"
    ]
    assert len(documents) == 1, sorted(rendered)
    return documents[0]


def test_the_template_is_fresh() -> None:
    assert TEMPLATE.read_text() == helm_template(), (
        f"{TEMPLATE} is stale: run `make generate` and commit the result"
    )


def test_off_by_default() -> None:
    rendered = Chart.load(str(CHART)).render({}, name="locks", namespace="monitoring")
    assert "kind: PrometheusRule" not in "".join(rendered.values())


@pytest.mark.parametrize("thresholds", [{}, TUNED_THRESHOLDS], ids=["defaults", "tuned"])
def test_the_chart_renders_what_the_command_prints(cli: Cli, thresholds: dict[str, Any]) -> None:
    labels = {"release": "kube-prometheus-stack"}
    rule = _chart_rule(
        {
            "prometheusRule": {
                "enabled": True,
                "additionalLabels": labels,
                "thresholds": thresholds,
            }
        }
    )
    printed = cli(
        "rules", "--format", "prometheusrule", "--label", "release=kube-prometheus-stack",
        *set_flags(thresholds), check=True,
    ).stdout  # fmt: skip
    expected = load_yaml(printed)
    assert rule["spec"] == expected["spec"]
    assert labels.items() <= rule["metadata"]["labels"].items()
    assert rule["metadata"]["namespace"] == "monitoring"


def test_the_exporter_down_alert_follows_the_charts_job_name() -> None:
    rule = _chart_rule({"prometheusJob": "db-locks", "prometheusRule": {"enabled": True}})
    (down,) = (
        r for r in rule["spec"]["groups"][0]["rules"] if r["alert"] == "PgAdvisoryExporterDown"
    )
    assert down["expr"] == 'up{job="db-locks"} == 0'


def test_the_thresholds_schema_is_fresh() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["properties"]["prometheusRule"]["properties"]["thresholds"] == (
        thresholds_schema()
    ), "values.schema.json is stale: run `make generate` and commit the result"
    config = schema["properties"]["config"]["properties"]
    for catalog in (config["catalog"], config["targets"]["items"]["properties"]["catalog"]):
        assert catalog == catalog_schema(), "values.schema.json is stale: run `make generate`"
    texts = list(duration_texts(schema))
    assert len(texts) > len(Thresholds.model_fields) // 2  # the configuration's and the rules'
    assert all(text == DURATION_TEXT for text in texts), "stale: run `make generate`"


@pytest.mark.parametrize(
    "duration",
    ["1w", "2w", "10d", "1y", "53w", "1y2w", "1d1h1m1s1ms", "1s500ms", "90", "1.5", 2.5, 1209600],
)
def test_the_chart_reads_and_writes_durations_as_the_command_does(duration: str | float) -> None:
    thresholds = {"deadlocks_window": duration, "key_not_held_for": duration}
    rule = _chart_rule({"prometheusRule": {"enabled": True, "thresholds": thresholds}})
    assert rule["spec"] == rule_groups(Thresholds.model_validate(thresholds))


@pytest.mark.parametrize(
    "thresholds",
    [
        {"leaked_lock_aftr": "1h"},
        {"leaked_lock_after": "soon"},
        {"leaked_lock_after": "5s1m"},
        {"leaked_lock_after": "1.5h"},
        {"leaked_lock_after": ""},
        {"lock_table_critical": 2},
    ],
    ids=["misspelt", "not a duration", "units out of order", "fraction", "empty", "out of range"],
)
def test_a_threshold_the_command_refuses_fails_the_render(thresholds: dict[str, Any]) -> None:
    with pytest.raises(HelmValuesError, match="thresholds"):
        _chart_rule({"prometheusRule": {"enabled": True, "thresholds": thresholds}})
