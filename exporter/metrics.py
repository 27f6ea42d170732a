"""The metric contract: every series' name, type, labels and help (`SPECS`), and the families
built from samples that must keep to it."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric


@dataclass(frozen=True)
class MetricSpec:
    name: str  # as exposed; counters end in _total
    kind: Literal["gauge", "counter"]
    labels: tuple[str, ...]
    help: str


def _gauge(name: str, labels: tuple[str, ...], help: str) -> MetricSpec:
    return MetricSpec(name, "gauge", labels, help)


def _counter(name: str, labels: tuple[str, ...], help: str) -> MetricSpec:
    return MetricSpec(name, "counter", labels, help)


_GROUP = ("target", "datname", "application_name")

SPECS = {
    spec.name: spec
    for spec in (
        _gauge(
            "pg_advisory_up",
            ("target",),
            "1 if the last collection from this server succeeded, else 0.",
        ),
        _gauge(
            "pg_advisory_locks",
            (*_GROUP, "mode", "granted"),
            "Advisory lock entries in pg_locks (one per key, backend and mode; "
            "a re-entrant lock is one entry).",
        ),
        _gauge(
            "pg_advisory_extension_locks",
            ("target", "datname", "extension", "granted"),
            "Advisory-tag lock entries that an extension takes for itself (pg_locks.objsubid "
            "neither 1 nor 2: citus, timescaledb, or unknown), never counted as the "
            "application's advisory locks.",
        ),
        _gauge(
            "pg_advisory_holders",
            (*_GROUP, "state"),
            "Backends that hold at least one granted advisory lock.",
        ),
        _gauge("pg_advisory_waiters", _GROUP, "Backends waiting for an advisory lock."),
        _gauge(
            "pg_advisory_wait_max_seconds",
            _GROUP,
            "The longest current wait for an advisory lock.",
        ),
        _gauge(
            "pg_advisory_idle_holder_max_seconds",
            (*_GROUP, "state"),
            "Longest time a backend holding advisory locks has been idle or idle in "
            "transaction (now - state_change): the leaked-lock signal.",
        ),
        _gauge(
            "pg_advisory_idle_by_design_seconds",
            (*_GROUP, "idle_by_design"),
            "Longest time a backend of an application that holds advisory locks on idle "
            "connections by design (the idle_by_design entry that names it) has been idle "
            "with them: judged against its max_hold, never as a leak.",
        ),
        _gauge(
            "pg_advisory_idle_by_design_max_hold_seconds",
            ("target", "idle_by_design"),
            "The idle_by_design entry's max_hold: compare pg_advisory_idle_by_design_seconds "
            "with it.",
        ),
        _gauge(
            "pg_advisory_backend_locks_max",
            _GROUP,
            "The most granted advisory lock entries held by one backend of the group.",
        ),
        _gauge(
            "pg_advisory_lock_table_entries",
            ("target",),
            "Entries in the shared lock table now: pg_locks rows that are not "
            "fast-path, all lock types.",
        ),
        _gauge(
            "pg_advisory_lock_table_capacity",
            ("target",),
            "Nominal size of the shared lock table: max_locks_per_transaction x "
            "(MaxBackends + max_prepared_transactions).",
        ),
        _gauge(
            "pg_advisory_lock_table_backend_entries_max",
            ("target",),
            "The most lock table entries (all lock types) held by one backend.",
        ),
        _gauge(
            "pg_advisory_lock_table_full",
            ("target",),
            "1 when the shared lock table is full: less room than max_locks_per_transaction, "
            "as many entries as when the server last refused the exporter one, or the server "
            "refusing the exporter's read or connection for it; else 0 (absent on other errors).",
        ),
        _gauge(
            "pg_advisory_lock_table_top_application_entries",
            _GROUP,
            "The lock table entries (all lock types) held by the application whose backends "
            "hold the most, in one database: who fills the table, whatever it locks.",
        ),
        _gauge(
            "pg_advisory_max_locks_per_transaction",
            ("target",),
            "The max_locks_per_transaction setting.",
        ),
        _gauge(
            "pg_advisory_dead_client_release_seconds",
            ("target",),
            "The longest a session idle outside a transaction keeps its (session-level) locks "
            "once its client's host or network is gone: until the server's TCP keepalives "
            "give up (tcp_keepalives_*, tcp_user_timeout), or idle_session_timeout ends it.",
        ),
        _gauge(
            "pg_advisory_idle_in_transaction_release_seconds",
            ("target",),
            "The longest a session idle inside a transaction keeps its locks while its client "
            "sends nothing: idle_in_transaction_session_timeout, +Inf where it is 0.",
        ),
        _gauge(
            "pg_advisory_idle_session_holders",
            ("target",),
            "Backends of the whole server that hold advisory locks outside any transaction "
            "(session-level locks only): those whose locks a dead client would keep for "
            "pg_advisory_dead_client_release_seconds.",
        ),
        _gauge(
            "pg_advisory_risky_statements",
            ("target", "datname", "rule"),
            "Statements in pg_stat_statements that break the rule (lock_in_limited_scan, "
            "lock_in_where, hashtext_key), at its last read; 0 for a rule none breaks.",
        ),
        _gauge(
            "pg_advisory_statements_skipped",
            ("target", "reason"),
            "Statements naming an advisory function that the last read of pg_stat_statements "
            "did not judge: too_long, unparsable, over_budget (the parse time of a read), "
            "over_limit (past the statements or bytes a read takes).",
        ),
        _gauge(
            "pg_advisory_statements_up",
            ("target",),
            "1 if pg_stat_statements could be read at the last try, else 0 (not installed, "
            "not loaded, not granted: the exporter's log says which); absent until then.",
        ),
        _counter(
            "pg_advisory_deadlocks_total",
            ("target", "datname"),
            "Deadlocks detected in the database (pg_stat_database.deadlocks).",
        ),
        _counter(
            "pg_advisory_server_lock_waits_total",
            ("target",),
            "Advisory lock waits the server counted (pg_stat_lock, PostgreSQL 19 and later): "
            "those that outlived deadlock_timeout and then got the lock.",
        ),
        _counter(
            "pg_advisory_server_lock_wait_seconds_total",
            ("target",),
            "The time those counted waits took (pg_stat_lock.wait_time, PostgreSQL 19 and later).",
        ),
        _gauge(
            "pg_advisory_server_info",
            ("target", "server_version"),
            "Always 1 while the server answers.",
        ),
        _gauge(
            "pg_advisory_key_holders",
            ("target", "datname", "key"),
            "Backends holding the registered key (0 for an expect_held key nobody holds).",
        ),
        _gauge(
            "pg_advisory_key_waiters",
            ("target", "datname", "key"),
            "Backends waiting for the registered key.",
        ),
        _gauge(
            "pg_advisory_key_hold_seconds",
            ("target", "datname", "key"),
            "The longest a backend has held the registered key: since the exporter first saw it "
            "hold it, or since it went idle if longer ago; at most since its transaction began "
            "for a key taken at transaction level.",
        ),
        _gauge(
            "pg_advisory_key_max_hold_seconds",
            ("target", "key"),
            "The registry's max_hold for the key: compare pg_advisory_key_hold_seconds with it.",
        ),
        _gauge(
            "pg_advisory_pooled_session_locks",
            (*_GROUP, "pooler", "pool"),
            "Session-level advisory lock entries held on backends that a transaction- or "
            "statement-mode pool owns: stranded, handed to the next client. 0 per pooler "
            "read when there are none.",
        ),
        _gauge(
            "pg_advisory_pooler_up",
            ("target", "pooler"),
            "1 if the pooler could be read (or is known by address) in the last collection.",
        ),
        _counter(
            "pg_advisory_log_unlocks_not_held_total",
            _GROUP,
            "Unlocks of an advisory lock the session did not hold, logged by the server "
            "(WARNING: you don't own a lock of type ...): the lock it meant to release is still "
            "held, most likely on another pooled connection.",
        ),
        _counter(
            "pg_advisory_log_out_of_shared_memory_total",
            _GROUP,
            "Lock requests that failed because the shared lock table was full, logged by the "
            "server (ERROR: out of shared memory, SQLSTATE 53200, its hint naming "
            "max_locks_per_transaction).",
        ),
        _counter(
            "pg_advisory_log_deadlocks_total",
            _GROUP,
            "Deadlocks logged by the server that involved an advisory lock (the victim's "
            "database and application).",
        ),
        _counter(
            "pg_advisory_log_lock_waits_total",
            (*_GROUP, "key"),
            "Waits for an advisory lock that outlived deadlock_timeout, logged by the server "
            "(log_lock_waits): by the waiter and the registry's name of the key (empty where "
            "it has none).",
        ),
        _counter(
            "pg_advisory_log_extension_lock_waits_total",
            (*_GROUP, "extension"),
            "Waits for an extension's own advisory-tag lock (pg_advisory_extension_locks) "
            "that outlived deadlock_timeout, logged by the server: by the waiter and the "
            "extension.",
        ),
        _counter(
            "pg_advisory_log_lock_wait_seconds_total",
            (*_GROUP, "key"),
            "The logged duration of the waits for an advisory lock that ended (acquired, or "
            "given up), by the waiter and the key's registry name.",
        ),
        _gauge(
            "pg_advisory_log_up",
            ("target",),
            "1 if the server's log (server_log) could be read at the last look, else 0.",
        ),
        _counter(
            "pg_advisory_log_lines_total",
            ("target",),
            "Lines read from the server's log since the exporter started (from its end then).",
        ),
        _counter(
            "pg_advisory_log_unparsed_lines_total",
            ("target",),
            "Lines of the server's log that could not be read as records of its format "
            "(counted, and skipped).",
        ),
        _gauge("pg_advisory_exporter_build_info", ("version", "python_version"), "Always 1."),
        _gauge(
            "pg_advisory_exporter_config_last_reload_successful",
            (),
            "1 if the last reload of the configuration file (--config.file) took effect, 0 "
            "if it was refused and the previous configuration stays; absent without the file.",
        ),
        _gauge(
            "pg_advisory_exporter_config_last_reload_success_timestamp_seconds",
            (),
            "Unix time the configuration file (--config.file) last took effect: the start, "
            "or the last reload that succeeded; absent without the file.",
        ),
        _gauge(
            "pg_advisory_exporter_web_config_last_reload_successful",
            (),
            "1 if the last change to the web configuration (--web.config.file) took effect, "
            "0 if it was refused and the previous one stays; absent without the file.",
        ),
        _counter(
            "pg_advisory_exporter_web_rate_limited_total",
            (),
            "Requests answered 429 by the web configuration's rate_limit (every endpoint but "
            "/-/healthy counts against it); absent without the file.",
        ),
        _gauge(
            "pg_advisory_exporter_discovered_targets",
            (),
            "Targets that probes named through an auth module, kept now (their series are "
            "served by their /probe only).",
        ),
        _gauge(
            "pg_advisory_exporter_discovered_servers",
            (),
            "Servers that the discovered targets read, kept now: one connection each, "
            "however many of its databases are probed.",
        ),
        _counter(
            "pg_advisory_exporter_probe_refusals_total",
            ("reason",),
            "Probes of a target through an auth module refused with no connection of their "
            "own: unknown_auth_module, malformed_target, not_resolved, not_allowed, "
            "limit_reached, no_such_database.",
        ),
        _gauge(
            "pg_advisory_exporter_collect_duration_seconds",
            ("target",),
            "How long the last collection took.",
        ),
        _counter(
            "pg_advisory_exporter_collect_errors_total",
            ("target",),
            "Failed collections.",
        ),
        _gauge(
            "pg_advisory_exporter_last_success_timestamp_seconds",
            ("target",),
            "Unix time of the last successful collection.",
        ),
        _gauge(
            "pg_advisory_exporter_insufficient_privilege",
            ("target",),
            "1 when the monitoring role cannot see other sessions' state and times "
            "(it lacks pg_read_all_stats).",
        ),
        _gauge(
            "pg_advisory_exporter_locks_page_info",
            ("target", "url"),
            "Always 1, where --web.external-url is set: the URL of the target's /locks page, "
            "which alert descriptions link to.",
        ),
        _gauge(
            "pg_advisory_exporter_shard_index",
            (),
            "This replica's shard of the configured targets (--shard.index), from 0.",
        ),
        _gauge(
            "pg_advisory_exporter_shards",
            (),
            "Replicas that split the configured targets between them (--shard.total).",
        ),
        _gauge(
            "pg_advisory_exporter_folded_application_names",
            ("target",),
            "Distinct application_name values the cardinality cap folded into "
            "__other__ in the last collection.",
        ),
        _gauge(
            "pg_advisory_exporter_untracked_holds",
            ("target",),
            "Holds of advisory locks in the last collection that the exporter could not track, "
            "its cap per server reached: their hold time is bounded by the server's timestamps "
            "alone.",
        ),
    )
}


@dataclass(frozen=True)
class Sample:
    name: str
    labels: tuple[str, ...]  # values in the order of SPECS[name].labels
    value: float


def families(samples: Iterable[Sample]) -> list[Metric]:
    """One metric family per name, in contract order, built fresh for this scrape.

    A sample that the contract does not define, or with the wrong number of label values,
    is a bug: it raises rather than vanish from the exposition.
    """
    by_name: dict[str, list[Sample]] = defaultdict(list)
    for sample in samples:
        spec = SPECS.get(sample.name)
        if spec is None:
            raise ValueError(f"{sample.name} is not in the metric contract")
        if len(sample.labels) != len(spec.labels):
            raise ValueError(f"{sample.name} takes labels {spec.labels}, got {sample.labels}")
        by_name[sample.name].append(sample)
    result: list[Metric] = []
    for name, spec in SPECS.items():
        if name not in by_name:
            continue
        family: GaugeMetricFamily | CounterMetricFamily
        if spec.kind == "counter":
            family = CounterMetricFamily(name, spec.help, labels=spec.labels)
        else:
            family = GaugeMetricFamily(name, spec.help, labels=spec.labels)
        for sample in by_name[name]:
            family.add_metric(sample.labels, sample.value)
        result.append(family)
    return result


def locks_page_info(target: str, url: str) -> Sample:
    return Sample("pg_advisory_exporter_locks_page_info", (target, url), 1)


def build_info(version: str, python_version: str) -> Sample:
    return Sample("pg_advisory_exporter_build_info", (version, python_version), 1)


def config_reload(successful: bool, success_unix: float) -> list[Sample]:
    return [
        Sample("pg_advisory_exporter_config_last_reload_successful", (), successful),
        Sample(
            "pg_advisory_exporter_config_last_reload_success_timestamp_seconds", (), success_unix
        ),
    ]


def web_config_reload(successful: bool) -> Sample:
    return Sample("pg_advisory_exporter_web_config_last_reload_successful", (), successful)


def web_rate_limited(refused: int) -> Sample:
    return Sample("pg_advisory_exporter_web_rate_limited_total", (), refused)
