"""Mapping a snapshot to the contract's series, without a server."""

from __future__ import annotations

from dataclasses import replace

import pytest
from support import IDLE, snapshot_of

from pg_advisory_exporter.collect.series import server_samples
from pg_advisory_exporter.collect.snapshot import ExtensionLocks
from pg_advisory_exporter.keys.appnames import RewriteRule
from pg_advisory_exporter.keys.key_config import KeyConfig
from pg_advisory_exporter.keys.registry import Registry
from pg_advisory_exporter.metrics import SPECS, Sample


def _values(samples: list[Sample], name: str) -> dict[tuple[str, ...], float]:
    return {s.labels: s.value for s in samples if s.name == name}


def test_every_sample_matches_its_spec() -> None:
    waiter = replace(IDLE, pid=2, state="active", awaited_mode="ShareLock", wait_seconds=2.0)
    extension = (ExtensionLocks("app", "citus", held=1, awaited=0),)
    snapshot = replace(snapshot_of(IDLE, waiter), extension_locks=extension)
    samples = server_samples("main", snapshot, [], 100).samples
    # The series of a holder, a waiter and an extension's lock, at least: a list that lost
    # them would pass the check below on what is left.
    assert {s.name for s in samples} >= {
        "pg_advisory_up",
        "pg_advisory_locks",
        "pg_advisory_holders",
        "pg_advisory_waiters",
        "pg_advisory_wait_max_seconds",
        "pg_advisory_idle_holder_max_seconds",
        "pg_advisory_extension_locks",
    }
    for sample in samples:
        assert len(sample.labels) == len(SPECS[sample.name].labels), sample


def test_extensions_locks_are_summed_by_database_extension_and_grant() -> None:
    extension_locks = (
        ExtensionLocks("app", "citus", held=3, awaited=1),
        ExtensionLocks("app", "citus", held=2, awaited=0),
        ExtensionLocks("other", "timescaledb", held=1, awaited=0),
    )
    snapshot = replace(snapshot_of(IDLE), extension_locks=extension_locks)
    samples = server_samples("main", snapshot, [], 100).samples
    assert _values(samples, "pg_advisory_extension_locks") == {
        ("main", "app", "citus", "true"): 5,
        ("main", "app", "citus", "false"): 1,
        ("main", "other", "timescaledb", "true"): 1,
    }
    one = server_samples("main", snapshot, [], 100, database="other").samples
    assert _values(one, "pg_advisory_extension_locks") == {
        ("main", "other", "timescaledb", "true"): 1
    }


def test_a_waiting_backend_is_a_waiter_not_a_holder() -> None:
    waiter = replace(
        IDLE, pid=2, state="active", advisory_entries=3, share_entries=1,
        awaited_mode="ShareLock", wait_seconds=2.5,
    )  # fmt: skip
    samples = server_samples("main", snapshot_of(waiter), [], 100).samples
    group = ("main", "app", "billing-worker")
    assert _values(samples, "pg_advisory_locks") == {
        (*group, "exclusive", "true"): 2,
        (*group, "share", "false"): 1,
    }
    assert _values(samples, "pg_advisory_waiters") == {group: 1}
    assert _values(samples, "pg_advisory_wait_max_seconds") == {group: 2.5}
    assert _values(samples, "pg_advisory_holders") == {(*group, "active"): 1}
    assert _values(samples, "pg_advisory_idle_holder_max_seconds") == {}


def test_only_a_waiting_backend_holds_nothing() -> None:
    waiter = replace(IDLE, state="active", awaited_mode="ExclusiveLock", wait_seconds=1.0)
    samples = server_samples("main", snapshot_of(waiter), [], 100).samples
    assert _values(samples, "pg_advisory_holders") == {}
    assert _values(samples, "pg_advisory_backend_locks_max") == {
        ("main", "app", "billing-worker"): 0
    }


def test_idle_ages_are_the_longest_per_state() -> None:
    older = replace(IDLE, pid=2, state_seconds=900.0)
    in_tx = replace(
        IDLE, pid=3, state="idle in transaction", state_seconds=30.0, in_transaction=True
    )
    samples = server_samples("main", snapshot_of(IDLE, older, in_tx), [], 100).samples
    group = ("main", "app", "billing-worker")
    assert _values(samples, "pg_advisory_idle_holder_max_seconds") == {
        (*group, "idle"): 900.0,
        (*group, "idle_in_transaction"): 30.0,
    }
    assert _values(samples, "pg_advisory_holders") == {
        (*group, "idle"): 2,
        (*group, "idle_in_transaction"): 1,
    }


@pytest.mark.parametrize(
    ("state", "in_transaction", "label"),
    [
        ("idle in transaction (aborted)", True, "idle_in_transaction_aborted"),
        ("fastpath function call", True, "fastpath_function_call"),
        (None, False, "idle"),  # hidden, but outside any transaction
        (None, True, "unknown"),  # hidden, inside a transaction
    ],
)
def test_state_labels(state: str | None, in_transaction: bool, label: str) -> None:
    backend = replace(IDLE, state=state, in_transaction=in_transaction)
    samples = server_samples("main", snapshot_of(backend), [], 100).samples
    assert _values(samples, "pg_advisory_holders") == {("main", "app", "billing-worker", label): 1}


def test_rewrite_then_cap_and_folded_count() -> None:
    pods = [
        replace(IDLE, pid=i, application_name=f"cron-5f6d7c8b9{i}-abcde", advisory_entries=5)
        for i in range(3)
    ]
    small = [replace(IDLE, pid=10 + i, application_name=f"tool-{i}") for i in range(3)]
    rule = RewriteRule.compile(r"(.+)-[0-9a-f]{10}-[a-z]{5}", r"\1")
    result = server_samples("main", snapshot_of(*pods, *small), [rule], 2)
    holders = _values(result.samples, "pg_advisory_holders")
    assert holders == {("main", "app", "cron", "idle"): 3, ("main", "app", "__other__", "idle"): 3}
    assert result.folded_application_names == 3


def test_server_series() -> None:
    samples = server_samples("main", snapshot_of(IDLE), [], 100).samples
    assert _values(samples, "pg_advisory_lock_table_capacity") == {("main",): 7808}
    assert _values(samples, "pg_advisory_deadlocks_total") == {("main", "app"): 3}
    assert _values(samples, "pg_advisory_server_info") == {("main", "15.18"): 1}


# The series that describe the whole server: on its server target only (see Target).
SERVER_WIDE = {
    "pg_advisory_server_info",
    "pg_advisory_lock_table_entries",
    "pg_advisory_lock_table_capacity",
    "pg_advisory_lock_table_backend_entries_max",
}


def test_a_database_target_answers_for_its_database_only() -> None:
    elsewhere = replace(IDLE, pid=2, datname="billing", application_name="leader")
    snapshot = replace(snapshot_of(IDLE, elsewhere), deadlocks={"app": 3, "billing": 1})
    whole = server_samples("main", snapshot, [], 100).samples
    app = server_samples("main/app", snapshot, [], 100, database="app").samples
    billing = server_samples(
        "main/billing", snapshot, [], 100, database="billing", server_wide=False
    ).samples
    # Each lock once: the database targets split what the whole-server target counts.
    locks = [_values(s, "pg_advisory_locks") for s in (whole, app, billing)]
    assert sum(locks[0].values()) == sum(locks[1].values()) + sum(locks[2].values()) == 2
    assert {labels[1] for labels in locks[1]} == {"app"}
    assert {labels[1] for labels in locks[2]} == {"billing"}
    assert _values(billing, "pg_advisory_deadlocks_total") == {("main/billing", "billing"): 1}
    # The server's own series where server_wide says so, and the settings everywhere.
    assert {s.name for s in app} >= SERVER_WIDE
    assert not SERVER_WIDE & {s.name for s in billing}
    for samples in (whole, app, billing):
        assert {s.name for s in samples} >= {
            "pg_advisory_up",
            "pg_advisory_max_locks_per_transaction",
        }


def test_an_expected_key_is_expected_in_the_database_a_target_names() -> None:
    registry = Registry.resolve(
        [KeyConfig(name="leader", key=42, expect_held=True)], lambda texts, seeds: []
    )
    snapshot = snapshot_of(IDLE)
    whole = server_samples("main", snapshot, [], 100, registry).samples
    orders = server_samples("main/orders", snapshot, [], 100, registry, database="orders").samples
    # Nobody holds it: 0 where the target looks (the connection's database, or its own).
    assert _values(whole, "pg_advisory_key_holders") == {("main", "app", "leader"): 0}
    assert _values(orders, "pg_advisory_key_holders") == {("main/orders", "orders", "leader"): 0}
