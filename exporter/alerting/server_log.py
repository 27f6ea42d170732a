"""Alerts on what the server's log told between scrapes: unlocks of locks not held, a full table."""

from __future__ import annotations

from .rule_writer import APP, COUNT, HOLDER, SERVER, WHERE, Rule, RuleWriter


def _counted(
    w: RuleWriter, metric: str, window: str, threshold: str, by: tuple[str, ...] = HOLDER
) -> str:
    """More than `threshold` events of a logged counter within `window`, by holder (or
    `by`): those of a series that appeared within it too (a counter's series starts with
    its first event, and increase() needs a sample before it), where the log was read
    `window` ago already, so that a Prometheus without that history does not take every
    series for new. By job and target only: a replaced pod has another instance and pod.
    Each series counts once, its increase where it has one, else its value where it is
    new (`- 0` drops the name, so that the two are the same series to `or`)."""
    counter, grouping = w.sel(metric), w.by(*by)
    read_before = f"{w.sel('pg_advisory_log_up')} offset {window}"
    new = f"({counter} unless {counter} offset {window}) and on (job, target) {read_before}"
    each = f"(increase({counter}[{window}]) > 0) or ({new}) - 0"
    return f"sum by {grouping} ({each}) > {threshold}"


def server_log(w: RuleWriter) -> list[Rule]:
    """What the server's log told between scrapes: an unlock of a lock not held, a lock
    table that was full."""
    v = w.v
    unlocks, oom = (
        v.duration("unlocks_not_held_window"),
        v.duration("out_of_shared_memory_window"),
    )
    full = w.sel("pg_advisory_lock_table_full")
    return [
        w.alert(
            "PgAdvisoryUnlockNotHeld",
            _counted(
                w, "pg_advisory_log_unlocks_not_held_total", unlocks, v.number("unlocks_not_held")
            ),
            for_="",
            severity="warning",
            summary=f"{APP} unlocked advisory locks it did not hold",
            description=f"Sessions of {APP} {WHERE} unlocked advisory locks they did "
            f"not hold: {COUNT} in the last {unlocks} (threshold "
            f"{v.number('unlocks_not_held')}), as the server logged (you don't own a lock "
            "of type ...). The lock each meant to release is still held somewhere, most "
            "likely by another connection of a transaction pool; see "
            "pg_advisory_pooled_session_locks and the holders.",
        ),
        # The lock table is the server's: one page for it, whichever applications failed;
        # none where PgLockTableFull paged for it (the exporter saw the table full within
        # the window, or the window before: a refusal can follow the last full sample).
        w.alert(
            "PgLockTableOutOfSharedMemory",
            f"{_counted(w, 'pg_advisory_log_out_of_shared_memory_total', oom, '0', SERVER)} "
            f"unless on {w.by(*SERVER)} (max_over_time({full}[{oom}]) == 1 "
            f"or max_over_time({full}[{oom}] offset {oom}) == 1)",
            for_="",
            severity="critical",
            summary="The lock table of {{ $labels.target }} was full: statements could "
            "not take a lock",
            description="Statements on {{ $labels.target }} failed because the shared lock "
            f"table was full: {COUNT} in the last {oom}, as the server logged (ERROR: out "
            "of shared memory, a hint to raise max_locks_per_transaction). Queries have "
            "failed, whatever the table holds now; every lock type shares it. "
            "pg_advisory_log_out_of_shared_memory_total says which applications failed. "
            "It stays quiet where the exporter saw the table full: PgLockTableFull paged.",
        ),
    ]
