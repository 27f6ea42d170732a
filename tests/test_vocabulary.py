"""One vocabulary: durations written as Prometheus writes them and read back, and a backend's
state, lock modes, level and stranded locks named alike by the metrics, `check` and /locks."""

from __future__ import annotations

import re
from dataclasses import replace
from ipaddress import ip_network
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support import IDLE, snapshot_of

from pg_advisory_exporter.collect.poolers import PoolerView
from pg_advisory_exporter.collect.series import server_samples
from pg_advisory_exporter.collect.vocabulary import (
    certainly_session_level,
    format_age,
    state_word,
)
from pg_advisory_exporter.forensics.read import backend_from_row
from pg_advisory_exporter.keys.key import BIGINT_KEY
from pg_advisory_exporter.keys.registry import NO_KEYS
from pg_advisory_exporter.metrics import Sample
from pg_advisory_exporter.schema import format_duration, parse_duration

# Prometheus' model.ParseDuration, without the years and weeks it never writes for these.
PROMETHEUS_DURATION = re.compile(r"(\d+d)?(\d+h)?(\d+m)?(\d+s)?(\d+ms)?")
# pg_stat_activity.state, and the `state` label the README publishes for each.
STATES = {
    "active": "active",
    "idle": "idle",
    "idle in transaction": "idle_in_transaction",
    "idle in transaction (aborted)": "idle_in_transaction_aborted",
    "fastpath function call": "fastpath_function_call",
    "disabled": "disabled",
}
MILLISECONDS = st.integers(min_value=0, max_value=10**12)


def _read(text: str) -> float:
    seconds = parse_duration(text)
    assert isinstance(seconds, float)
    return seconds


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(900, "15m"), (90, "1m30s"), (0.5, "500ms"), (0, "0s"), (86400 + 61, "1d1m1s"),
     (3725.4, "1h2m5s400ms"), (0.0004, "0s"), (0.0015, "2ms")],
)  # fmt: skip
def test_durations_are_written_as_prometheus_writes_them(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@given(MILLISECONDS)
def test_a_written_duration_reads_back(milliseconds: int) -> None:
    text = format_duration(milliseconds / 1000)
    assert PROMETHEUS_DURATION.fullmatch(text)
    assert text != ""
    assert round(_read(text) * 1000) == milliseconds


@given(MILLISECONDS, st.sampled_from([1, 100, 1000, 60_000]))
def test_a_rounded_duration_is_a_multiple_of_its_resolution(milliseconds: int, step: int) -> None:
    written = round(_read(format_duration(milliseconds / 1000, step / 1000)) * 1000)
    assert written % step == 0
    assert abs(written - milliseconds) <= step / 2


def test_ages_are_rounded_for_people_and_unknown_where_hidden() -> None:
    assert [format_age(s) for s in (None, 0.04, 4.26, 59.99, 3725.4, 90000.0)] == [
        "unknown", "0s", "4s300ms", "1m", "1h2m5s", "1d1h",
    ]  # fmt: skip


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
        "pid": 1, "lock_entries": 1, "datname": "app", "application_name": "billing-worker",
        "locks": [[5, 0, 1, BIGINT_KEY, "ExclusiveLock", True, None, None]],
        "outside_transaction": outside, "client_addr": "10.0.0.7", "client_port": 41000,
        "backend_start": None, "state": state, "state_seconds": None, "xact_start": None,
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
    read = backend_from_row(_forensics_row(state, outside), NO_KEYS, views)
    assert read.state_word == label
    stranded = _value(samples, "pg_advisory_pooled_session_locks")
    assert read.stranded == (sum(stranded.values()) > 0)
    assert read.held[0].mode == "exclusive"
