"""The one-shot report's layout, from a snapshot built in the test."""

from __future__ import annotations

import io
from dataclasses import replace

from support import IDLE, snapshot_of

from pg_advisory_exporter.keys import BIGINT_KEY, INT_PAIR_KEY, AdvisoryKey
from pg_advisory_exporter.registry import NO_KEYS
from pg_advisory_exporter.report import format_seconds, print_report
from pg_advisory_exporter.snapshot import BackendLocks


def _report(*backends: BackendLocks, privileged: bool = True) -> str:
    out = io.StringIO()
    snapshot = replace(snapshot_of(*backends), can_read_all_stats=privileged)
    print_report("main", "monitor", snapshot, NO_KEYS, out)
    return out.getvalue()


def test_idle_holders_first_by_age_and_capped() -> None:
    holders = [
        replace(IDLE, pid=100 + i, state_seconds=float(i), held_key=AdvisoryKey(BIGINT_KEY, (i,)))
        for i in range(25)
    ]
    text = _report(*holders)
    rows = [line.split() for line in text.splitlines() if line.strip().startswith("1")]
    assert [row[0] for row in rows[:2]] == ["124", "123"]  # the oldest first
    assert "Idle holders (25)" in text
    assert "... and 5 more" in text
    assert all(line == line.rstrip() for line in text.splitlines())


def test_waiters_keys_levels_and_missing_grant() -> None:
    in_tx = replace(
        IDLE, pid=7, state="idle in transaction", state_seconds=30.0, in_transaction=True,
        held_key=AdvisoryKey(INT_PAIR_KEY, (2001, -5)), advisory_entries=3,
    )  # fmt: skip
    hidden = replace(
        IDLE, pid=6, state=None, state_seconds=None, held_key=AdvisoryKey(BIGINT_KEY, (9,))
    )
    waiter = replace(
        IDLE, pid=8, state="active", awaited_mode="ShareLock", wait_seconds=75.0,
        awaited_key=AdvisoryKey(BIGINT_KEY, (-1,)), held_key=None, advisory_entries=1,
    )  # fmt: skip
    text = _report(in_tx, hidden, waiter, privileged=False)
    assert 'GRANT pg_read_all_stats TO "monitor"' in text
    holder = next(line for line in text.splitlines() if line.strip().startswith("7 "))
    assert "(2001, -5) (+2 more)" in holder
    assert holder.endswith("session or transaction")  # pg_locks cannot tell inside a transaction
    outside = next(line for line in text.splitlines() if line.strip().startswith("6 "))
    assert outside.split()[3:] == ["idle", "unknown", "9", "-", "session"]  # the age is hidden
    waiting = next(line for line in text.splitlines() if line.strip().startswith("8 "))
    assert waiting.split()[3:] == ["1m15s", "-1", "-", "share"]


def test_format_seconds() -> None:
    assert format_seconds(None) == "unknown"
    assert format_seconds(4.25) == "4.2s"
    assert format_seconds(3725) == "1h2m5s"
    assert format_seconds(90000) == "1d1h"
