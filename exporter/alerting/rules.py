"""The alert rules, generated from thresholds: the shipped file and anyone's tuned copy."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Protocol

import yaml
from pydantic import AfterValidator, Field, ValidationError, field_validator

from pg_advisory_exporter.keys.catalog import MIGRATION_KEYS
from pg_advisory_exporter.schema import (
    ConfigError,
    Duration,
    Strict,
    describe_error,
    format_duration,
)
from pg_advisory_exporter.yaml_file import read_model

RUNBOOK_URL = (
    "https://github.com/pg-advisory-exporter/pg-advisory-exporter/blob/main/docs/runbook.md"
)
GROUP_NAME = "pg-advisory-exporter"
# Alertmanager inhibits every other alert of the exporter while this one fires.
EXPORTER_DOWN = "PgAdvisoryExporterDown"


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
    target_down_for: Duration = Field(300, description="a server unreadable this long pages")
    exporter_down_for: Duration = Field(300, description="the exporter unscrapable this long")
    web_config_refused_for: Duration = Field(
        600, description="a changed web configuration file refused this long warns"
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


class RuleValues(Protocol):
    """How the rules spell each threshold: its value (the rules the exporter prints), or a
    template that computes it (the Helm chart's)."""

    def seconds(self, name: str) -> str:
        """A duration as a number of seconds, for PromQL: 900."""
        ...

    def duration(self, name: str) -> str:
        """A duration as Prometheus writes it, for `for` and for people: 15m."""
        ...

    def number(self, name: str) -> str: ...

    def percent(self, name: str) -> str:
        """A share as a percentage: 60%."""
        ...

    def text(self, name: str) -> str: ...

    def quoted(self, name: str) -> str:
        """A string as a PromQL string literal."""
        ...

    def group_labels(self) -> str:
        """The group labels, each after a comma: ", namespace, pod, cluster"."""
        ...

    def selector(self, metric: str, matchers: str) -> str:
        """The metric with these matchers and the threshold `selector`'s."""
        ...


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


# The labels that name a server (the exporter's target), and an application in one of its
# databases.
_SERVER = ("job", "instance", "target")
_HOLDER = (*_SERVER, "datname", "application_name")
# A series that a server's target carries and no other target of that server does (of the
# targets that read one server, one answers for it: its whole-server probe, or else the
# first of its databases' probes): joined with it, an alert about the server fires once
# however many of its databases are probed.
ANSWERS_FOR_SERVER = "pg_advisory_exporter_collect_duration_seconds"
# What tells the replicas of a sharded exporter apart; their shard series are aggregated
# over everything else (the job and the group labels but pod), as kube-state-metrics' are.
_REPLICA = "without (instance, pod)"
# The link to the target's /locks page, where the exporter knows its external URL: the
# exporter's own series says where that page is (--web.external-url), found by a query
# when the alert fires; without that series the description ends before it.
_LOCKS_PAGE_LINK = (
    '{{ with printf "pg_advisory_exporter_locks_page_info{job=%q, instance=%q, target=%q}" '
    "$labels.job $labels.instance $labels.target | query }}"
    ' Holders and waiters: {{ . | first | label "url" }}{{ end }}'
)


@dataclass(frozen=True)
class _Rules:
    v: RuleValues

    def sel(self, metric: str, matchers: str = "") -> str:
        return self.v.selector(metric, matchers)

    def by(self, *labels: str) -> str:
        """An aggregation's or a join's labels, the group labels after them."""
        return f"({', '.join(labels)}{self.v.group_labels()})"

    def alert(
        self,
        name: str,
        expr: str,
        *,
        for_: str,
        severity: str,
        summary: str,
        description: str,
        locks_page: bool = True,
    ) -> dict[str, Any]:
        return {
            "alert": name,
            "expr": expr,
            "for": self.v.duration(for_) if for_ else "0s",
            "labels": {"severity": severity},
            "annotations": {
                "summary": summary,
                "description": description + (_LOCKS_PAGE_LINK if locks_page else ""),
                "runbook_url": f"{self.v.text('runbook_url')}#{name.lower()}",
            },
        }

    def all(self) -> list[dict[str, Any]]:
        t, v = self, self.v
        # Prometheus labels every alert with the series' own labels; `where` names them.
        where = "in database {{ $labels.datname }} on {{ $labels.target }}"
        app = "{{ $labels.application_name }}"
        value, age = "{{ $value }}", "{{ $value | humanizeDuration }}"
        migration_keys = f'key=~"{"|".join(MIGRATION_KEYS)}"'
        migration_held = (
            f"max by {t.by(*_SERVER, 'datname', 'key')} "
            f"({t.sel('pg_advisory_key_hold_seconds', migration_keys)})"
        )
        lock_table = [
            t.alert(
                "PgLockTableNearlyFull",
                f"{t.sel('pg_advisory_lock_table_entries')} "
                f"/ {t.sel('pg_advisory_lock_table_capacity')} > {v.number(share)}",
                for_="lock_table_for",
                severity=severity,
                summary="The lock table of {{ $labels.target }} is "
                "{{ $value | humanizePercentage }} full",
                description="The shared lock table of {{ $labels.target }} holds "
                "{{ $value | humanizePercentage }} of its nominal capacity. When it is full, "
                "no session can take any lock (ERROR: out of shared memory). "
                f"Threshold {v.percent(share)}.",
            )
            for severity, share in (
                ("warning", "lock_table_warning"),
                ("critical", "lock_table_critical"),
            )
        ]
        # The forecast: the time until the table's peak of the last `smoothing` reaches its
        # capacity, at the growth rate over the `window` of its lowest fill over `smoothing`
        # (entries that stay); a sawtooth of locks taken and released within one transaction
        # has a flat lowest fill, and grows nothing. It must still be growing (its lowest
        # fill above the one `smoothing` earlier), and fuller than `min_fill`.
        smoothing = v.duration("lock_table_forecast_smoothing")
        fill = (
            f"({t.sel('pg_advisory_lock_table_entries')} "
            f"/ {t.sel('pg_advisory_lock_table_capacity')})"
        )
        lowest = f"min_over_time({fill}[{smoothing}:1m])"
        lock_table.append(
            t.alert(
                "PgLockTableExhaustionForecast",
                f"clamp_min(1 - max_over_time({fill}[{smoothing}:1m]), 0) "
                f"/ (deriv({lowest}[{v.duration('lock_table_forecast_window')}:5m]) > 0) "
                f"< {v.seconds('lock_table_forecast_horizon')} "
                f"and {lowest} > {v.number('lock_table_forecast_min_fill')} "
                f"and {lowest} > min_over_time({fill}[{smoothing}:1m] offset {smoothing})",
                for_="lock_table_forecast_for",
                severity="critical",
                summary="The lock table of {{ $labels.target }} will be full in about "
                "{{ $value | humanizeDuration }}",
                description="The entries that stay in the shared lock table of "
                "{{ $labels.target }} (its lowest fill over "
                f"{smoothing}) have grown over the last "
                f"{v.duration('lock_table_forecast_window')}: at that rate its peaks reach "
                "the nominal capacity in about {{ $value | humanizeDuration }}, and then no "
                "session can take any lock (ERROR: out of shared memory). Most likely locks "
                "that are never released (session locks left on pooled connections, a "
                "registry of keys that only grows). Threshold "
                f"{v.duration('lock_table_forecast_horizon')}.",
            )
        )
        return [
            t.alert(
                "PgAdvisoryLockLeaked",
                f"max by {t.by(*_HOLDER, 'state')} "
                f"({t.sel('pg_advisory_idle_holder_max_seconds')}) "
                f"> {v.seconds('leaked_lock_after')}",
                for_="leaked_lock_for",
                severity="critical",
                summary=f"A session of {app} holds an advisory lock while {{{{ $labels.state }}}}",
                description=f"A backend of {app} {where} has held an advisory lock while "
                f"{{{{ $labels.state }}}} for {age}: most likely a leaked lock, which "
                "stops every later run that needs it. Threshold "
                f"{v.duration('leaked_lock_after')}.",
            ),
            t.alert(
                "PgAdvisoryLockWaitTooLong",
                f"{t.sel('pg_advisory_wait_max_seconds')} > {v.seconds('wait_after')}",
                for_="wait_for",
                severity="warning",
                summary=f"{app} has waited {age} for an advisory lock",
                description=f"A backend of {app} {where} has been waiting for an advisory "
                f"lock for {age}; its holder may be stuck. Threshold {v.duration('wait_after')}.",
            ),
            t.alert(
                "PgAdvisoryLockWaitersPiling",
                f"sum by {t.by(*_HOLDER)} ({t.sel('pg_advisory_waiters')}) > {v.number('waiters')}",
                for_="waiters_for",
                severity="warning",
                summary=f"{value} backends of {app} wait for advisory locks",
                description=f"{value} backends of {app} {where} are waiting for advisory "
                f"locks, more than {v.number('waiters')} for {v.duration('waiters_for')}: work "
                "queues up "
                "behind one holder.",
            ),
            *lock_table,
            t.alert(
                "PgAdvisoryBackendOverLockBudget",
                f"{t.sel('pg_advisory_backend_locks_max')} > on {t.by(*_SERVER)} "
                f"group_left () ({v.number('backend_lock_budget')} * "
                f"{t.sel('pg_advisory_max_locks_per_transaction')})",
                for_="backend_lock_budget_for",
                severity="warning",
                summary=f"A backend of {app} holds {value} advisory locks",
                description=f"A backend of {app} {where} holds {value} advisory locks, "
                f"more than {v.number('backend_lock_budget')} x max_locks_per_transaction, "
                "the average lock budget of a backend: a lock per row instead of per batch "
                "fills the lock table.",
            ),
            t.alert(
                "PgAdvisoryDeadlocks",
                f"increase({t.sel('pg_advisory_deadlocks_total')}"
                f"[{v.duration('deadlocks_window')}]) > {v.number('deadlocks')}",
                for_="",
                severity="warning",
                summary="Deadlocks in database {{ $labels.datname }} on {{ $labels.target }}",
                description="{{ $value | humanize }} deadlocks in database "
                "{{ $labels.datname }} on {{ $labels.target }} in the last "
                f"{v.duration('deadlocks_window')}: sessions take the same locks in different "
                "orders.",
                locks_page=False,
            ),
            t.alert(
                "PgAdvisoryTargetDown",
                f"{t.sel('pg_advisory_up')} == 0 and on {t.by(*_SERVER)} "
                f"{t.sel(ANSWERS_FOR_SERVER)}",
                for_="target_down_for",
                severity="critical",
                summary="The exporter cannot read {{ $labels.target }}",
                description="pg-advisory-exporter has failed to collect from "
                f"{{{{ $labels.target }}}} for {v.duration('target_down_for')}: leaked locks and a "
                "full lock table there go unseen. Its log says why.",
                locks_page=False,
            ),
            t.alert(
                EXPORTER_DOWN,
                f"{t.sel('up', 'job=' + v.quoted('exporter_job'))} == 0",
                for_="exporter_down_for",
                severity="critical",
                summary="pg-advisory-exporter {{ $labels.instance }} cannot be scraped",
                description="Prometheus has failed to scrape pg-advisory-exporter at "
                f"{{{{ $labels.instance }}}} for {v.duration('exporter_down_for')}: no advisory "
                "lock alert can fire for its targets until it is back.",
                locks_page=False,
            ),
            t.alert(
                "PgAdvisoryExporterWebConfigRefused",
                f"{t.sel('pg_advisory_exporter_web_config_last_reload_successful')} == 0",
                for_="web_config_refused_for",
                severity="warning",
                summary="pg-advisory-exporter {{ $labels.instance }} refused its changed web "
                "configuration",
                description="pg-advisory-exporter at {{ $labels.instance }} has refused a "
                f"change to its --web.config.file for {v.duration('web_config_refused_for')} "
                "and still serves with its previous web configuration (users and TLS as "
                "before): the file on disk is not in effect. Its log says why.",
                locks_page=False,
            ),
            t.alert(
                "PgAdvisoryExporterShardsMissing",
                f"max {_REPLICA} ({t.sel('pg_advisory_exporter_shards')}) "
                f"- count without (shard_index) (count_values {_REPLICA} "
                f'("shard_index", {t.sel("pg_advisory_exporter_shard_index")})) > 0',
                for_="shards_missing_for",
                severity="critical",
                summary=f"Shards of {{{{ $labels.job }}}} without a replica: {value}",
                description=f"{value} of the shards that the replicas of job "
                "{{ $labels.job }} split their configured targets into (--shard.total) have "
                f"had no replica serving for {v.duration('shards_missing_for')}: their targets "
                "are not collected and none of their alerts can fire.",
                locks_page=False,
            ),
            t.alert(
                "PgAdvisoryExporterShardingMismatch",
                f"stdvar {_REPLICA} ({t.sel('pg_advisory_exporter_shards')}) != 0",
                for_="sharding_mismatch_for",
                severity="warning",
                summary="The replicas of {{ $labels.job }} disagree on the number of shards",
                description="The replicas of job {{ $labels.job }} have been run with "
                f"different --shard.total for {v.duration('sharding_mismatch_for')}: some "
                "targets are collected by two replicas (two connections to their servers) and "
                "others by none.",
                locks_page=False,
            ),
            t.alert(
                "PgAdvisoryMigrationLockStuck",
                f"{migration_held} > {v.seconds('migration_lock_held_after')}"
                f" or ({migration_held} > {v.seconds('migration_lock_waited_after')}"
                f" and on {t.by(*_SERVER, 'datname', 'key')} "
                f"max by {t.by(*_SERVER, 'datname', 'key')} "
                f"({t.sel('pg_advisory_key_waiters', migration_keys)}) > 0)",
                for_="migration_lock_for",
                severity="critical",
                summary="The {{ $labels.key }} migration lock is stuck in "
                "{{ $labels.datname }} on {{ $labels.target }}",
                description="The well-known lock {{ $labels.key }} (a migration tool's, see "
                "Well-known keys in docs/configuration.md) "
                f"{where} has been held in one state for {age}, "
                f"past {v.duration('migration_lock_held_after')}, or past "
                f"{v.duration('migration_lock_waited_after')} with a session waiting for it: "
                "a migration that hangs, or that crashed with its session still open, blocks "
                "every deploy after it.",
            ),
            t.alert(
                "PgAdvisorySessionLockInTransactionPool",
                f"max by {t.by(*_HOLDER, 'pooler', 'pool')} (max_over_time("
                f"{t.sel('pg_advisory_pooled_session_locks')}"
                f"[{v.duration('pooled_session_lock_gap')}])) > 0",
                for_="pooled_session_lock_for",
                severity="critical",
                summary=f"A session lock of {app} is stranded in pool {{{{ $labels.pool }}}} "
                "of {{ $labels.pooler }}",
                description=f"{value} session-level advisory lock entries of {app} {where} "
                "are held on a server connection of {{ $labels.pooler }} (pool "
                "{{ $labels.pool }}) that is pooled per transaction or statement: the client "
                "that took them is gone or no longer owns the connection, the next client "
                "handed it holds them too, and every other session fails to get them until "
                "the pooler closes that connection. Always a bug: use transaction-level locks, "
                "a session-mode pool, or a direct connection for that job.",
            ),
            t.alert(
                "PgAdvisoryKeyNotHeld",
                f"{t.sel('pg_advisory_key_holders')} == 0",
                for_="key_not_held_for",
                severity="critical",
                summary="Nobody holds {{ $labels.key }} in {{ $labels.datname }} on "
                "{{ $labels.target }}",
                description="The registered key {{ $labels.key }} is expected to be held "
                f"at all times (a leader or singleton lock), but no backend {where} has "
                f"held it for {v.duration('key_not_held_for')}.",
            ),
            t.alert(
                "PgAdvisoryKeyHeldTooLong",
                f"{t.sel('pg_advisory_key_hold_seconds')} "
                f"> on {t.by(*_SERVER, 'key')} "
                f"group_left () {t.sel('pg_advisory_key_max_hold_seconds')}",
                for_="key_held_too_long_for",
                severity="warning",
                summary=f"{{{{ $labels.key }}}} has been held for {age}",
                description="A holder of the registered key {{ $labels.key }} "
                f"{where} has been in its current state for {age}, longer than the "
                "key's max_hold.",
            ),
        ]


def groups_of(values: RuleValues) -> list[dict[str, Any]]:
    """The rule groups, their thresholds spelled by `values`."""
    return [{"name": GROUP_NAME, "rules": _Rules(values).all()}]


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
