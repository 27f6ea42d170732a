"""The metric contract has one home, metrics.SPECS: every sample is checked against it, and
the README's metric table says exactly what it says."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pg_advisory_exporter.metrics import SPECS, Sample, families

README = Path(__file__).parent.parent / "README.md"


def _readme_metric_table() -> dict[str, tuple[str, ...]]:
    section = README.read_text().split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    # A series without labels has an empty labels cell.
    rows = re.findall(r"^\| `([a-z_]+)` \| ([a-z_, ]*?) *\|", section, re.MULTILINE)
    return {
        name: tuple(label.strip() for label in labels.split(",") if label) for name, labels in rows
    }


def test_the_readme_lists_every_series_with_its_labels() -> None:
    assert _readme_metric_table() == {name: spec.labels for name, spec in SPECS.items()}


def test_a_sample_outside_the_contract_is_an_error() -> None:
    with pytest.raises(ValueError, match="pg_advisory_typo is not in the metric contract"):
        families([Sample("pg_advisory_up", ("main",), 1), Sample("pg_advisory_typo", (), 1)])


def test_a_sample_with_the_wrong_labels_is_an_error() -> None:
    with pytest.raises(ValueError, match="pg_advisory_up takes labels"):
        families([Sample("pg_advisory_up", ("main", "extra"), 1)])


def test_samples_become_families_in_contract_order() -> None:
    metrics = families(
        [
            Sample("pg_advisory_exporter_collect_errors_total", ("main",), 2),
            Sample("pg_advisory_up", ("main",), 1),
        ]
    )
    assert [m.name for m in metrics] == ["pg_advisory_up", "pg_advisory_exporter_collect_errors"]
    assert metrics[1].type == "counter"
