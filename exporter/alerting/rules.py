"""The alert rules, generated from thresholds: the shipped file and anyone's tuned copy."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import AfterValidator, Field, ValidationError, field_validator

from pg_advisory_exporter.alerting.alerts import Alerts
from pg_advisory_exporter.alerting.rule_writer import RuleValues
from pg_advisory_exporter.durations import Duration, format_duration
from pg_advisory_exporter.validation import ConfigError, Strict, describe_error
from pg_advisory_exporter.yaml_file import read_model

RUNBOOK_URL = (
    "https://github.com/pg-advisory-exporter/pg-advisory-exporter/blob/main/docs/runbook.md"
)
GROUP_NAME = "pg-advisory-exporter"


# The labels every aggregation keeps already; a group label must add something.
_OWN_LABELS = ("job", "instance", "target", "datname", "application_name", "state", "key")


def _not_own(name: str) -> str:
    if name in _OWN_LABELS:
        raise ValueError(f"{name!r} is kept by every rule already")
    return name


LabelName = Annotated[str, Field(pattern=r"^[a-zA-Z_][a-zA-Z0-9_]*$"), AfterValidator(_not_own)]


class Thresholds(Strict):
    """Every tunable of the rules; `pg-advisory-exporter rules --set NAME=VALUE` sets one."""

    leaked_lock_after: Duration = Field(900, description="idle time of a holder that pages")
    leaked_lock_for: Duration = Field(120, description="how long it must last")
    wait_after: Duration = Field(300, description="a wait this long warns")
    wait_for: Duration = Field(60, description="how long it must last")
    waiters: int = Field(10, ge=1, description="waiters of one application that warn")
    waiters_for: Duration = Field(300, description="how long they must pile up")
    lock_table_warning: float = Field(0.6, gt=0, le=1, description="share of capacity")
    lock_table_critical: float = Field(0.8, gt=0, le=1, description="share of capacity")
    lock_table_for: Duration = Field(120, description="how long the table must stay that full")
    lock_table_forecast_horizon: Duration = Field(
        14400, description="the lock table forecast to be full within this long pages"
    )
    lock_table_forecast_window: Duration = Field(
        21600, description="the forecast's growth rate is measured over this long"
    )
    lock_table_forecast_smoothing: Duration = Field(
        900,
        description="the growth is that of the lowest fill over this long, so that locks "
        "taken and released within it (one transaction's) do not count",
    )
    lock_table_forecast_min_fill: float = Field(
        0.3, ge=0, lt=1, description="the lowest fill must be above this share of capacity"
    )
    lock_table_forecast_for: Duration = Field(900, description="how long the forecast must last")
    backend_lock_budget: float = Field(
        1.0, gt=0, description="advisory locks of one backend, in max_locks_per_transaction"
    )
    backend_lock_budget_for: Duration = Field(300, description="how long it must last")
    deadlocks: int = Field(0, ge=0, description="more deadlocks than this in the window warn")
    deadlocks_window: Duration = Field(600, description="the window")
    unlocks_not_held: int = Field(
        0, ge=0, description="more logged unlocks of locks not held than this in the window warn"
    )
    unlocks_not_held_window: Duration = Field(600, description="the window")
    out_of_shared_memory_window: Duration = Field(
        900, description="a lock table found full within this long pages"
    )
    dead_client_release_after: Duration = Field(
        900,
        description="a server that would keep a dead client's session locks longer than this "
        "warns, while session locks are held",
    )
    dead_client_release_for: Duration = Field(600, description="how long it must last")
    target_down_for: Duration = Field(300, description="a server unreadable this long pages")
    exporter_down_for: Duration = Field(300, description="the exporter unscrapable this long")
    web_config_refused_for: Duration = Field(
        600, description="a changed web configuration file refused this long warns"
    )
    config_refused_for: Duration = Field(
        600, description="a reload of the configuration file refused this long warns"
    )
    shards_missing_for: Duration = Field(
        900, description="a shard of a sharded exporter without a replica this long pages"
    )
    sharding_mismatch_for: Duration = Field(
        900, description="replicas of one job that disagree on --shard.total this long warn"
    )
    key_not_held_for: Duration = Field(120, description="an expect_held key without holder")
    key_held_too_long_for: Duration = Field(60, description="a key over its max_hold")
    migration_lock_held_after: Duration = Field(
        900, description="a migration tool's lock held in one state this long pages"
    )
    migration_lock_waited_after: Duration = Field(
        300, description="the same, this long when a session waits for the lock"
    )
    migration_lock_for: Duration = Field(60, description="how long it must last")
    pooled_session_lock_for: Duration = Field(
        60, description="a session lock stranded in a transaction pool this long pages"
    )
    pooled_session_lock_gap: Duration = Field(
        30,
        description="the longest the stranded backend may be seen serving another client's "
        "transaction without the alert starting over",
    )
    exporter_job: str = Field(
        "pg-advisory-exporter", description="the Prometheus job that scrapes the exporter"
    )
    selector: str = Field(
        "", description='extra matchers for every series, e.g. cluster="eu-1"', pattern=r"^[^{}]*$"
    )
    group_labels: tuple[LabelName, ...] = Field(
        ("namespace", "pod", "cluster"),
        description="labels of where the exporter runs that aggregating alerts keep, so that "
        "routes can match them; absent ones are ignored (comma-separated with --set)",
    )

    @field_validator("group_labels", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(label.strip() for label in value.split(",") if label.strip())
        return value

    runbook_url: str = Field(RUNBOOK_URL, description="the runbook's address; #alertname is added")


def format_number(value: float) -> str:
    return f"{value:g}"


@dataclass(frozen=True)
class ThresholdValues:
    """The values themselves."""

    t: Thresholds

    def seconds(self, name: str) -> str:
        return format_number(getattr(self.t, name))

    def duration(self, name: str) -> str:
        return format_duration(getattr(self.t, name))

    def number(self, name: str) -> str:
        value = getattr(self.t, name)
        return format_number(value) if isinstance(value, float) else str(value)

    def percent(self, name: str) -> str:
        return f"{getattr(self.t, name):.0%}"

    def text(self, name: str) -> str:
        return str(getattr(self.t, name))

    def quoted(self, name: str) -> str:
        return json.dumps(getattr(self.t, name))

    def group_labels(self) -> str:
        return "".join(f", {label}" for label in self.t.group_labels)

    def selector(self, metric: str, matchers: str) -> str:
        joined = ", ".join(m for m in (matchers, self.t.selector) if m)
        return f"{metric}{{{joined}}}" if joined else metric


def groups_of(values: RuleValues) -> list[dict[str, Any]]:
    """The rule groups, their thresholds spelled by `values`."""
    return [{"name": GROUP_NAME, "rules": Alerts(values).all()}]


def rule_groups(thresholds: Thresholds) -> dict[str, Any]:
    """A Prometheus rule file's content."""
    return {"groups": groups_of(ThresholdValues(thresholds))}


def prometheus_rule(
    thresholds: Thresholds, name: str, namespace: str | None, labels: dict[str, str]
) -> dict[str, Any]:
    """The same rules as a prometheus-operator PrometheusRule."""
    metadata: dict[str, Any] = {"name": name}
    if namespace:
        metadata["namespace"] = namespace
    if labels:
        metadata["labels"] = labels
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": metadata,
        "spec": rule_groups(thresholds),
    }


HEADER = (
    "# Generated by `pg-advisory-exporter rules{args}`; do not edit: "
    "regenerate with your thresholds instead.\n"
)


def dump(document: dict[str, Any], command_args: str = "") -> str:
    # No line folding: a template split inside {{ }} is valid YAML but hard to read.
    body = yaml.safe_dump(document, sort_keys=False, width=10_000, allow_unicode=True)
    return HEADER.format(args=command_args) + body


def _problem(error: Mapping[str, Any]) -> str:
    if error["type"] == "extra_forbidden":
        return f"unknown field; the thresholds are {', '.join(Thresholds.model_fields)}"
    return describe_error(error)


def thresholds_from(file: Path | None, settings: Sequence[str]) -> Thresholds:
    """Thresholds from a YAML file of overrides, then NAME=VALUE settings over it."""
    values: dict[str, Any] = {}
    if file is not None:
        # The configuration's reader: a key given twice is refused, not the last one taken.
        values = read_model(
            file,
            Thresholds,
            what="thresholds file",
            expected="a mapping of threshold names to values",
            if_empty=dict,
            problem=_problem,
        ).model_dump(exclude_unset=True)
    for setting in settings:
        name, sep, value = setting.partition("=")
        if not sep:
            raise ConfigError(f"flag --set {setting}: expected NAME=VALUE")
        try:
            Thresholds.model_validate({**values, name: value})
        except ValidationError as exc:
            error = exc.errors()[0]
            raise ConfigError(f"flag --set {name}: {_problem(error)}") from None
        values[name] = value
    return Thresholds.model_validate(values)
