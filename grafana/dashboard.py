"""The Grafana dashboard, built with grafana-foundation-sdk (Grafana 11.6 schema).

`python -m grafana.dashboard` prints its JSON; `make generate` writes it to
grafana/pg-advisory-exporter.json. The series and labels come from the metric contract
(exporter.metrics.SPECS) and the threshold lines from the alert rules' defaults.
"""

from __future__ import annotations

import json
import string
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from grafana_foundation_sdk.builders import common, dashboard, prometheus, stat, table, timeseries
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as common_model
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from grafana.schema import unknown_fields
from pg_advisory_exporter.alerting.rule_writer import ANSWERS_FOR_SERVER
from pg_advisory_exporter.alerting.rules import RUNBOOK_URL, Thresholds
from pg_advisory_exporter.durations import format_duration
from pg_advisory_exporter.metrics import SPECS

UID = "pg-advisory-locks"
TITLE = "PostgreSQL advisory locks"
TAGS = ["postgresql", "advisory-locks", "pg-advisory-exporter"]
DATASOURCE = model.DataSourceRef(type_val="prometheus", uid="${datasource}")
# The query variables, each narrowed by those before it: name, label, the series it lists.
VARIABLES = (
    ("job", "Job", "pg_advisory_up"),
    ("target", "Target", "pg_advisory_up"),
    ("datname", "Database", "pg_advisory_deadlocks_total"),
    ("application_name", "Application", "pg_advisory_locks"),
)
# The shipped alert rules' thresholds, drawn where a panel shows what an alert watches.
ALERTS = Thresholds()
GROUP = "target, datname, application_name"
IN_DATABASE = "{{datname}} on {{target}}"
OF_APPLICATION = "{{application_name}} in " + IN_DATABASE
PanelBuilder = cogbuilder.Builder[model.Panel]
T = TypeVar("T")


def sel(metric: str, **matchers: str) -> str:
    """The metric filtered by each variable whose label it has (all have `job`), and `matchers`."""
    labels = ("job", *SPECS[metric].labels)
    filters = [f'{name}=~"${name}"' for name, _, _ in VARIABLES if name in labels]
    filters += [f'{label}="{value}"' for label, value in matchers.items()]
    return f"{metric}{{{', '.join(filters)}}}"


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


def _lettered(items: Sequence[T]) -> list[tuple[str, T]]:
    """Each item with its query's refId: A, B, C..."""
    return list(zip(string.ascii_uppercase, items, strict=False))


def _target(ref_id: str, query: Query) -> prometheus.Dataquery:
    return (
        prometheus.Dataquery()
        .ref_id(ref_id)
        .datasource(DATASOURCE)
        .expr(query.expr)
        .legend_format(query.legend)
        .range()
    )


def _thresholds(*steps: tuple[float, str], base: str = "green") -> dashboard.ThresholdsConfig:
    """`base` below the first step; each (value, colour) from its value up."""
    return (
        dashboard.ThresholdsConfig()
        .mode(model.ThresholdsMode.ABSOLUTE)
        .steps(
            [
                model.Threshold(value=None, color=base),
                *(model.Threshold(value=value, color=color) for value, color in steps),
            ]
        )
    )


def _stat(
    title: str,
    description: str,
    unit: str,
    query: Query,
    *steps: tuple[float, str],
    no_value: str = "No data",
    base: str = "green",
    width: int = 4,
    height: int = 4,
) -> stat.Panel:
    """One number per series, its last value over the time range, coloured by `steps` (and
    `base` below the first)."""
    return (
        stat.Panel()
        .title(title)
        .description(description)
        .unit(unit)
        .datasource(DATASOURCE)
        .with_target(_target("A", query))
        .reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]))
        .graph_mode(common_model.BigValueGraphMode.AREA)
        .thresholds(_thresholds(*steps, base=base))
        .no_value(no_value)
        .span(width)
        .height(height)
    )


def _timeseries(
    title: str,
    description: str,
    unit: str,
    queries: Sequence[Query],
    *,
    limit: float | None = None,
    width: int = 12,
) -> timeseries.Panel:
    """A graph of `queries`; `limit` is an alert's threshold, drawn as a red line."""
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .unit(unit)
        .datasource(DATASOURCE)
        .targets([_target(ref_id, query) for ref_id, query in _lettered(queries)])
        .legend(
            common.VizLegendOptions()
            .show_legend(True)
            .display_mode(common_model.LegendDisplayMode.TABLE)
            .placement(common_model.LegendPlacement.BOTTOM)
            .calcs(["lastNotNull", "max"])
        )
        .tooltip(
            common.VizTooltipOptions()
            .mode(common_model.TooltipDisplayMode.MULTI)
            .sort(common_model.SortOrder.DESCENDING)
        )
        .min(0)
        .span(width)
        .height(8)
    )
    if limit is not None:
        panel.thresholds(_thresholds((limit, "red"))).thresholds_style(
            common.GraphThresholdsStyleConfig().mode(common_model.GraphThresholdsStyleMode.LINE)
        )
    return panel


@dataclass(frozen=True)
class Column:
    name: str
    unit: str
    expr: str


def _table(
    title: str, description: str, keys: Sequence[str], columns: Sequence[Column], sort_by: str
) -> table.Panel:
    """One row per combination of the `keys` labels, one column per instant query."""
    lettered = _lettered(columns)
    panel = (
        table.Panel()
        .title(title)
        .description(description)
        .unit("short")
        .datasource(DATASOURCE)
        .targets(
            [
                prometheus.Dataquery()
                .ref_id(ref_id)
                .datasource(DATASOURCE)
                .expr(column.expr)
                .format(PromQueryFormat.TABLE)
                .instant()
                for ref_id, column in lettered
            ]
        )
        .with_transformation(model.DataTransformerConfig(id_val="merge", options={}))
        .with_transformation(
            model.DataTransformerConfig(
                id_val="organize",
                options={
                    "excludeByName": {"Time": True},
                    "indexByName": {
                        name: index
                        for index, name in enumerate([*keys, *(c.name for c in columns)])
                    },
                    "renameByName": {
                        f"Value #{ref_id}": column.name for ref_id, column in lettered
                    },
                },
            )
        )
        .sort_by([common.TableSortByFieldState().display_name(sort_by).desc(True)])
        .span(24)
        .height(8)
    )
    for column in columns:
        panel.override_by_name(
            column.name, [model.DynamicConfigValue(id_val="unit", value=column.unit)]
        )
    return panel


def _overview() -> list[PanelBuilder]:
    leaked_after = format_duration(ALERTS.leaked_lock_after)
    # Of the targets that read one server, the one that answers for it (rules.py).
    once_per_server = f"and on (job, instance, target) {sel(ANSWERS_FOR_SERVER)}"
    return [
        _stat(
            "Servers up",
            "PostgreSQL servers the exporter read successfully at its last collection, each "
            "counted once however many of its databases are probed. No data means Prometheus "
            "does not scrape the exporter: check its pod and scrape job.",
            "short",
            Query(f"sum({sel('pg_advisory_up')} {once_per_server})", "up"),
            width=3,
        ),
        _stat(
            "Servers down",
            "Servers the exporter cannot read (refused, login failed, timed out); every panel "
            "below is blind to them. The exporter's log says why; PgAdvisoryTargetDown pages "
            f"after {format_duration(ALERTS.target_down_for)}.",
            "short",
            Query(f"sum((1 - {sel('pg_advisory_up')}) {once_per_server})", "down"),
            (1, "red"),
            width=3,
        ),
        _stat(
            f"Holders idle > {leaked_after}",
            "Applications (per database and state) with a session that has held an advisory "
            f"lock while idle for more than {leaked_after}, what PgAdvisoryLockLeaked pages on: "
            "most likely a leaked lock. The runbook's SQL finds the session to end.",
            "short",
            Query(
                f"sum({sel('pg_advisory_idle_holder_max_seconds')} "
                f"> bool {ALERTS.leaked_lock_after:g})",
                "applications",
            ),
            (1, "red"),
            no_value="0",
            width=3,
        ),
        _stat(
            "Stranded session locks",
            "Session-level advisory lock entries held on server connections that a "
            "transaction- or statement-mode PgBouncer pool owns: the client that took them no "
            "longer owns the connection, the next client handed it holds them too, and every "
            "other session fails to get them. Any pages as "
            "PgAdvisorySessionLockInTransactionPool in about "
            f"{format_duration(ALERTS.pooled_session_lock_for)}. The Poolers row names the "
            "application and pool, the target's locks page the backend; as the runbook says, "
            "end that backend, then move the job to transaction-level locks, a session-mode "
            "pool or a direct connection.",
            "short",
            Query(f"sum({sel('pg_advisory_pooled_session_locks')})", "stranded"),
            (1, "red"),
            no_value="0",
            width=3,
        ),
        _stat(
            "Waiters",
            "Sessions waiting for an advisory lock now. A few for a moment is normal; a steady "
            "number means work queues behind one holder: see Longest wait by application.",
            "short",
            Query(f"sum({sel('pg_advisory_waiters')})", "waiters"),
            (ALERTS.waiters, "orange"),
            no_value="0",
            width=3,
        ),
        _stat(
            "Longest wait",
            "The longest any session has been waiting for an advisory lock. Past "
            f"{format_duration(ALERTS.wait_after)} PgAdvisoryLockWaitTooLong warns: its "
            "holder may be stuck or leaked.",
            "s",
            Query(f"max({sel('pg_advisory_wait_max_seconds')})", "longest wait"),
            (ALERTS.wait_after, "orange"),
            no_value="0",
            width=3,
        ),
        _stat(
            "Lock table use",
            "How full the shared lock table of the fullest server is. When it is full no session "
            "can take any lock (out of shared memory): find the backend holding the most in "
            "Busiest backend below.",
            "percentunit",
            Query(
                f"max({sel('pg_advisory_lock_table_entries')} "
                f"/ {sel('pg_advisory_lock_table_capacity')})",
                "fullest lock table",
            ),
            (ALERTS.lock_table_warning, "orange"),
            (ALERTS.lock_table_critical, "red"),
            width=3,
        ),
        _stat(
            "Lock tables full",
            "Servers whose shared lock table is full now: its entries at its capacity or past "
            "it, or the server refusing the exporter's read because it is. No session there can "
            "take a lock it does not hold yet, and no new connection can start. PgLockTableFull "
            "pages; Busiest backend below names the application holding the most entries, "
            "the target's locks page its backends.",
            "short",
            Query(f"sum({sel('pg_advisory_lock_table_full')})", "full"),
            (1, "red"),
            no_value="0",
            width=3,
        ),
    ]


def _holders_and_waiters() -> list[PanelBuilder]:
    leaked_after = format_duration(ALERTS.leaked_lock_after)
    return [
        _timeseries(
            "Advisory locks held by application",
            "Granted advisory lock entries per application, stacked. A steady climb is "
            "lock-per-row code or locks never released; compare with Busiest backend below.",
            "short",
            [
                Query(
                    f"sum by ({GROUP}) ({sel('pg_advisory_locks', granted='true')})",
                    OF_APPLICATION,
                )
            ],
        ).stacking(common.StackingConfig().mode(common_model.StackingMode.NORMAL)),
        _timeseries(
            "Lock holders by state",
            "Sessions holding at least one advisory lock, per application and session state. "
            "Idle holders of a job that should be short-lived are leaked locks.",
            "short",
            [
                Query(
                    f"sum by ({GROUP}, state) ({sel('pg_advisory_holders')})",
                    "{{application_name}} {{state}} in " + IN_DATABASE,
                )
            ],
        ),
        _timeseries(
            "Longest idle holder by application",
            "How long the longest-idle session holding an advisory lock has been idle (or idle "
            "in transaction), per application; holders of migration tools' or long_lived keys "
            "only, and idle holders of applications idle by design, do not count. Above the "
            f"line ({leaked_after}) PgAdvisoryLockLeaked pages: end the session as the runbook "
            "says and fix the code path that leaves the lock behind.",
            "s",
            [
                Query(
                    f"max by ({GROUP}, state) ({sel('pg_advisory_idle_holder_max_seconds')})",
                    "{{application_name}} {{state}} in " + IN_DATABASE,
                )
            ],
            limit=ALERTS.leaked_lock_after,
        ),
        _timeseries(
            "Idle by design, against each bound",
            "Applications that hold advisory locks on idle connections on purpose (a job "
            "queue's consumer, a migrator's lock connection: the idle_by_design entries of the "
            "configuration and the catalog): how long the longest-idle holder has sat on its "
            "locks, and each entry's max_hold. Past its bound, PgAdvisoryIdleByDesignHeldTooLong "
            "pages: the work it holds them for is stuck, or the lock has leaked.",
            "s",
            [
                Query(
                    f"max by ({GROUP}, idle_by_design) "
                    f"({sel('pg_advisory_idle_by_design_seconds')})",
                    "{{application_name}} in " + IN_DATABASE + " ({{idle_by_design}})",
                ),
                Query(
                    "max by (idle_by_design) "
                    f"({sel('pg_advisory_idle_by_design_max_hold_seconds')})",
                    "{{idle_by_design}} max_hold",
                ),
            ],
        ),
        _timeseries(
            "Waiters by application",
            "Sessions waiting for an advisory lock, per application. More than "
            f"{ALERTS.waiters} of one application for {format_duration(ALERTS.waiters_for)} "
            "raises PgAdvisoryLockWaitersPiling: find what the holder is doing.",
            "short",
            [Query(f"sum by ({GROUP}) ({sel('pg_advisory_waiters')})", OF_APPLICATION)],
            limit=ALERTS.waiters,
        ),
        _timeseries(
            "Longest wait by application",
            "The longest current wait for an advisory lock in each application. Above the line "
            f"({format_duration(ALERTS.wait_after)}) PgAdvisoryLockWaitTooLong warns: the "
            "holder is probably stuck, the runbook finds it.",
            "s",
            [Query(f"max by ({GROUP}) ({sel('pg_advisory_wait_max_seconds')})", OF_APPLICATION)],
            limit=ALERTS.wait_after,
        ),
        _timeseries(
            "Waits the server counted (PostgreSQL 19)",
            "Advisory lock waits per second that the server itself counted (pg_stat_lock, "
            "PostgreSQL 19 and later): every wait that outlived "
            "deadlock_timeout and then got the lock, those that began and ended between two "
            "scrapes too. Waits given up (lock_timeout, a cancel) and shorter ones are not "
            "counted; the server's log has them, by application and key (Server log row). "
            "Empty before PostgreSQL 19.",
            "short",
            [
                Query(
                    f"rate({sel('pg_advisory_server_lock_waits_total')}[$__rate_interval])",
                    "{{target}}",
                ),
            ],
        ),
        _timeseries(
            "Mean counted wait (PostgreSQL 19)",
            "The mean length of the waits the server counted (previous panel) that ended in "
            "each interval.",
            "s",
            [
                Query(
                    f"rate({sel('pg_advisory_server_lock_wait_seconds_total')}[$__rate_interval])"
                    f" / rate({sel('pg_advisory_server_lock_waits_total')}[$__rate_interval])",
                    "{{target}}",
                ),
            ],
        ),
        _locks_pages(),
    ]


def _locks_pages() -> table.Panel:
    """Each target's /locks page, one clickable row per target."""
    link = "Locks page"
    return (
        table.Panel()
        .title("Locks pages: holders and waiters now")
        .description(
            "The exporter's /locks page of each server, read when opened: every advisory lock "
            "holder and waiter with its pid, key, registry name, state, pooler and who blocks "
            "whom, which the panels above only count. Listed where the exporter runs with "
            "--web.external-url."
        )
        .unit("short")
        .datasource(DATASOURCE)
        .with_target(
            prometheus.Dataquery()
            .ref_id("A")
            .datasource(DATASOURCE)
            .expr(f"max by (target, url) ({sel('pg_advisory_exporter_locks_page_info')})")
            .format(PromQueryFormat.TABLE)
            .instant()
        )
        .with_transformation(
            model.DataTransformerConfig(
                id_val="organize",
                options={
                    "excludeByName": {"Time": True, "Value": True},
                    "indexByName": {"target": 0, "url": 1},
                    "renameByName": {"target": "Target", "url": link},
                },
            )
        )
        .sort_by([common.TableSortByFieldState().display_name("Target")])
        .override_by_name(
            link,
            [
                model.DynamicConfigValue(
                    id_val="links",
                    value=[
                        {
                            "title": "Holders and waiters of ${__data.fields.target}",
                            "url": "${__value.raw}",
                            "targetBlank": True,
                        }
                    ],
                )
            ],
        )
        .span(24)
        .height(5)
    )


def _poolers() -> list[PanelBuilder]:
    pool_group = f"{GROUP}, pooler, pool"
    return [
        _timeseries(
            "Session locks stranded in transaction pools",
            "Session-level advisory lock entries held on server connections of a transaction- "
            "or statement-mode pool, per application and pool: the next client handed the "
            "connection holds them too. 0 per pooler read and found clean. Above 0 "
            "PgAdvisorySessionLockInTransactionPool pages after "
            f"{format_duration(ALERTS.pooled_session_lock_for)}: end the backend as the "
            "runbook says, and take the lock per transaction or through a session-mode pool.",
            "short",
            [
                Query(
                    f"sum by ({pool_group}) ({sel('pg_advisory_pooled_session_locks')})",
                    "{{application_name}} in pool {{pool}} of {{pooler}}, " + IN_DATABASE,
                )
            ],
            limit=1,
            width=16,
        ),
        _stat(
            "Poolers up",
            "Whether the exporter could read each pooler (its admin console, or known by "
            "address) at its last collection. A pooler that cannot be read leaves the "
            "server's series intact, but session locks stranded behind it go unseen; the "
            "exporter's log says why.",
            "short",
            Query(
                f"max by (target, pooler) ({sel('pg_advisory_pooler_up')})",
                "{{pooler}} of {{target}}",
            ),
            (1, "green"),
            base="red",
            width=8,
            height=8,
        ).mappings(
            [
                model.ValueMap(
                    options={
                        "0": model.ValueMappingResult(text="down", color="red", index=0),
                        "1": model.ValueMappingResult(text="up", color="green", index=1),
                    }
                )
            ]
        ),
    ]


def _lock_table() -> list[PanelBuilder]:
    return [
        _timeseries(
            "Lock table entries against capacity",
            "Entries in the shared lock table (all lock types) and its nominal capacity. "
            f"PgLockTableNearlyFull warns at {ALERTS.lock_table_warning:.0%} and pages at "
            f"{ALERTS.lock_table_critical:.0%}: the next panel shows who holds the most.",
            "short",
            [
                Query(sel("pg_advisory_lock_table_entries"), "entries on {{target}}"),
                Query(sel("pg_advisory_lock_table_capacity"), "capacity of {{target}}"),
            ],
            width=8,
        ),
        _timeseries(
            "Busiest backend against max_locks_per_transaction",
            "The most lock table entries one backend holds, the application holding the most of "
            "them (all its backends), and the most advisory locks one backend of each "
            "application holds, against max_locks_per_transaction, the average "
            "budget of a backend. An application above it raises "
            "PgAdvisoryBackendOverLockBudget: lock per batch, not per row.",
            "short",
            [
                Query(
                    sel("pg_advisory_lock_table_backend_entries_max"),
                    "busiest backend on {{target}}, all lock types",
                ),
                Query(
                    sel("pg_advisory_lock_table_top_application_entries"),
                    "the most, all lock types: {{application_name}} in {{datname}} on {{target}}",
                ),
                Query(
                    f"max by ({GROUP}) ({sel('pg_advisory_backend_locks_max')})",
                    "advisory locks of one " + OF_APPLICATION + " backend",
                ),
                Query(
                    sel("pg_advisory_max_locks_per_transaction"),
                    "max_locks_per_transaction of {{target}}",
                ),
            ],
            width=8,
        ),
        _timeseries(
            "Deadlocks",
            "Deadlocks PostgreSQL detected and broke in each database, all lock types. Any is a "
            "bug: sessions take the same locks in different orders; the server log names both "
            "statements.",
            "short",
            [
                Query(
                    "sum by (target, datname) "
                    f"(increase({sel('pg_advisory_deadlocks_total')}[$__rate_interval]))",
                    IN_DATABASE,
                )
            ],
            width=8,
        ).draw_style(common_model.GraphDrawStyle.BARS),
    ]


def _logged(metric: str, by: str = GROUP) -> str:
    """The events a server-log counter counted in each interval."""
    return f"sum by ({by}) (increase({sel(metric)}[$__rate_interval]))"


def _server_log() -> list[PanelBuilder]:
    events = (
        (
            "Unlocks of locks not held",
            "pg_advisory_log_unlocks_not_held_total",
            "Unlocks of an advisory lock the session did not hold, from the server's log "
            "(WARNING: you don't own a lock of type ...): the lock is still held elsewhere, "
            "most often on another connection of a transaction pool. Above "
            f"{ALERTS.unlocks_not_held} in {format_duration(ALERTS.unlocks_not_held_window)}, "
            "PgAdvisoryUnlockNotHeld warns.",
        ),
        (
            "Lock table found full",
            "pg_advisory_log_out_of_shared_memory_total",
            "Statements that failed because the shared lock table was full (ERROR: out of "
            "shared memory), from the server's log: they happen between scrapes, when the "
            "snapshot may never see the table full. Any pages: PgLockTableOutOfSharedMemory.",
        ),
        (
            "Advisory deadlocks",
            "pg_advisory_log_deadlocks_total",
            "Deadlocks that involved an advisory lock, from the server's log, by the "
            "application of the session that was cancelled to break them.",
        ),
    )
    panels: list[PanelBuilder] = [
        _timeseries(
            title, description, "short", [Query(_logged(metric), OF_APPLICATION)], width=8
        ).draw_style(common_model.GraphDrawStyle.BARS)
        for title, metric, description in events
    ]
    by_key = f"{GROUP}, key"
    waits = _logged("pg_advisory_log_lock_waits_total", by_key)
    waited = _logged("pg_advisory_log_lock_wait_seconds_total", by_key)
    of_key = "key {{key}} for " + OF_APPLICATION
    panels += [
        _timeseries(
            "Logged waits by key",
            "Waits for an advisory lock that outlived deadlock_timeout (log_lock_waits), those "
            "that ended before any scrape too, by the registry's name of the key (empty for "
            "a key it lacks).",
            "short",
            [Query(waits, "waits: " + of_key)],
            width=12,
        ),
        _timeseries(
            "Mean logged wait",
            "The seconds of the logged waits that ended in each interval, per wait.",
            "s",
            [Query(f"{waited} / {waits}", of_key)],
            width=6,
        ),
        _timeseries(
            "Server log read",
            "Lines read from each target's server log and those that were no record of its "
            "format (a line prefix that differs from the server's log_line_prefix shows "
            "here), per second; the gaps are where the log could not be read "
            "(pg_advisory_log_up 0, the exporter's log says why).",
            "short",
            [
                Query(
                    f"rate({sel('pg_advisory_log_lines_total')}[$__rate_interval])"
                    f" and on (job, instance, target) {sel('pg_advisory_log_up')} == 1",
                    "lines of {{target}}",
                ),
                Query(
                    f"rate({sel('pg_advisory_log_unparsed_lines_total')}[$__rate_interval])",
                    "unparsed lines of {{target}}",
                ),
            ],
            width=6,
        ),
    ]
    return panels


def _hygiene() -> list[PanelBuilder]:
    """What makes a leak likely or long, before it happens (docs/hygiene.md)."""
    limit = ALERTS.dead_client_release_after
    return [
        _timeseries(
            "A dead client keeps its session locks for",
            "How long a session idle outside a transaction keeps its locks once its client's "
            "host or network is gone: until the server's TCP keepalives give up, or "
            "idle_session_timeout ends it. While sessions hold locks that way (next panel), "
            f"above {format_duration(limit)} PgAdvisoryDeadClientKeepsLocks warns.",
            "s",
            [
                Query(sel("pg_advisory_dead_client_release_seconds"), "dead client on {{target}}"),
                Query(
                    sel("pg_advisory_idle_in_transaction_release_seconds"),
                    "idle in transaction on {{target}}",
                ),
            ],
            limit=limit,
            width=8,
        ),
        _timeseries(
            "Sessions holding locks outside a transaction",
            "Backends of the whole server that hold advisory locks while outside any "
            "transaction: session-level locks (a leader's, a job's), those a dead client would "
            "keep for the time on the left.",
            "short",
            [Query(sel("pg_advisory_idle_session_holders"), "{{target}}")],
            width=8,
        ),
        _timeseries(
            "Risky lock statements",
            "Statements in pg_stat_statements that call an advisory lock function in a scan "
            "that a LIMIT cuts (lock_in_limited_scan) or in the WHERE of a multi-row scan "
            "(lock_in_where), or make keys with hashtext() (hashtext_key): each can leave "
            "locks behind. check and /locks list them with their safe forms; the skipped "
            "ones are statements the last read did not judge.",
            "short",
            [
                Query(
                    f"sum by (target, datname, rule) ({sel('pg_advisory_risky_statements')})",
                    "{{rule}} in {{datname}} on {{target}}",
                ),
                Query(
                    f"sum by (target, reason) ({sel('pg_advisory_statements_skipped')})",
                    "skipped, {{reason}}, on {{target}}",
                ),
                Query(
                    sel("pg_advisory_statements_up"),
                    "pg_stat_statements read (1) or not (0) on {{target}}",
                ),
            ],
            width=8,
        ),
    ]


def _registered_keys() -> list[PanelBuilder]:
    keys = ("target", "datname", "key")
    by = ", ".join(keys)
    return [
        _table(
            "Registered keys",
            "Each key of the exporter's key registry that is held or awaited (or must be held), "
            "per server and database: holders, waiters, how long the longest holder has been in "
            "its state, and the key's max_hold. 0 holders of an expect_held key pages "
            "(PgAdvisoryKeyNotHeld); a hold time over max_hold warns.",
            keys,
            [
                Column("Holders", "short", f"max by ({by}) ({sel('pg_advisory_key_holders')})"),
                Column("Waiters", "short", f"max by ({by}) ({sel('pg_advisory_key_waiters')})"),
                Column("Hold time", "s", f"max by ({by}) ({sel('pg_advisory_key_hold_seconds')})"),
                Column(
                    "Max hold",
                    "s",
                    # The limit has no datname: spread it over the key's rows.
                    f"max by ({by}) (0 * {sel('pg_advisory_key_waiters')} "
                    "+ on (job, instance, target, key) group_left () "
                    f"{sel('pg_advisory_key_max_hold_seconds')})",
                ),
            ],
            sort_by="Hold time",
        )
    ]


def _exporter() -> list[PanelBuilder]:
    return [
        _timeseries(
            "Collection duration",
            "How long the exporter's last read of each server took. It should stay well under "
            "the statement timeout (5s by default); a slow one means a huge lock table or an "
            "overloaded server.",
            "s",
            [Query(sel("pg_advisory_exporter_collect_duration_seconds"), "{{target}}")],
            width=8,
        ),
        _timeseries(
            "Failed collections",
            "Failed reads per second, per server (refused, login failed, timed out). The "
            "exporter's log says why; that server's lock panels are empty meanwhile.",
            "ops",
            [
                Query(
                    f"rate({sel('pg_advisory_exporter_collect_errors_total')}[$__rate_interval])",
                    "{{target}}",
                )
            ],
            width=8,
        ),
        _timeseries(
            "Time since last successful collection",
            "How old the newest good reading of each server is. It grows while a server cannot "
            f"be read; PgAdvisoryTargetDown pages after "
            f"{format_duration(ALERTS.target_down_for)}.",
            "s",
            [
                Query(
                    f"time() - {sel('pg_advisory_exporter_last_success_timestamp_seconds')}",
                    "{{target}}",
                )
            ],
            width=8,
        ),
        _timeseries(
            "Monitoring role lacks pg_read_all_stats",
            "True when the exporter's role cannot see other sessions' state: idle times and the "
            "leaked-lock signal are missing for that server, and hold times count from when the "
            "exporter first saw each lock only. Fix with GRANT pg_read_all_stats TO the role.",
            "bool",
            [Query(sel("pg_advisory_exporter_insufficient_privilege"), "{{target}}")],
        ),
        _timeseries(
            "Folded names, untracked holds",
            "Distinct application_name values folded into __other__ by the exporter's "
            "application_name_limit: above 0, add rewrite rules for per-pod names or raise "
            "the limit. Holds of advisory locks the exporter could not track, its cap per "
            "server reached: their hold times are only what the server's timestamps tell.",
            "short",
            [
                Query(sel("pg_advisory_exporter_folded_application_names"), "folded {{target}}"),
                Query(sel("pg_advisory_exporter_untracked_holds"), "untracked {{target}}"),
            ],
        ),
        _timeseries(
            "Discovered targets",
            "Targets that probes named through an auth module and the exporter keeps now, and "
            "the servers they read, one connection each (docs/fleets.md, Discovered targets). "
            "It falls as targets go unprobed for discovered_targets.idle_after; at "
            "discovered_targets.max new ones are refused.",
            "short",
            [
                Query(sel("pg_advisory_exporter_discovered_targets"), "targets of {{instance}}"),
                Query(sel("pg_advisory_exporter_discovered_servers"), "servers of {{instance}}"),
            ],
        ),
        _timeseries(
            "Refused probes and requests",
            "Probes through an auth module refused before any connection, per second, by "
            "reason: not_allowed is a target outside allowed_targets (a discovery that finds "
            "more than the allow-list admits, or a caller trying), limit_reached is "
            "discovered_targets.max. rate_limit: requests of any endpoint but /-/healthy "
            "answered 429 by the web configuration's rate_limit, scrapes included.",
            "ops",
            [
                Query(
                    f"sum by (reason) (rate({sel('pg_advisory_exporter_probe_refusals_total')}"
                    "[$__rate_interval]))",
                    "{{reason}}",
                ),
                Query(
                    f"sum(rate({sel('pg_advisory_exporter_web_rate_limited_total')}"
                    "[$__rate_interval]))",
                    "rate_limit",
                ),
            ],
        ),
        _timeseries(
            "Shards",
            "For replicas that split the configured targets between them (docs/fleets.md, "
            "Shards): how many shards each job has, and how many a replica serves. Below the "
            "total, the missing shards' targets go uncollected; "
            f"PgAdvisoryExporterShardsMissing pages after "
            f"{format_duration(ALERTS.shards_missing_for)}.",
            "short",
            [
                Query(f"max by (job) ({sel('pg_advisory_exporter_shards')})", "shards of {{job}}"),
                Query(
                    "count by (job) (count_values by (job) "
                    f'("shard_index", {sel("pg_advisory_exporter_shard_index")}))',
                    "served in {{job}}",
                ),
            ],
        ),
    ]


def _variables() -> list[dashboard.QueryVariable]:
    variables = []
    for position, (name, label, metric) in enumerate(VARIABLES):
        narrowed_by = ", ".join(f'{before}=~"${before}"' for before, _, _ in VARIABLES[:position])
        series = f"{metric}{{{narrowed_by}}}" if narrowed_by else metric
        variables.append(
            dashboard.QueryVariable(name)
            .label(label)
            .datasource(DATASOURCE)
            .query(f"label_values({series}, {name})")
            .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(model.VariableSort.ALPHABETICAL_CASE_INSENSITIVE_ASC)
            .multi(True)
            .include_all(True)
            # Not ".+": an empty application_name is no label at all, and must still match.
            .all_value(".*")
            .current(model.VariableOption(selected=True, text=["All"], value=["$__all"]))
        )
    return variables


ROWS = (
    ("Overview", _overview),
    ("Who holds, who waits", _holders_and_waiters),
    ("Poolers", _poolers),
    ("Lock table", _lock_table),
    ("Registered keys", _registered_keys),
    ("Server log", _server_log),
    ("Lock hygiene", _hygiene),
    ("Exporter", _exporter),
)


def build() -> model.Dashboard:
    board = (
        dashboard.Dashboard(TITLE)
        .uid(UID)
        .description(
            "PostgreSQL advisory locks from pg-advisory-exporter: who holds them, for how long, "
            "who waits, and how full the lock table is."
        )
        .tags(TAGS)
        .readonly()
        .time("now-3h", "now")
        .refresh("30s")
        .tooltip(model.DashboardCursorSync.CROSSHAIR)
        .link(
            dashboard.DashboardLink("Runbook")
            .type(model.DashboardLinkType.LINK)
            .url(RUNBOOK_URL)
            .icon("doc")
            .tooltip("What each alert means and how to end a leaked lock safely")
            .target_blank(True)
        )
        .variables(
            [
                dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus"),
                *_variables(),
            ]
        )
    )
    for title, panels in ROWS:
        board.with_row(dashboard.Row(title))
        for panel in panels():
            board.with_panel(panel)
    result = board.build()
    for number, built in enumerate(result.panels or [], start=1):
        built.id_val = number
    return result


def main() -> None:
    document = json.dumps(build(), cls=JSONEncoder, sort_keys=True, indent=2)
    unknown = unknown_fields(json.loads(document))
    if unknown:  # never write a dashboard that Grafana's own models do not read back whole
        raise SystemExit("fields Grafana does not know:\n" + "\n".join(unknown))
    print(document)


if __name__ == "__main__":
    main()
