"""Each alert rule, its thresholds spelled by a `RuleValues`: the values themselves (the
rules the exporter prints, rules.py) or templates that compute them (the Helm chart's)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from pg_advisory_exporter.keys.catalog import MIGRATION_KEYS

# Alertmanager inhibits every other alert of the exporter while this one fires.
EXPORTER_DOWN = "PgAdvisoryExporterDown"


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


# What an alert's text says of its series, from the labels Prometheus gives every alert.
_WHERE = "in database {{ $labels.datname }} on {{ $labels.target }}"
_APP = "{{ $labels.application_name }}"
_VALUE = "{{ $value }}"
# A count of events from increase(), which extrapolates to the ends of its window: on
# Prometheus 3, whose ranges leave out the sample at their start, 2 deadlocks scraped every
# minute over 10m come out as 2.222. Events are whole: shown rounded.
_COUNT = '{{ $value | printf "%.0f" }}'
_AGE = "{{ $value | humanizeDuration }}"


@dataclass(frozen=True)
class Alerts:
    """The rules, a method per group of alerts, with the thresholds spelled by `v`."""

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
        # In this order in the shipped files (regenerated, they must not change).
        return [
            *self.leaks_and_waits(),
            *self.lock_table(),
            self.deadlocks(),
            *self.exporter(),
            *self.shards(),
            self.migration_lock(),
            self.session_lock_in_transaction_pool(),
            *self.registered_keys(),
            *self.server_log(),
            self.dead_client_keeps_locks(),
        ]

    def leaks_and_waits(self) -> list[dict[str, Any]]:
        v = self.v
        return [
            self.alert(
                "PgAdvisoryLockLeaked",
                f"max by {self.by(*_HOLDER, 'state')} "
                f"({self.sel('pg_advisory_idle_holder_max_seconds')}) "
                f"> {v.seconds('leaked_lock_after')}",
                for_="leaked_lock_for",
                severity="critical",
                summary=f"A session of {_APP} holds an advisory lock while {{{{ $labels.state }}}}",
                description=f"A backend of {_APP} {_WHERE} has held an advisory lock while "
                f"{{{{ $labels.state }}}} for {_AGE}: most likely a leaked lock, which "
                "stops every later run that needs it. Threshold "
                f"{v.duration('leaked_lock_after')}.",
            ),
            self.alert(
                "PgAdvisoryLockWaitTooLong",
                f"{self.sel('pg_advisory_wait_max_seconds')} > {v.seconds('wait_after')}",
                for_="wait_for",
                severity="warning",
                summary=f"{_APP} has waited {_AGE} for an advisory lock",
                description=f"A backend of {_APP} {_WHERE} has been waiting for an advisory "
                f"lock for {_AGE}; its holder may be stuck. Threshold {v.duration('wait_after')}.",
            ),
            self.alert(
                "PgAdvisoryLockWaitersPiling",
                f"sum by {self.by(*_HOLDER)} ({self.sel('pg_advisory_waiters')}) "
                f"> {v.number('waiters')}",
                for_="waiters_for",
                severity="warning",
                summary=f"{_VALUE} backends of {_APP} wait for advisory locks",
                description=f"{_VALUE} backends of {_APP} {_WHERE} are waiting for advisory "
                f"locks, more than {v.number('waiters')} for {v.duration('waiters_for')}: work "
                "queues up "
                "behind one holder.",
            ),
        ]

    def lock_table(self) -> list[dict[str, Any]]:
        return [
            self.lock_table_nearly_full("warning", "lock_table_warning"),
            self.lock_table_nearly_full("critical", "lock_table_critical"),
            self.lock_table_exhaustion_forecast(),
            self.backend_over_lock_budget(),
        ]

    def lock_table_fill(self) -> str:
        """The share of the lock table's capacity in use."""
        return (
            f"{self.sel('pg_advisory_lock_table_entries')} "
            f"/ {self.sel('pg_advisory_lock_table_capacity')}"
        )

    def lock_table_nearly_full(self, severity: str, share: str) -> dict[str, Any]:
        v = self.v
        return self.alert(
            "PgLockTableNearlyFull",
            f"{self.lock_table_fill()} > {v.number(share)}",
            for_="lock_table_for",
            severity=severity,
            summary="The lock table of {{ $labels.target }} is "
            "{{ $value | humanizePercentage }} full",
            description="The shared lock table of {{ $labels.target }} holds "
            "{{ $value | humanizePercentage }} of its nominal capacity. When it is full, "
            "no session can take any lock (ERROR: out of shared memory). "
            f"Threshold {v.percent(share)}.",
        )

    def lock_table_exhaustion_forecast(self) -> dict[str, Any]:
        # The time until the table's peak of the last `smoothing` reaches its capacity, at
        # the growth rate over the `window` of its lowest fill over `smoothing` (entries that
        # stay); a sawtooth of locks taken and released within one transaction has a flat
        # lowest fill, and grows nothing. It must still be growing (its lowest fill above the
        # one `smoothing` earlier), and fuller than `min_fill`.
        v = self.v
        smoothing = v.duration("lock_table_forecast_smoothing")
        window = v.duration("lock_table_forecast_window")
        fill = f"({self.lock_table_fill()})"
        lowest = f"min_over_time({fill}[{smoothing}:1m])"
        return self.alert(
            "PgLockTableExhaustionForecast",
            f"clamp_min(1 - max_over_time({fill}[{smoothing}:1m]), 0) "
            f"/ (deriv({lowest}[{window}:5m]) > 0) "
            f"< {v.seconds('lock_table_forecast_horizon')} "
            f"and {lowest} > {v.number('lock_table_forecast_min_fill')} "
            f"and {lowest} > min_over_time({fill}[{smoothing}:1m] offset {smoothing})",
            for_="lock_table_forecast_for",
            severity="critical",
            summary="The lock table of {{ $labels.target }} will be full in about "
            "{{ $value | humanizeDuration }}",
            description="The entries that stay in the shared lock table of "
            "{{ $labels.target }} (its lowest fill over "
            f"{smoothing}) have grown over the last {window}: at that rate its peaks reach "
            "the nominal capacity in about {{ $value | humanizeDuration }}, and then no "
            "session can take any lock (ERROR: out of shared memory). Most likely locks "
            "that are never released (session locks left on pooled connections, a "
            "registry of keys that only grows). Threshold "
            f"{v.duration('lock_table_forecast_horizon')}.",
        )

    def backend_over_lock_budget(self) -> dict[str, Any]:
        v = self.v
        return self.alert(
            "PgAdvisoryBackendOverLockBudget",
            f"{self.sel('pg_advisory_backend_locks_max')} > on {self.by(*_SERVER)} "
            f"group_left () ({v.number('backend_lock_budget')} * "
            f"{self.sel('pg_advisory_max_locks_per_transaction')})",
            for_="backend_lock_budget_for",
            severity="warning",
            summary=f"A backend of {_APP} holds {_VALUE} advisory locks",
            description=f"A backend of {_APP} {_WHERE} holds {_VALUE} advisory locks, "
            f"more than {v.number('backend_lock_budget')} x max_locks_per_transaction, "
            "the average lock budget of a backend: a lock per row instead of per batch "
            "fills the lock table.",
        )

    def deadlocks(self) -> dict[str, Any]:
        v = self.v
        return self.alert(
            "PgAdvisoryDeadlocks",
            f"increase({self.sel('pg_advisory_deadlocks_total')}"
            f"[{v.duration('deadlocks_window')}]) > {v.number('deadlocks')}",
            for_="",
            severity="warning",
            summary="Deadlocks in database {{ $labels.datname }} on {{ $labels.target }}",
            description=f"{_COUNT} deadlocks in database "
            "{{ $labels.datname }} on {{ $labels.target }} in the last "
            f"{v.duration('deadlocks_window')}: sessions take the same locks in different "
            "orders.",
            locks_page=False,
        )

    def exporter(self) -> list[dict[str, Any]]:
        """The exporter's own health: a server it cannot read, itself unscrapable, its web
        configuration or its configuration file refused."""
        v = self.v
        return [
            self.alert(
                "PgAdvisoryTargetDown",
                f"{self.sel('pg_advisory_up')} == 0 and on {self.by(*_SERVER)} "
                f"{self.sel(ANSWERS_FOR_SERVER)}",
                for_="target_down_for",
                severity="critical",
                summary="The exporter cannot read {{ $labels.target }}",
                description="pg-advisory-exporter has failed to collect from "
                f"{{{{ $labels.target }}}} for {v.duration('target_down_for')}: leaked locks and a "
                "full lock table there go unseen. Its log says why.",
                locks_page=False,
            ),
            self.alert(
                EXPORTER_DOWN,
                f"{self.sel('up', 'job=' + v.quoted('exporter_job'))} == 0",
                for_="exporter_down_for",
                severity="critical",
                summary="pg-advisory-exporter {{ $labels.instance }} cannot be scraped",
                description="Prometheus has failed to scrape pg-advisory-exporter at "
                f"{{{{ $labels.instance }}}} for {v.duration('exporter_down_for')}: no advisory "
                "lock alert can fire for its targets until it is back.",
                locks_page=False,
            ),
            self.alert(
                "PgAdvisoryExporterWebConfigRefused",
                f"{self.sel('pg_advisory_exporter_web_config_last_reload_successful')} == 0",
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
            self.alert(
                "PgAdvisoryExporterConfigRefused",
                f"{self.sel('pg_advisory_exporter_config_last_reload_successful')} == 0",
                for_="config_refused_for",
                severity="warning",
                summary="pg-advisory-exporter {{ $labels.instance }} refused its changed "
                "configuration file",
                description="pg-advisory-exporter at {{ $labels.instance }} has refused a "
                f"reload of its --config.file for {v.duration('config_refused_for')} and still "
                "runs its previous configuration (targets, keys and settings as before): the "
                "file on disk is not in effect, and a restart would stop on it. Its log says "
                "why.",
                locks_page=False,
            ),
        ]

    def shards(self) -> list[dict[str, Any]]:
        """The replicas of a sharded exporter, which together must serve every shard."""
        v = self.v
        return [
            self.alert(
                "PgAdvisoryExporterShardsMissing",
                f"max {_REPLICA} ({self.sel('pg_advisory_exporter_shards')}) "
                f"- count without (shard_index) (count_values {_REPLICA} "
                f'("shard_index", {self.sel("pg_advisory_exporter_shard_index")})) > 0',
                for_="shards_missing_for",
                severity="critical",
                summary=f"Shards of {{{{ $labels.job }}}} without a replica: {_VALUE}",
                description=f"{_VALUE} of the shards that the replicas of job "
                "{{ $labels.job }} split their configured targets into (--shard.total) have "
                f"had no replica serving for {v.duration('shards_missing_for')}: their targets "
                "are not collected and none of their alerts can fire.",
                locks_page=False,
            ),
            self.alert(
                "PgAdvisoryExporterShardingMismatch",
                f"stdvar {_REPLICA} ({self.sel('pg_advisory_exporter_shards')}) != 0",
                for_="sharding_mismatch_for",
                severity="warning",
                summary="The replicas of {{ $labels.job }} disagree on the number of shards",
                description="The replicas of job {{ $labels.job }} have been run with "
                f"different --shard.total for {v.duration('sharding_mismatch_for')}: some "
                "targets are collected by two replicas (two connections to their servers) and "
                "others by none.",
                locks_page=False,
            ),
        ]

    def migration_lock(self) -> dict[str, Any]:
        v = self.v
        migration_keys = f'key=~"{"|".join(MIGRATION_KEYS)}"'
        per_key = self.by(*_SERVER, "datname", "key")
        held = f"max by {per_key} ({self.sel('pg_advisory_key_hold_seconds', migration_keys)})"
        waited_for = f"max by {per_key} ({self.sel('pg_advisory_key_waiters', migration_keys)})"
        return self.alert(
            "PgAdvisoryMigrationLockStuck",
            f"{held} > {v.seconds('migration_lock_held_after')}"
            f" or ({held} > {v.seconds('migration_lock_waited_after')}"
            f" and on {per_key} {waited_for} > 0)",
            for_="migration_lock_for",
            severity="critical",
            summary="The {{ $labels.key }} migration lock is stuck in "
            "{{ $labels.datname }} on {{ $labels.target }}",
            description="The well-known lock {{ $labels.key }} (a migration tool's, see "
            "Well-known keys in docs/configuration.md) "
            f"{_WHERE} has been held for {_AGE}, "
            f"past {v.duration('migration_lock_held_after')}, or past "
            f"{v.duration('migration_lock_waited_after')} with a session waiting for it: "
            "a migration that hangs, or that crashed with its session still open, blocks "
            "every deploy after it. A migration's holder is never paged as a leaked lock: "
            "this is its alert.",
        )

    def session_lock_in_transaction_pool(self) -> dict[str, Any]:
        return self.alert(
            "PgAdvisorySessionLockInTransactionPool",
            f"max by {self.by(*_HOLDER, 'pooler', 'pool')} (max_over_time("
            f"{self.sel('pg_advisory_pooled_session_locks')}"
            f"[{self.v.duration('pooled_session_lock_gap')}])) > 0",
            for_="pooled_session_lock_for",
            severity="critical",
            summary=f"A session lock of {_APP} is stranded in pool {{{{ $labels.pool }}}} "
            "of {{ $labels.pooler }}",
            description=f"{_VALUE} session-level advisory lock entries of {_APP} {_WHERE} "
            "are held on a server connection of {{ $labels.pooler }} (pool "
            "{{ $labels.pool }}) that is pooled per transaction or statement: the client "
            "that took them is gone or no longer owns the connection, the next client "
            "handed it holds them too, and every other session fails to get them until "
            "the pooler closes that connection. Always a bug: use transaction-level locks, "
            "a session-mode pool, or a direct connection for that job.",
        )

    def registered_keys(self) -> list[dict[str, Any]]:
        """The keys of the registry that say how they must be held."""
        return [
            self.alert(
                "PgAdvisoryKeyNotHeld",
                f"{self.sel('pg_advisory_key_holders')} == 0",
                for_="key_not_held_for",
                severity="critical",
                summary="Nobody holds {{ $labels.key }} in {{ $labels.datname }} on "
                "{{ $labels.target }}",
                description="The registered key {{ $labels.key }} is expected to be held "
                f"at all times (a leader or singleton lock), but no backend {_WHERE} has "
                f"held it for {self.v.duration('key_not_held_for')}.",
            ),
            self.alert(
                "PgAdvisoryKeyHeldTooLong",
                f"{self.sel('pg_advisory_key_hold_seconds')} "
                f"> on {self.by(*_SERVER, 'key')} "
                f"group_left () {self.sel('pg_advisory_key_max_hold_seconds')}",
                for_="key_held_too_long_for",
                severity="warning",
                summary=f"{{{{ $labels.key }}}} has been held for {_AGE}",
                description=f"A backend {_WHERE} has held the registered key "
                f"{{{{ $labels.key }}}} for {_AGE}, longer than the key's max_hold.",
            ),
        ]

    def counted(
        self, metric: str, window: str, threshold: str, by: tuple[str, ...] = _HOLDER
    ) -> str:
        """More than `threshold` events of a logged counter within `window`, by holder (or
        `by`): those of a series that appeared within it too (a counter's series starts with
        its first event, and increase() needs a sample before it), where the log was read
        `window` ago already, so that a Prometheus without that history does not take every
        series for new. By job and target only: a replaced pod has another instance and pod.
        Each series counts once, its increase where it has one, else its value where it is
        new (`- 0` drops the name, so that the two are the same series to `or`)."""
        counter, grouping = self.sel(metric), self.by(*by)
        read_before = f"{self.sel('pg_advisory_log_up')} offset {window}"
        new = f"({counter} unless {counter} offset {window}) and on (job, target) {read_before}"
        each = f"(increase({counter}[{window}]) > 0) or ({new}) - 0"
        return f"sum by {grouping} ({each}) > {threshold}"

    def server_log(self) -> list[dict[str, Any]]:
        """What the server's log told between scrapes: an unlock of a lock not held, a lock
        table that was full."""
        v = self.v
        unlocks, oom = (
            v.duration("unlocks_not_held_window"),
            v.duration("out_of_shared_memory_window"),
        )
        return [
            self.alert(
                "PgAdvisoryUnlockNotHeld",
                self.counted(
                    "pg_advisory_log_unlocks_not_held_total", unlocks, v.number("unlocks_not_held")
                ),
                for_="",
                severity="warning",
                summary=f"{_APP} unlocked advisory locks it did not hold",
                description=f"Sessions of {_APP} {_WHERE} unlocked advisory locks they did "
                f"not hold: {_COUNT} in the last {unlocks} (threshold "
                f"{v.number('unlocks_not_held')}), as the server logged (you don't own a lock "
                "of type ...). The lock each meant to release is still held somewhere, most "
                "likely by another connection of a transaction pool; see "
                "pg_advisory_pooled_session_locks and the holders.",
            ),
            # The lock table is the server's: one page for it, whichever applications failed.
            self.alert(
                "PgLockTableOutOfSharedMemory",
                self.counted("pg_advisory_log_out_of_shared_memory_total", oom, "0", _SERVER),
                for_="",
                severity="critical",
                summary="The lock table of {{ $labels.target }} was full: statements could "
                "not take a lock",
                description="Statements on {{ $labels.target }} failed because the shared lock "
                f"table was full: {_COUNT} in the last {oom}, as the server logged (ERROR: out "
                "of shared memory, a hint to raise max_locks_per_transaction). Queries have "
                "failed, whatever the table holds now; every lock type shares it. "
                "pg_advisory_log_out_of_shared_memory_total says which applications failed.",
            ),
        ]

    def dead_client_keeps_locks(self) -> dict[str, Any]:
        """Session locks held on a server that would keep them long after their client died:
        both series are the server's (its settings, its idle holders), so it fires once per
        server however many of its databases are probed."""
        v = self.v
        return self.alert(
            "PgAdvisoryDeadClientKeepsLocks",
            f"max by {self.by(*_SERVER)} ({self.sel('pg_advisory_dead_client_release_seconds')}) "
            f"> {v.seconds('dead_client_release_after')} "
            f"and on {self.by(*_SERVER)} "
            f"max by {self.by(*_SERVER)} ({self.sel('pg_advisory_idle_session_holders')}) > 0",
            for_="dead_client_release_for",
            severity="warning",
            summary="A dead client would keep its session locks on {{ $labels.target }} for "
            f"{_AGE}",
            description="Sessions on {{ $labels.target }} hold advisory locks outside any "
            "transaction (session locks: a leader's, a job's), and the server would notice "
            f"their client's death only after {_AGE} (its TCP keepalives, tcp_user_timeout, "
            "idle_session_timeout): for that long nobody else could take those locks. "
            f"Threshold {v.duration('dead_client_release_after')}.",
            locks_page=False,
        )
