"""Applications idle by design without a server: the configuration's entries checked and
located, the catalog's chosen, holders matched and mapped apart from the leak series."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import IDLE, load_config_file, snapshot_of, write_config

from pg_advisory_exporter.cli import main
from pg_advisory_exporter.collect.series import server_samples
from pg_advisory_exporter.config.model import FileConfig
from pg_advisory_exporter.durations import parse_duration
from pg_advisory_exporter.keys.appnames import RewriteRule
from pg_advisory_exporter.keys.catalog import selected_idle_by_design
from pg_advisory_exporter.keys.idle_by_design import (
    CATALOG,
    IdleByDesign,
    IdleByDesignConfig,
)
from pg_advisory_exporter.metrics import Sample

TARGET = {"name": "orders", "dsn": "host=db"}


def _refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], entries: Any) -> str:
    """What --config.check says of a file whose target lists these entries."""
    target = {**TARGET, "collection": {"idle_by_design": entries}}
    path = write_config(tmp_path, {"targets": [target]})
    assert main(["--config.file", str(path), "--config.check"]) == 2
    return capsys.readouterr().err.replace(str(path), "FILE")


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        (
            [{"name": "q", "application_name": "a", "pattern": "a.*", "max_hold": "5m"}],
            "idle_by_design[0] (q): give exactly one of application_name or pattern (got both)",
        ),
        (
            [{"name": "q", "max_hold": "5m"}],
            "idle_by_design[0] (q): give exactly one of application_name or pattern",
        ),
        (
            [{"name": "q", "pattern": "((", "max_hold": "5m"}],
            "idle_by_design[0] (q).pattern: bad regular expression '((': missing ): ((",
        ),
        (
            [{"name": "q", "application_name": "", "max_hold": "5m"}],
            "idle_by_design[0] (q).application_name: String should have at least 1 character",
        ),
        (
            [{"name": "q", "application_name": "a"}],
            "idle_by_design[0] (q).max_hold: required field is missing",
        ),
        (
            [{"name": "q", "application_name": "a", "max_hold": "soon"}],
            "idle_by_design[0] (q).max_hold: 'soon' is not a duration",
        ),
        (
            [{"name": "q", "application_name": "a", "max_hold": 0}],
            "idle_by_design[0] (q).max_hold: Input should be greater than 0",
        ),
        (
            [{"name": "q", "application_name": "a", "max_hold": "5m", "keys": ["x"]}],
            "idle_by_design[0] (q).keys: unknown field",
        ),
        (
            [{"name": "bad name", "application_name": "a", "max_hold": "5m"}],
            "idle_by_design[0].name: String should match pattern",
        ),
        (
            [
                {"name": "q", "application_name": "a", "max_hold": "5m"},
                {"name": "q", "pattern": "b.*", "max_hold": "5m"},
            ],
            "idle_by_design: idle_by_design name 'q' is used twice",
        ),
    ],
)
def test_a_bad_entry_is_refused_with_its_file_place_and_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], entries: Any, message: str
) -> None:
    said = _refused(tmp_path, capsys, entries)
    assert f"FILE: targets[0] (orders).collection.{message}" in said


def test_entries_are_read_from_the_top_level_and_a_target_replaces_them(tmp_path: Path) -> None:
    top = [{"name": "jobs", "application_name": "orders-jobs", "max_hold": "30m"}]
    own = [{"name": "reports", "pattern": "report-[0-9]+", "max_hold": "2h"}]
    path = write_config(
        tmp_path,
        {
            "collection": {"idle_by_design": top},
            "targets": [
                TARGET,
                {**TARGET, "name": "billing", "collection": {"idle_by_design": own}},
            ],
        },
    )
    orders, billing = load_config_file(path).targets
    assert [(e.name, e.application_name, e.max_hold) for e in orders.collection.idle_by_design] == [
        ("jobs", "orders-jobs", 1800.0)
    ]
    assert [(e.name, e.pattern, e.max_hold) for e in billing.collection.idle_by_design] == [
        ("reports", "report-[0-9]+", 7200.0)
    ]


def test_a_name_matches_whole_and_the_first_entry_wins() -> None:
    exact = IdleByDesignConfig(name="jobs", application_name="orders-jobs", max_hold=60)
    pattern = IdleByDesignConfig(name="workers", pattern="orders-.*", max_hold=60)
    entries = IdleByDesign.of([exact, pattern], [])
    assert entries.match("orders-jobs") is exact
    assert entries.match("orders-jobs-2") is pattern
    assert entries.match("x-orders-jobs") is None  # a pattern matches the whole name
    assert IdleByDesign.of([pattern], []).match("orders") is None
    # Plain data: a reload compares it whole, matched or not.
    assert IdleByDesignConfig(name="workers", pattern="orders-.*", max_hold=60) == pattern


def test_the_catalogs_que_locker_matches_the_name_que_gives_its_locker() -> None:
    catalog = IdleByDesign.of([], CATALOG)
    # lib/que/locker.rb: "Que Locker: #{@connection.backend_pid}"
    found = catalog.match("Que Locker: 48213")
    assert found is not None
    assert found.name == "que_locker"
    assert catalog.match("Que Locker: ") is None
    assert catalog.match("Que Worker: 48213") is None


def test_the_catalog_setting_chooses_its_entries_and_a_configured_one_replaces_its_own() -> None:
    assert selected_idle_by_design(None) == selected_idle_by_design(True) == CATALOG
    assert selected_idle_by_design(False) == ()
    assert selected_idle_by_design(("rails_migration",)) == ()
    assert [e.name for e in selected_idle_by_design(("que_locker",))] == ["que_locker"]
    tuned = IdleByDesignConfig(name="que_locker", pattern="Que Locker: [0-9]+", max_hold=14400)
    entries = IdleByDesign.of([tuned], CATALOG)
    assert [e.max_hold for e in entries.entries if e.name == "que_locker"] == [14400]


def _values(samples: list[Sample], name: str) -> dict[tuple[str, ...], float]:
    return {s.labels: s.value for s in samples if s.name == name}


def test_an_idle_holder_idle_by_design_is_measured_apart_from_the_leak_series() -> None:
    que = replace(IDLE, pid=2, application_name="Que Locker: 2", state_seconds=1200.0)
    in_transaction = replace(
        IDLE,
        pid=3,
        application_name="Que Locker: 3",
        state="idle in transaction",
        in_transaction=True,
        state_seconds=300.0,
    )
    waiting = replace(
        IDLE, pid=4, application_name="Que Locker: 4", advisory_entries=1, awaited_mode="ShareLock"
    )
    snapshot = snapshot_of(IDLE, que, in_transaction, waiting)
    entries = IdleByDesign.of([], CATALOG)
    samples = server_samples("orders", snapshot, [], 100, idle_by_design=entries).samples
    assert _values(samples, "pg_advisory_idle_by_design_seconds") == {
        ("orders", "app", "Que Locker: 2", "que_locker"): 1200.0
    }
    assert _values(samples, "pg_advisory_idle_holder_max_seconds") == {
        ("orders", "app", "billing-worker", "idle"): 600.0,
        # Idle inside a transaction is judged as any holder's.
        ("orders", "app", "Que Locker: 3", "idle_in_transaction"): 300.0,
    }
    assert _values(samples, "pg_advisory_idle_by_design_max_hold_seconds") == {
        ("orders", "que_locker"): 3600.0
    }
    # Without the entry, the same holder is a leak's candidate.
    plain = server_samples("orders", snapshot, [], 100).samples
    assert ("orders", "app", "Que Locker: 2", "idle") in _values(
        plain, "pg_advisory_idle_holder_max_seconds"
    )
    assert _values(plain, "pg_advisory_idle_by_design_seconds") == {}


DOCS = Path(__file__).parent.parent / "docs"


def _collection_blocks() -> list[Any]:
    """The `collection` blocks of the YAML examples in the configuration's and the runbook's
    pages."""
    blocks = [
        yaml.safe_load(block)
        for page in (DOCS / "configuration.md", DOCS / "runbook.md")
        for block in re.findall(r"```yaml\n(.*?)```", page.read_text(), flags=re.DOTALL)
    ]
    return [b["collection"] for b in blocks if isinstance(b, dict) and b.get("collection")]


def test_the_documented_examples_are_valid_and_tune_the_catalog_as_it_is() -> None:
    blocks = _collection_blocks()
    for collection in blocks:
        FileConfig.model_validate({"collection": collection, "targets": [TARGET]})
    examples = [b["idle_by_design"] for b in blocks if "idle_by_design" in b]
    assert len(examples) >= 4, "the file's, the section's, the others' and the runbook's"
    catalog = {entry.name: entry.pattern for entry in CATALOG}
    tuned = [e for entries in examples for e in entries if e["name"] in catalog]
    assert tuned, "the runbook tunes a catalog entry"
    assert all(e["pattern"] == catalog[e["name"]] for e in tuned)
    # The rewrite the docs give Que's name keeps the catalog's entry matching (it matches the
    # name as given) while the label loses the pid.
    (rewrite,) = [
        r for b in blocks for r in b.get("application_name_rewrites", ()) if "Que" in r["pattern"]
    ]
    entries = IdleByDesign.of([], CATALOG)
    que = replace(IDLE, application_name="Que Locker: 4711")
    rules = [RewriteRule.compile(rewrite["pattern"], rewrite["replacement"])]
    samples = server_samples("orders", snapshot_of(que), rules, 100, idle_by_design=entries)
    assert _values(samples.samples, "pg_advisory_idle_by_design_seconds") == {
        ("orders", "app", "que-locker", "que_locker"): 600.0
    }


def test_the_documented_table_is_the_catalog() -> None:
    page = (DOCS / "configuration.md").read_text()
    section = page.split("\n## Applications idle by design\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(
        r"^\| `([\w.:-]+)` \| [^|]+ \| [^|]+ \| pattern `([^`]+)` \| (\w+) \|", section, re.M
    )
    assert [(name, pattern, parse_duration(bound)) for name, pattern, bound in rows] == [
        (entry.name, entry.pattern, entry.max_hold) for entry in CATALOG
    ]
