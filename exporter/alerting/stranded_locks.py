"""Alerts on session locks that outlive their client: in a transaction pool, or a dead client's."""

from __future__ import annotations

from .rule_writer import AGE, APP, HOLDER, SERVER, VALUE, WHERE, Rule, RuleWriter


def session_lock_in_transaction_pool(w: RuleWriter) -> Rule:
    return w.alert(
        "PgAdvisorySessionLockInTransactionPool",
        f"max by {w.by(*HOLDER, 'pooler', 'pool')} (max_over_time("
        f"{w.sel('pg_advisory_pooled_session_locks')}"
        f"[{w.v.duration('pooled_session_lock_gap')}])) > 0",
        for_="pooled_session_lock_for",
        severity="critical",
        summary=f"A session lock of {APP} is stranded in pool {{{{ $labels.pool }}}} "
        "of {{ $labels.pooler }}",
        description=f"{VALUE} session-level advisory lock entries of {APP} {WHERE} "
        "are held on a server connection of {{ $labels.pooler }} (pool "
        "{{ $labels.pool }}) that is pooled per transaction or statement: the client "
        "that took them is gone or no longer owns the connection, the next client "
        "handed it holds them too, and every other session fails to get them until "
        "the pooler closes that connection. Always a bug: use transaction-level locks, "
        "a session-mode pool, or a direct connection for that job.",
    )


def dead_client_keeps_locks(w: RuleWriter) -> Rule:
    """Session locks held on a server that would keep them long after their client died:
    both series are the server's (its settings, its idle holders), so it fires once per
    server however many of its databases are probed."""
    v = w.v
    return w.alert(
        "PgAdvisoryDeadClientKeepsLocks",
        f"max by {w.by(*SERVER)} ({w.sel('pg_advisory_dead_client_release_seconds')}) "
        f"> {v.seconds('dead_client_release_after')} "
        f"and on {w.by(*SERVER)} "
        f"max by {w.by(*SERVER)} ({w.sel('pg_advisory_idle_session_holders')}) > 0",
        for_="dead_client_release_for",
        severity="warning",
        summary=f"A dead client would keep its session locks on {{{{ $labels.target }}}} for {AGE}",
        description="Sessions on {{ $labels.target }} hold advisory locks outside any "
        "transaction (session locks: a leader's, a job's), and the server would notice "
        f"their client's death only after {AGE} (its TCP keepalives, tcp_user_timeout, "
        "idle_session_timeout): for that long nobody else could take those locks. "
        f"Threshold {v.duration('dead_client_release_after')}.",
        locks_page=False,
    )
