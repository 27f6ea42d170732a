"""Alerts on the lock table: nearly full, forecast to be full, a backend over its lock budget."""

from __future__ import annotations

from .rule_writer import APP, SERVER, VALUE, WHERE, Rule, RuleWriter

FULL = "PgLockTableFull"

# The application that holds the most entries, found by a query when the alert fires: the
# exporter's series that names it is absent where the server refused the read.
_TOP_APPLICATION = (
    '{{ with printf "pg_advisory_lock_table_top_application_entries{job=%q, instance=%q, '
    'target=%q}" $labels.job $labels.instance $labels.target | query }}{{ with first . }} '
    "The application holding the most entries is {{ .Labels.application_name }} in database "
    '{{ .Labels.datname }}, with {{ .Value | printf "%.0f" }}.{{ end }}{{ end }}'
)


def lock_table(w: RuleWriter) -> list[Rule]:
    return [
        _full(w),
        _nearly_full(w, "warning", "lock_table_warning"),
        _nearly_full(w, "critical", "lock_table_critical"),
        _exhaustion_forecast(w),
        _backend_over_lock_budget(w),
    ]


def _fill(w: RuleWriter) -> str:
    """The share of the lock table's capacity in use."""
    return f"{w.sel('pg_advisory_lock_table_entries')} / {w.sel('pg_advisory_lock_table_capacity')}"


def _full(w: RuleWriter) -> Rule:
    # At once: a full table fails every lock request not held yet, and every new connection.
    return w.alert(
        FULL,
        f"{w.sel('pg_advisory_lock_table_full')} == 1",
        for_="",
        severity="critical",
        summary="The lock table of {{ $labels.target }} is full",
        description="The shared lock table of {{ $labels.target }} is full: its entries have "
        "reached its capacity, or the server refused the exporter's read because it is (out "
        "of shared memory). No session can take a lock it does not hold yet, and no new "
        "connection can start: queries fail with ERROR: out of shared memory."
        + _TOP_APPLICATION
        + " End the holder (pg_terminate_backend, on a connection that is already open) or "
        "raise max_locks_per_transaction (a restart).",
    )


def _nearly_full(w: RuleWriter, severity: str, share: str) -> Rule:
    v = w.v
    return w.alert(
        "PgLockTableNearlyFull",
        f"{_fill(w)} > {v.number(share)}",
        for_="lock_table_for",
        severity=severity,
        summary="The lock table of {{ $labels.target }} is {{ $value | humanizePercentage }} full",
        description="The shared lock table of {{ $labels.target }} holds "
        "{{ $value | humanizePercentage }} of its nominal capacity. When it is full, "
        "no session can take any lock (ERROR: out of shared memory). "
        f"Threshold {v.percent(share)}.",
    )


def _exhaustion_forecast(w: RuleWriter) -> Rule:
    # The time until the table's peak of the last `smoothing` reaches its capacity, at
    # the growth rate over the `window` of its lowest fill over `smoothing` (entries that
    # stay); a sawtooth of locks taken and released within one transaction has a flat
    # lowest fill, and grows nothing. It must still be growing (its lowest fill above the
    # one `smoothing` earlier), and fuller than `min_fill`.
    v = w.v
    smoothing = v.duration("lock_table_forecast_smoothing")
    window = v.duration("lock_table_forecast_window")
    fill = f"({_fill(w)})"
    lowest = f"min_over_time({fill}[{smoothing}:1m])"
    return w.alert(
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


def _backend_over_lock_budget(w: RuleWriter) -> Rule:
    v = w.v
    return w.alert(
        "PgAdvisoryBackendOverLockBudget",
        f"{w.sel('pg_advisory_backend_locks_max')} > on {w.by(*SERVER)} "
        f"group_left () ({v.number('backend_lock_budget')} * "
        f"{w.sel('pg_advisory_max_locks_per_transaction')})",
        for_="backend_lock_budget_for",
        severity="warning",
        summary=f"A backend of {APP} holds {VALUE} advisory locks",
        description=f"A backend of {APP} {WHERE} holds {VALUE} advisory locks, "
        f"more than {v.number('backend_lock_budget')} x max_locks_per_transaction, "
        "the average lock budget of a backend: a lock per row instead of per batch "
        "fills the lock table.",
    )
