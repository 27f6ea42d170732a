"""What the server's version adds to the collection (collect/reads.py), on a real server of
each version: PostgreSQL 19 counts advisory lock waits itself (pg_stat_lock), older servers are
never asked for it."""

from __future__ import annotations

import time

import psycopg
import pytest
from support import (
    PG_MAJOR,
    OneTarget,
    RunningExporter,
    Scrape,
    Session,
    StartExporter,
    block_on,
)

from devtools.embedded_postgres import EmbeddedPostgres

WAITS = "pg_advisory_server_lock_waits_total"
WAITED = "pg_advisory_server_lock_wait_seconds_total"


def _counted(scrape: Scrape) -> tuple[float, float]:
    return scrape.value(WAITS, target="main"), scrape.value(WAITED, target="main")


def _settled(exporter: RunningExporter) -> tuple[float, float]:
    """The counts once every backend has reported what it did until now: a backend sends its
    statistics at most once a second (PGSTAT_MIN_INTERVAL), and a scrape past the exporter's
    min_interval collects anew."""
    time.sleep(1.5)
    return _counted(exporter.scrape())


def _stable(exporter: RunningExporter) -> tuple[float, float]:
    """The counts once they stop changing: two reads 1.1s apart that agree (a backend that
    lost a race to flush tries again after up to 10s, PGSTAT_IDLE_INTERVAL)."""
    deadline = time.monotonic() + 30
    last = _counted(exporter.scrape())
    while True:
        time.sleep(1.1)
        now = _counted(exporter.scrape())
        if now == last:
            return now
        assert time.monotonic() < deadline, f"the server's counts never settled: {now}"
        last = now


def test_the_server_counts_a_granted_wait_and_not_one_given_up(
    start_exporter: StartExporter,
    one_target: OneTarget,
    monitor_dsn: str,
    pg: EmbeddedPostgres,
    session: Session,
) -> None:
    exporter = start_exporter(config=one_target(monitor_dsn, min_interval="50ms"))
    first = exporter.scrape_until(lambda s: s.value("pg_advisory_up", target="main") == 1)
    if PG_MAJOR < 19:
        # Not read at all: no series, and the statement never named the view.
        assert first.find(WAITS) == first.find(WAITED) == []
        return
    # The counts are the whole server's, and earlier tests' backends report theirs late: the
    # baseline is read once they have (they no longer change).
    before = _stable(exporter)
    holder = session("holder")
    holder.execute("SELECT pg_advisory_lock(4242)")

    # A wait past deadlock_timeout (100ms here) that is then granted: counted, with its time.
    waiter = session("waiter")
    waiter.execute("SET deadlock_timeout = '100ms'")
    blocked = block_on(pg, waiter, "SELECT pg_advisory_lock(4242)")
    time.sleep(0.5)
    holder.execute("SELECT pg_advisory_unlock(4242)")
    blocked.join(timeout=10)
    assert not blocked.is_alive()
    counted = exporter.scrape_until(lambda s: _counted(s)[0] == before[0] + 1)
    waits, waited = _counted(counted)
    assert 0.4 <= waited - before[1] < 5

    # A wait ended by lock_timeout: never granted, never counted.
    quitter = session("quitter")
    quitter.execute("SET deadlock_timeout = '100ms'")
    quitter.execute("SET lock_timeout = '400ms'")
    with pytest.raises(psycopg.errors.LockNotAvailable):
        quitter.execute("SELECT pg_advisory_lock(4242)")  # the waiter holds it now
    # Whatever it counted reaches the shared statistics now, not at the backend's next flush.
    quitter.execute("SELECT pg_stat_force_next_flush()")
    assert _settled(exporter) == (waits, waited)
    # A try-lock never waits.
    assert quitter.execute("SELECT pg_try_advisory_lock(4242)").fetchone() == (False,)
    quitter.execute("SELECT pg_stat_force_next_flush()")
    assert _settled(exporter) == (waits, waited)
