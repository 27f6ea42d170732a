"""`make bench` keeps working: the collection-cost benchmark, run small, end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support import PG_MAJOR

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.pg  # starts its own server
@pytest.mark.any_version  # what it measures is timed, not checked; the statement is elsewhere
def test_the_collection_cost_benchmark_runs_and_reports_every_figure(tmp_path: Path) -> None:
    figures = tmp_path / "figures.json"
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.collection_cost", "--locks", "300",
         "--backends", "3", "--repeat", "3", "--pg-version", str(PG_MAJOR),
         "--json", str(figures)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(figures.read_text())
    assert report["locks"] == 300
    assert [c["rows"] for c in report["configurations"]] == [3, 3, 3, 3, 3]
    assert all(len(c["ms"]) == 3 for c in report["configurations"])
    runs = report["exporters"]
    assert [run["label"] for run in runs] == [
        "default (built-in catalog)",
        "default + 10-key registry",
    ]
    for run in runs:  # every scrape was a collection of its own, between two baselines
        assert len(run["collect_duration_ms"]) == len(run["baseline_ms"]) == 3
        assert all(ms > 0 for ms in run["collect_duration_ms"] + run["baseline_ms"])
        assert 0 < run["peak_rss_mb"] < 200
    assert report["end_to_end_paired_ratio_median"] > 0
    assert "end to end, default (built-in catalog)" in result.stdout
