"""What the server's version adds to the collection (collect/versions.py), on a real server of
each version: PostgreSQL 19 counts advisory lock waits itself (pg_stat_lock), older servers are
never asked for it."""

from __future__ import annotations

import time

import psycopg
import pytest
from support import PG_MAJOR, OneTarget, Scrape, Session, StartExporter, block_on

from devtools.embedded_postgres import EmbeddedPostgres

WAITS = "pg_advisory_server_lock_waits_total"
WAITED = "pg_advisory_server_lock_wait_seconds_total"


def _counted(scrape: Scrape) -> tuple[float, float]:
    return scrape.value(WAITS, target="main"), scrape.value(WAITED, target="main")


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
    with pg.connect() as admin:
        admin.execute("SELECT pg_stat_reset_shared('lock')")
    before = _counted(exporter.scrape_until(lambda s: bool(s.find(WAITS))))
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
    time.sleep(0.2)  # past the exporter's min_interval: a new collection
    assert _counted(exporter.scrape()) == (waits, waited)
    # A try-lock never waits.
    assert quitter.execute("SELECT pg_try_advisory_lock(4242)").fetchone() == (False,)
    time.sleep(0.2)
    assert _counted(exporter.scrape()) == (waits, waited)
