"""One vocabulary: a backend's state, lock modes, level and stranded locks named alike by the
metrics, `check` and /locks (durations: test_durations.py)."""

from __future__ import annotations

import ast
from dataclasses import replace
from ipaddress import ip_network
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support import IDLE, snapshot_of

from pg_advisory_exporter.collect import vocabulary
from pg_advisory_exporter.collect.databases import Databases
from pg_advisory_exporter.collect.poolers import PoolerView
from pg_advisory_exporter.collect.series import server_samples
from pg_advisory_exporter.collect.vocabulary import (
    MODES,
    certainly_session_level,
    format_age,
    state_word,
)
from pg_advisory_exporter.forensics.read import backend_from_row
from pg_advisory_exporter.keys.key import BIGINT_KEY
from pg_advisory_exporter.keys.registry import NO_KEYS
from pg_advisory_exporter.metrics import Sample

# pg_stat_activity.state, and the `state` label the README publishes for each.
STATES = {
    "active": "active",
    "idle": "idle",
    "idle in transaction": "idle_in_transaction",
    "idle in transaction (aborted)": "idle_in_transaction_aborted",
    "fastpath function call": "fastpath_function_call",
    "disabled": "disabled",
}


def test_ages_are_rounded_for_people_and_unknown_where_hidden() -> None:
    assert [format_age(s) for s in (None, 0.04, 0.3, 4.26, 12.0, 59.99, 3725.4, 90000.0)] == [
        "unknown", "0s", "0.3s", "4.3s", "12s", "1m", "1h2m5s", "1d1h",
    ]  # fmt: skip


def test_lock_modes_are_spelled_in_the_vocabulary_only() -> None:
    """Elsewhere the package names them (EXCLUSIVE_LOCK, SHARE...); SQL text may spell them."""
    package = Path(vocabulary.__file__).resolve().parent.parent
    spelled = {
        f"{path.relative_to(package)}:{node.lineno} {node.value!r}"
        for path in sorted(package.rglob("*.py"))
        if path.name != "vocabulary.py"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and node.value in (*MODES, *MODES.values())
    }
    assert not spelled


@pytest.mark.parametrize(("state", "word"), STATES.items())
def test_every_state_has_its_published_word(state: str, word: str) -> None:
    assert state_word(state, outside_transaction=False) == word
    assert state_word(state, outside_transaction=True) == word


def test_a_hidden_state_is_idle_only_outside_a_transaction() -> None:
    assert state_word(None, outside_transaction=True) == "idle"
    assert state_word(None, outside_transaction=False) == "unknown"


@pytest.mark.parametrize("state", [*STATES, None])
def test_the_leak_signal_watches_the_states_the_readme_names(state: str | None) -> None:
    # pg_advisory_idle_holder_max_seconds is for holders that finished their work: `idle`
    # and `idle_in_transaction(_aborted)` (README). A word misspelt in IDLE_STATES, or the
    # server's own spelling ("idle in transaction") tested instead of the word, would leave
    # a leaked lock of that state out of the signal.
    in_transaction = state not in ("idle", None)
    holder = replace(IDLE, state=state, in_transaction=in_transaction, state_seconds=60.0)
    samples = server_samples("main", snapshot_of(holder), [], 100).samples
    watched = _value(samples, "pg_advisory_idle_holder_max_seconds")
    word = "idle" if state is None else STATES[state]
    leaks = {"idle", "idle_in_transaction", "idle_in_transaction_aborted"}
    assert watched == ({("main", "app", "billing-worker", word): 60.0} if word in leaks else {})


@pytest.mark.parametrize(
    ("state", "outside", "certain"),
    [
        ("idle", False, True),  # between transactions: no transaction-level lock can exist
        (None, True, True),  # hidden state, but no virtual transaction of its own
        ("active", True, True),
        ("active", False, False),  # inside a transaction: either kind
        ("idle in transaction", False, False),
        (None, False, False),
    ],
)
def test_session_level_certainty_cases(state: str | None, outside: bool, certain: bool) -> None:
    assert certainly_session_level(outside, state) is certain


def _forensics_row(state: str | None, outside: bool) -> dict[str, Any]:
    """One holder of key 1, as the /locks statement returns it."""
    return {
        "pid": 1, "lock_entries": 1, "datid": 5, "application_name": "billing-worker",
        "locks": [[5, 0, 1, BIGINT_KEY, "ExclusiveLock", True, None, None]],
        "outside_transaction": outside, "client_addr": "10.0.0.7", "client_port": 41000,
        "backend_start": None, "state": state, "state_seconds": None, "xact_start": None,
        "backend_start_unix": None, "xact_start_unix": None, "now_unix": 1_800_000_000.0,
        "caller_text": None,
    }  # fmt: skip


def _value(samples: list[Sample], name: str) -> dict[tuple[str, ...], float]:
    return {s.labels: s.value for s in samples if s.name == name}


@given(
    st.sampled_from([*STATES, None]),
    st.booleans(),
    st.sampled_from(["session", "transaction", "statement"]),
)
def test_metrics_and_forensics_name_a_backend_alike(
    state: str | None, outside: bool, pool_mode: str
) -> None:
    """The metrics read a backend from the collection, `check` and /locks from the forensics
    statement: the same backend gets the same state word and the same stranded verdict."""
    views = [PoolerView("pgb", networks=(ip_network("10.0.0.0/24"),), pool_mode=pool_mode)]
    collected = replace(
        IDLE, state=state, in_transaction=not outside, client_addr="10.0.0.7", client_port=41000
    )
    samples = server_samples("main", snapshot_of(collected), [], 100, poolers=views).samples
    [(*_, label)] = _value(samples, "pg_advisory_holders")
    read = backend_from_row(
        _forensics_row(state, outside), NO_KEYS, views, databases=Databases({5: "app"})
    )
    assert read.state_word == label
    stranded = _value(samples, "pg_advisory_pooled_session_locks")
    assert read.stranded == (sum(stranded.values()) > 0)
    assert read.held[0].mode == "exclusive"
