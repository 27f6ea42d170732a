"""The shipped dashboards read back whole through Grafana's own models (grafana/schema.py),
and a field Grafana does not know, or one in the wrong place, is named wherever it is."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from grafana.schema import unknown_fields

ROOT = Path(__file__).resolve().parent.parent
DASHBOARDS = [
    ROOT / "grafana" / "pg-advisory-exporter.json",
    ROOT / "deploy" / "helm" / "pg-advisory-exporter" / "dashboards" / "pg-advisory-exporter.json",
    ROOT / "pg-advisory-exporter-mixin" / "dashboards" / "pg-advisory-exporter.json",
]
COMMITTED = json.loads(DASHBOARDS[0].read_text())


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shipped_dashboard_is_grafanas_schema_whole(path: Path) -> None:
    assert unknown_fields(json.loads(path.read_text())) == []


def _panel(document: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(p for p in document["panels"] if p.get("type") == kind)


# Each level of the dashboard, and a mistake planted in it.
PLANTED: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("dashboard", lambda d: d.update(titel="locks"), "$.titel"),
    ("panel", lambda d: _panel(d, "timeseries").update(colour="red"), ".colour"),
    ("panel options", lambda d: _panel(d, "timeseries")["options"].update(legendd={}),
     ".options.legendd"),
    ("stat options", lambda d: _panel(d, "stat")["options"].update(colourMode="value"),
     ".options.colourMode"),
    ("custom field config",
     lambda d: _panel(d, "timeseries")["fieldConfig"]["defaults"]["custom"].update(drawStylee="x"),
     ".fieldConfig.defaults.custom.drawStylee"),
    ("query", lambda d: _panel(d, "timeseries")["targets"][0].update(exprr="up"),
     ".targets[0].exprr"),
]  # fmt: skip


@pytest.mark.parametrize(("level", "plant", "where"), PLANTED, ids=[p[0] for p in PLANTED])
def test_a_field_grafana_does_not_know_is_named(
    level: str, plant: Callable[[dict[str, Any]], None], where: str
) -> None:
    document = copy.deepcopy(COMMITTED)
    plant(document)
    found = unknown_fields(document)
    assert any(where in entry for entry in found), (level, found)
