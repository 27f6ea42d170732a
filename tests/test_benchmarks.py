"""`make bench`, `make bench-fleet` and `make bench-statements` keep working: each benchmark,
run small, end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support import PG_MAJOR

ROOT = Path(__file__).resolve().parent.parent


def _run(module: str, tmp_path: Path, *args: str) -> tuple[dict[str, Any], str]:
    """Run `python -m benchmarks.<module>` small against this version: its figures (from
    --json) and what it printed; fail the test with its stderr if it fails."""
    figures = tmp_path / "figures.json"
    result = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{module}", *args, "--pg-version", str(PG_MAJOR),
         "--json", str(figures)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(figures.read_text()), result.stdout


@pytest.mark.pg  # starts its own server
@pytest.mark.any_version  # what it measures is timed, not checked; the statement is elsewhere
def test_the_collection_cost_benchmark_runs_and_reports_every_figure(tmp_path: Path) -> None:
    report, printed = _run(
        "collection_cost", tmp_path, "--locks", "300", "--backends", "3", "--repeat", "3"
    )
    assert report["locks"] == 300
    assert [c["rows"] for c in report["configurations"]] == [3, 3, 3, 3, 3]
    assert all(len(c["ms"]) == 3 for c in report["configurations"])
    # the statements run on a session readied as the exporter's, its own floor beside
    assert len(report["session_baseline_ms"]) == 3
    assert all(c["same_session_ratio"] > 0 for c in report["configurations"])
    assert "the same, on the exporter's session" in printed
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
    assert report["end_to_end_same_session_paired_ratio_median"] > 0
    assert all(len(run["session_baseline_ms"]) == 3 for run in runs)
    assert "end to end, default (built-in catalog)" in printed
    assert len(report["hold_tracking_ms"]) == 3
    assert all(ms > 0 for ms in report["hold_tracking_ms"])
    assert "hold tracking (the exporter, per collection)" in printed


@pytest.mark.pg  # starts its own server
@pytest.mark.any_version  # the exporter's side of a fleet: the version does not change it
def test_the_fleet_benchmark_runs_every_part_with_distinct_servers(tmp_path: Path) -> None:
    report, printed = _run(
        "fleet_scale", tmp_path, "--targets", "20", "--healthy", "2", "--timeout", "2",
        "--scrapes", "1", "--per-target", "3", "--names", "3",
    )  # fmt: skip
    # Each healthy target is a server of its own: its own connection, its own collection.
    assert report["throughput"]["connections"] == 2
    assert report["throughput"]["collections_per_second"] > 0
    fleet = report["fleet"]
    assert (fleet["targets"], fleet["healthy"], fleet["hung"], fleet["refusing"]) == (20, 2, 1, 17)
    [scrape] = fleet["scrapes"]
    assert scrape["targets"] == 20
    assert scrape["healthy_up"] == scrape["up"] == 2
    # CPU time comes in clock ticks (10 ms): too coarse for three collections to count.
    assert report["per_target"]["servers"] == 3
    assert report["per_target"]["rss_mb"] > 0
    # Names of one server: read once by the exporter, once each by a server per target.
    assert [
        (run["names"], run["connections"], run["reads_per_scrape"], run["answering_for_the_server"])
        for run in report["sharing"]
    ] == [(1, 1, 1, [1]), (3, 1, 1, [1]), (3, 3, 3, [3])]
    assert "collections/s" in printed


@pytest.mark.pg  # starts its own server
@pytest.mark.any_version  # timed, not checked: the rules are judged in tests/test_hygiene.py
def test_the_statements_benchmark_reads_and_judges_what_the_client_ran(tmp_path: Path) -> None:
    report, _ = _run(
        "statements_cost", tmp_path, "--statements", "150", "--advisory", "30", "--repeat", "3"
    )
    assert report["statements"] >= 150
    assert report["risky"] == 10  # every third advisory statement: the LIMIT form
    assert len(report["read_ms"]) == len(report["floor_ms"]) == 3
    assert report["paired_ratio_median"] > 0
