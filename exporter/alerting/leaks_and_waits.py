"""Alerts on holders and waiters: a leaked lock, an application idle by design past its bound, a
long wait, waiters piling up, deadlocks."""

from __future__ import annotations

from .rule_writer import AGE, APP, COUNT, HOLDER, SERVER, VALUE, WHERE, Rule, RuleWriter

ENTRY = "idle_by_design"


def leaks_and_waits(w: RuleWriter) -> list[Rule]:
    """A holder idle with its locks (a leak, or past its bound where it is idle by design), a
    long wait, waiters piling up."""
    v = w.v
    return [
        w.alert(
            "PgAdvisoryLockLeaked",
            f"max by {w.by(*HOLDER, 'state')} "
            f"({w.sel('pg_advisory_idle_holder_max_seconds')}) "
            f"> {v.seconds('leaked_lock_after')}",
            for_="leaked_lock_for",
            severity="critical",
            summary=f"A session of {APP} holds an advisory lock while {{{{ $labels.state }}}}",
            description=f"A backend of {APP} {WHERE} has held an advisory lock while "
            f"{{{{ $labels.state }}}} for {AGE}: most likely a leaked lock, which "
            "stops every later run that needs it. Threshold "
            f"{v.duration('leaked_lock_after')}.",
        ),
        w.alert(
            "PgAdvisoryIdleByDesignHeldTooLong",
            f"max by {w.by(*HOLDER, ENTRY)} ({w.sel('pg_advisory_idle_by_design_seconds')}) "
            f"> on {w.by(*SERVER, ENTRY)} group_left () "
            f"{w.sel('pg_advisory_idle_by_design_max_hold_seconds')}",
            for_="leaked_lock_for",
            severity="critical",
            summary=f"A session of {APP} has sat idle on its advisory locks for {AGE}",
            description=f"A backend of {APP} {WHERE} holds advisory locks on an idle "
            "connection by design (idle_by_design entry {{ $labels.idle_by_design }}), and has "
            f"been idle with them for {AGE}, longer than the entry's max_hold: the work it "
            "holds them for is stuck, or the lock has leaked.",
        ),
        w.alert(
            "PgAdvisoryLockWaitTooLong",
            f"{w.sel('pg_advisory_wait_max_seconds')} > {v.seconds('wait_after')}",
            for_="wait_for",
            severity="warning",
            summary=f"{APP} has waited {AGE} for an advisory lock",
            description=f"A backend of {APP} {WHERE} has been waiting for an advisory "
            f"lock for {AGE}; its holder may be stuck. Threshold {v.duration('wait_after')}.",
        ),
        w.alert(
            "PgAdvisoryLockWaitersPiling",
            f"sum by {w.by(*HOLDER)} ({w.sel('pg_advisory_waiters')}) > {v.number('waiters')}",
            for_="waiters_for",
            severity="warning",
            summary=f"{VALUE} backends of {APP} wait for advisory locks",
            description=f"{VALUE} backends of {APP} {WHERE} are waiting for advisory "
            f"locks, more than {v.number('waiters')} for {v.duration('waiters_for')}: work "
            "queues up "
            "behind one holder.",
        ),
    ]


def deadlocks(w: RuleWriter) -> Rule:
    """Deadlocks the server counted, per database."""
    v = w.v
    return w.alert(
        "PgAdvisoryDeadlocks",
        f"increase({w.sel('pg_advisory_deadlocks_total')}"
        f"[{v.duration('deadlocks_window')}]) > {v.number('deadlocks')}",
        for_="",
        severity="warning",
        summary="Deadlocks in database {{ $labels.datname }} on {{ $labels.target }}",
        description=f"{COUNT} deadlocks in database "
        "{{ $labels.datname }} on {{ $labels.target }} in the last "
        f"{v.duration('deadlocks_window')}: sessions take the same locks in different "
        "orders.",
        locks_page=False,
    )
