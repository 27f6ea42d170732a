"""The monitoring mixin: generated from the same code as `rules`, and rendered by a real jsonnet
(go-jsonnet, in this process) into what the command prints for the same thresholds."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import _gojsonnet  # type: ignore[import-not-found]  # go-jsonnet's binding has no types
import pytest
from pydantic import ValidationError
from support import TUNED_THRESHOLDS, load_yaml, set_flags

from devtools.rules_mixin import alerts_libsonnet, config_libsonnet
from grafana import dashboard
from pg_advisory_exporter import cli
from pg_advisory_exporter.alerting.rules import Thresholds, rule_groups

ROOT = Path(__file__).parent.parent
MIXIN = ROOT / "pg-advisory-exporter-mixin"


def _render(expression: str, config: Mapping[str, Any], vendor: Path = ROOT) -> Any:
    """`expression` over the mixin with these _config overrides, imported as a user's code
    imports it from jsonnet-bundler's vendor folder (`jsonnet -J vendor`)."""
    snippet = (
        f"local mixin = (import '{MIXIN.name}/mixin.libsonnet') "
        f"+ {{ _config+:: {json.dumps(config)} }};\n{expression}"
    )
    return json.loads(_gojsonnet.evaluate_snippet("test", snippet, jpathdir=str(vendor)))


def _alerts(config: Mapping[str, Any], vendor: Path = ROOT) -> Any:
    """The rule file a user renders (`jsonnet -S -e 'std.manifestYamlDoc(...)'`), parsed."""
    return load_yaml(_render("std.manifestYamlDoc(mixin.prometheusAlerts)", config, vendor))


def _printed(capsys: pytest.CaptureFixture[str], thresholds: Mapping[str, Any]) -> Any:
    """What `pg-advisory-exporter rules --set NAME=VALUE...` prints, run in this process."""
    assert cli.main(["rules", *set_flags(thresholds)]) == 0
    return load_yaml(capsys.readouterr().out)


@pytest.mark.parametrize(
    ("path", "generated"),
    [("alerts/alerts.libsonnet", alerts_libsonnet), ("config.libsonnet", config_libsonnet)],
)
def test_the_generated_files_are_fresh(path: str, generated: Callable[[], str]) -> None:
    assert (MIXIN / path).read_text() == generated(), (
        f"{MIXIN.name}/{path} is stale: run `make generate` and commit the result"
    )


def test_the_dashboard_copy_is_the_generated_dashboard(capsys: pytest.CaptureFixture[str]) -> None:
    dashboard.main()  # what `python -m grafana.dashboard` (make generate) prints
    copy = MIXIN / "dashboards" / "pg-advisory-exporter.json"
    assert copy.read_text() == capsys.readouterr().out, f"{copy} is stale: run `make generate`"


def test_the_config_has_the_commands_thresholds_and_defaults() -> None:
    config = _render("mixin._config", {})
    assert sorted(config) == sorted(Thresholds.model_fields)
    assert Thresholds.model_validate(config) == Thresholds()


@pytest.mark.parametrize("thresholds", [{}, TUNED_THRESHOLDS], ids=["defaults", "tuned"])
def test_the_mixin_renders_what_the_command_prints(
    capsys: pytest.CaptureFixture[str], thresholds: dict[str, Any]
) -> None:
    assert _alerts(thresholds) == _printed(capsys, thresholds)


@pytest.mark.parametrize(
    "duration",
    ["1w", "2w", "10d", "1y", "53w", "1y2w", "1d1h1m1s1ms", "1s500ms", "90", "1.5", " 5m ",
     "0.0015", 2.5, 1209600],
)  # fmt: skip
def test_the_mixin_reads_and_writes_durations_as_the_command_does(duration: str | float) -> None:
    # Each use of a duration: PromQL's seconds, a range, `for`, a description's text.
    thresholds = dict.fromkeys(("leaked_lock_after", "deadlocks_window", "wait_for"), duration)
    assert _alerts(thresholds) == rule_groups(Thresholds.model_validate(thresholds))


@pytest.mark.parametrize(
    "duration",
    ["soon", "5s1m", "1.5h", "5 m", "", "0s", 0, -5, True],
    ids=["not a duration", "units out of order", "fraction", "space inside", "empty", "zero",
         "zero seconds", "negative", "boolean"],
)  # fmt: skip
def test_a_duration_the_command_refuses_fails_the_render(duration: str | float) -> None:
    with pytest.raises(ValidationError):
        Thresholds.model_validate({"leaked_lock_after": duration})
    with pytest.raises(RuntimeError, match="is not a duration"):
        _alerts({"leaked_lock_after": duration})


def test_the_dashboard_is_the_generated_one(capsys: pytest.CaptureFixture[str]) -> None:
    dashboard.main()
    generated = json.loads(capsys.readouterr().out)
    # The thresholds it draws are the defaults: _config does not reach it (dashboards.libsonnet).
    tuned = _render("mixin.grafanaDashboards", TUNED_THRESHOLDS)
    assert tuned == {"pg-advisory-exporter.json": generated}


def test_the_mixin_renders_from_its_own_folder_alone(tmp_path: Path) -> None:
    # jsonnet-bundler vendors the folder alone: nothing in it may import from outside.
    shutil.copytree(MIXIN, tmp_path / MIXIN.name)
    assert _alerts(TUNED_THRESHOLDS, vendor=tmp_path) == _alerts(TUNED_THRESHOLDS)
    assert _render("std.objectFields(mixin.grafanaDashboards)", {}, vendor=tmp_path) == [
        "pg-advisory-exporter.json"
    ]


@pytest.mark.parametrize("thresholds", [{}, TUNED_THRESHOLDS], ids=["defaults", "tuned"])
def test_promtool_accepts_the_rendered_rules(
    tmp_path: Path, each_promtool: str, thresholds: dict[str, Any]
) -> None:
    path = tmp_path / "alerts.yaml"
    path.write_text(_render("std.manifestYamlDoc(mixin.prometheusAlerts)", thresholds, ROOT))
    result = subprocess.run(
        [each_promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
