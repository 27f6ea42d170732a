"""The `check` report: its layout from a read built in the test, and the real command as text
and as JSON against a real server."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from dataclasses import replace
from ipaddress import ip_network
from pathlib import Path

import pytest
from support import (
    BACKEND_START,
    IDLE,
    REFUSED_DSN,
    Cli,
    Session,
    block_on,
    forensic_backend,
    snapshot_of,
    write_config,
)

from devtools.embedded_postgres import EmbeddedPostgres
from pg_advisory_exporter.collect.poolers import PoolerView
from pg_advisory_exporter.forensics.blocking import assemble
from pg_advisory_exporter.forensics.model import Backend, LockEntry
from pg_advisory_exporter.keys.key import BIGINT_KEY, INT_PAIR_KEY, AdvisoryKey
from pg_advisory_exporter.keys.registry import NO_KEYS
from pg_advisory_exporter.report import Checked, print_report

# Version-independent (tests/conftest.py): the `check` command and its layout; the statement it
# shares with /locks runs on every version in test_locks_page.py.
pytestmark = pytest.mark.any_version


def _held(*keys: AdvisoryKey) -> tuple[LockEntry, ...]:
    return tuple(LockEntry(5, key, "exclusive", granted=True) for key in keys)


def _report(*backends: Backend, privileged: bool = True) -> str:
    out = io.StringIO()
    snapshot = replace(snapshot_of(IDLE), can_read_all_stats=privileged)
    forensics = assemble("main", backends)
    print_report(Checked("main", "monitor", snapshot, NO_KEYS, forensics), out)
    return out.getvalue()


def _line(text: str, pid: int) -> str:
    return next(line for line in text.splitlines() if line.strip().startswith(f"{pid} "))


def test_holders_longest_in_their_state_first_and_capped() -> None:
    holders = [
        forensic_backend(
            100 + i, *_held(AdvisoryKey(BIGINT_KEY, (i,))), state_seconds=float(25 - i)
        )
        for i in range(25)
    ]
    text = _report(*holders)
    rows = [line.split() for line in text.splitlines() if line.strip().startswith("1")]
    assert [row[0] for row in rows[:2]] == ["100", "101"]  # in the read's order: the oldest first
    assert "Holders (25)" in text
    assert "... and 5 more" in text
    assert all(line == line.rstrip() for line in text.splitlines())


def test_waiters_blockers_clients_poolers_levels_and_missing_grant() -> None:
    in_tx = forensic_backend(
        7, *_held(AdvisoryKey(INT_PAIR_KEY, (2001, -5)), AdvisoryKey(BIGINT_KEY, (1,))),
        state="idle in transaction", state_seconds=30.0, session_level=False, lock_entries=3,
        held_seconds=95.0, held_at_least=True,
    )  # fmt: skip
    hidden = forensic_backend(
        6, *_held(AdvisoryKey(BIGINT_KEY, (9,))), state=None, state_seconds=None,
        client_addr=None, client_port=None,
    )  # fmt: skip
    blocker = forensic_backend(5, LockEntry(5, AdvisoryKey(BIGINT_KEY, (-1,)), "exclusive", True))
    waiter = forensic_backend(
        8,
        LockEntry(5, AdvisoryKey(BIGINT_KEY, (-1,)), "share", False, BACKEND_START, 75.0),
        state="active",
    )
    pooler = PoolerView("pgb", networks=(ip_network("10.0.0.0/24"),), pool_mode="transaction")
    pooled = replace(blocker, pooled=pooler.owner(5, "10.0.0.7", 40005))
    text = _report(in_tx, hidden, pooled, waiter, privileged=False)
    assert 'GRANT pg_read_all_stats TO "monitor"' in text
    holder = _line(text, 7)
    assert holder.split()[3:5] == ["idle_in_transaction", "30s"]  # the words of the metrics
    assert "  at least 1m35s  " in holder  # held since before the exporter looked
    assert "(2001, -5) (+2 more)" in holder
    assert "10.0.0.7:40007" in holder
    assert holder.endswith("session or transaction")  # pg_locks cannot tell inside a transaction
    outside = _line(text, 6)
    # Hidden state, but outside any transaction: idle; the age and the client are hidden.
    assert outside.split()[3:] == ["idle", "unknown", "-", "9", "-", "-", "-", "session"]
    assert _line(text, 5).split()[-4:] == ["pgb", "transaction", "STRANDED", "session"]
    waiting = _line(text, 8)
    assert waiting.split()[3:10] == ["1m15s", "-1", "-", "share", "5", "-", "10.0.0.7:40008"]
    assert "Contended keys (1)" in text
    assert "5:exclusive" in text


@pytest.fixture
def held_and_awaited(pg: EmbeddedPostgres, session: Session) -> Iterator[tuple[int, int]]:
    """A holder of key 4242, idle, and a waiter for it: their pids."""
    holder = session("billing-worker")
    holder.execute("SELECT pg_advisory_lock(4242)")
    waiter = session("billing-waiter")
    blocked = block_on(pg, waiter, "SELECT pg_advisory_lock(4242)")
    yield holder.info.backend_pid, waiter.info.backend_pid
    holder.execute("SELECT pg_advisory_unlock(4242)")
    blocked.join(timeout=10)


def test_check_as_text_and_json(
    tmp_path: Path,
    pg: EmbeddedPostgres,
    monitor_dsn: str,
    cli: Cli,
    held_and_awaited: tuple[int, int],
) -> None:
    holder_pid, waiter_pid = held_and_awaited
    with pg.connect() as conn:  # a risky statement for check's read of pg_stat_statements
        conn.execute("SELECT pg_advisory_xact_lock(hashtext('nightly')) AS report_key")
    config = {
        "keys": [{"name": "billing_batch", "key": 4242}],
        "targets": [{"name": "main", "dsn": monitor_dsn}],
    }
    path = write_config(tmp_path, config)

    text = cli("check", "--config.file", str(path), check=True).stdout
    waiter = _line(text, waiter_pid)
    assert "'billing-waiter'" in waiter
    assert f" billing_batch  exclusive  {holder_pid} " in waiter
    holder = _line(text, holder_pid)
    assert "billing_batch" in holder
    assert "127.0.0.1:" in holder
    assert holder.endswith(" session")

    result = cli("check", "--format", "json", "--config.file", str(path), check=True)
    [target] = json.loads(result.stdout)
    assert target["target"] == "main"
    with pg.connect() as conn:
        shown = conn.execute("SHOW server_version").fetchone()
    assert shown is not None
    assert target["server_version"] == shown[0].split()[0]  # 15.18, or 19rc1 before a release
    assert target["can_read_all_stats"] is True
    assert target["grant"] is None
    assert target["lock_table_entries"] >= 2
    assert target["lock_table_capacity"] > target["lock_table_entries"]
    [waits] = target["waiters"]
    assert (waits["pid"], waits["blocked_by"]) == (waiter_pid, [holder_pid])
    [holds] = [h for h in target["holders"] if h["pid"] == holder_pid]
    assert holds["session_level"] is True
    assert holds["locks"][0]["key_name"] == "billing_batch"
    assert holds["client_addr"] == "127.0.0.1"
    assert target["contended_keys"][0]["key"] == "4242"
    assert "query" not in holds
    # The risky statements once, where check reads them: its hygiene section.
    assert "risky_statements" not in target
    statements = target["hygiene"]["risky_statements"]
    assert statements["error"] is None, statements
    [hashed] = [s for s in statements["statements"] if "report_key" in s["statement"]]
    assert hashed["rules"] == ["hashtext_key"], hashed

    down = write_config(tmp_path, {"targets": [{"name": "gone", "dsn": REFUSED_DSN}]}, "down.yaml")
    result = cli("check", "--format", "json", "--config.file", str(down))
    assert result.returncode == 1
    assert json.loads(result.stdout)[0]["target"] == "gone"
    assert "error" in json.loads(result.stdout)[0]


def test_names_as_the_series_give_them_and_likely_leaks() -> None:
    leaked = forensic_backend(
        7, *_held(AdvisoryKey(BIGINT_KEY, (1,))), state_seconds=3600.0,
        application_name="billing-worker-7d9f", rewritten_name="billing-worker-*",
    )  # fmt: skip
    fresh = forensic_backend(8, *_held(AdvisoryKey(BIGINT_KEY, (2,))), state_seconds=5.0)
    text = _report(leaked, fresh)
    assert "'billing-worker-*' (set as 'billing-worker-7d9f')  idle LEAKED?  1h" in _line(text, 7)
    assert "LEAKED?" not in _line(text, 8)
    assert "(set as" not in _line(text, 8)
    assert "LEAKED?: idle over the leak alert's 15m" in text
