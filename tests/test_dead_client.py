"""How long a server lets a dead or stuck client's session keep its locks, from its settings
(pure: the settings as a server reports them; tests/test_hygiene.py reads them off real
servers)."""

from __future__ import annotations

import dataclasses
import math

import pytest
from support import IDLE, snapshot_of

from pg_advisory_exporter.collect.dead_client import (
    ReleaseSettings,
    dead_client_release_seconds,
    idle_in_transaction_release_seconds,
    keepalive_seconds,
)
from pg_advisory_exporter.collect.series import server_samples

LINUX = ReleaseSettings(7200, 75, 9, 0, 0.0, 0.0)


@pytest.mark.parametrize(
    ("idle", "interval", "count", "user_timeout_ms", "expected"),
    [
        (7200, 75, 9, 0, 7875),  # Linux's defaults: over two hours
        (60, 10, 6, 0, 120),
        # tcp_user_timeout: the first tick past it, once a probe is out; the count is ignored
        (60, 10, 6, 95_000, 100),
        (60, 10, 6, 100_000, 100),
        (60, 10, 6, 100_001, 110),
        (60, 10, 6, 1_000, 70),  # shorter than idle: the tick after the first probe
        (7200, 75, 9, 30_000, 7275),  # does not shorten the idle time before the first probe
    ],
)
def test_keepalives_drop_a_silent_connection_as_linux_does(
    idle: int, interval: int, count: int, user_timeout_ms: int, expected: float
) -> None:
    settings = ReleaseSettings(idle, interval, count, user_timeout_ms, 0.0, 0.0)
    assert keepalive_seconds(settings) == expected


def test_idle_session_timeout_ends_an_idle_session_first_if_shorter() -> None:
    assert dead_client_release_seconds(dataclasses.replace(LINUX, idle_session_timeout=600)) == 600
    quick = ReleaseSettings(60, 10, 6, 0, 3600.0, 0.0)
    assert dead_client_release_seconds(quick) == 120


def test_an_idle_transaction_is_bounded_by_its_timeout_only() -> None:
    assert idle_in_transaction_release_seconds(LINUX) == math.inf
    bounded = dataclasses.replace(LINUX, idle_in_transaction_session_timeout=30.0)
    assert idle_in_transaction_release_seconds(bounded) == 30


def test_configured_zeros_are_linuxs_defaults() -> None:
    assert ReleaseSettings(0, 0, 0, 0, 0.0, 0.0).configured() == LINUX
    assert ReleaseSettings(60, 0, 3, 0, 0.0, 0.0).configured() == ReleaseSettings(
        60, 75, 3, 0, 0.0, 0.0
    )


def test_the_server_series_count_holders_outside_a_transaction_once_per_server() -> None:
    inside = dataclasses.replace(IDLE, pid=2, state="idle in transaction", in_transaction=True)
    elsewhere = dataclasses.replace(IDLE, pid=3, datname="other")
    waiting = dataclasses.replace(IDLE, pid=4, advisory_entries=1, awaited_mode="ExclusiveLock")
    snapshot = snapshot_of(IDLE, inside, elsewhere, waiting)

    def found(**scope: object) -> dict[str, float]:
        samples = server_samples("main", snapshot, [], 100, **scope).samples  # type: ignore[arg-type]
        names = ("pg_advisory_idle_session_holders", "pg_advisory_dead_client_release_seconds",
                 "pg_advisory_idle_in_transaction_release_seconds")  # fmt: skip
        return {s.name: s.value for s in samples if s.name in names}

    assert found() == {
        "pg_advisory_idle_session_holders": 2,  # a waiter that holds nothing is not one
        "pg_advisory_dead_client_release_seconds": 7875,
        "pg_advisory_idle_in_transaction_release_seconds": math.inf,
    }
    # A probe of one database: the server's series are its server target's, all databases.
    assert found(database="app", server_wide=False) == {}
    assert found(database="app")["pg_advisory_idle_session_holders"] == 2


def test_a_platform_without_keepalive_settings_exports_no_bound() -> None:
    unknown = dataclasses.replace(snapshot_of(IDLE), release_settings=ReleaseSettings(
        -1, -1, -1, 0, 0.0, 0.0
    ))  # fmt: skip
    names = {s.name for s in server_samples("main", unknown, [], 100).samples}
    assert "pg_advisory_dead_client_release_seconds" not in names
    assert "pg_advisory_idle_session_holders" in names
