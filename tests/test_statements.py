"""The rare reads of pg_stat_statements without a server: when one is due, how its rows are
judged and counted, and the series they make (tests/test_hygiene.py reads a real server)."""

from __future__ import annotations

import io
import threading
from typing import Any

from support import IDLE, Clock, snapshot_of, wait_until

from pg_advisory_exporter.collect.pg_stat_statements import (
    OVER_LIMIT,
    READERS,
    SHOWN,
    Readers,
    Statements,
    StatementsRead,
    judged,
    statements_samples,
)
from pg_advisory_exporter.collect.scheduling import Priority, Task, Watchdog
from pg_advisory_exporter.config.collection import CollectionSettings
from pg_advisory_exporter.config.settings import TargetSettings
from pg_advisory_exporter.forensics.page_json import statements_json
from pg_advisory_exporter.hygiene.risky import Judge, Rule
from pg_advisory_exporter.report import Hygiene, print_hygiene

LIMITED = "SELECT pg_advisory_lock(id) FROM foo WHERE id > $1 LIMIT $2"
SAFE = "SELECT pg_advisory_lock(q.id) FROM (SELECT id FROM foo WHERE id > $1 LIMIT $2) AS q"
HASHED = "SELECT pg_advisory_lock(hashtext($1))"


def _row(query: str | None, datname: str = "app", calls: int = 1, **counts: int) -> dict[str, Any]:
    return {
        "datname": datname,
        "rolname": "app_user",
        "calls": calls,
        "query": query,
        "screened": counts.get("screened", 4),
    }


def test_rows_are_judged_counted_by_database_and_rule_and_shortened() -> None:
    rows = [
        _row(LIMITED, calls=30),
        _row(SAFE, calls=20),
        _row(HASHED, datname="billing", calls=10),
        _row("SELECT pg_advisory_lock(id) FROM foo WHERE id > $1 LIM", calls=5),  # cut
        _row(None, calls=1),  # too long: its text stayed on the server
    ]
    # 7 screened on the server, 5 of them sent (one without its text): each counted once.
    found = judged([{**row, "screened": 7} for row in rows], True, Judge(2.0))
    assert found.counts == {
        ("app", Rule.LOCK_IN_LIMITED_SCAN): 1,
        ("billing", Rule.HASHTEXT_KEY): 1,
    }
    assert [(r.datname, r.calls, r.rules) for r in found.risky] == [
        ("app", 30, frozenset({Rule.LOCK_IN_LIMITED_SCAN})),
        ("billing", 10, frozenset({Rule.HASHTEXT_KEY})),
    ]
    assert found.skipped == {"unparsable": 1, "too_long": 1, OVER_LIMIT: 2}
    assert found.texts == 4
    assert found.texts + found.skipped["too_long"] + found.skipped[OVER_LIMIT] == 7
    assert found.risky_total == 2


def test_at_most_shown_statements_are_kept_but_all_are_counted() -> None:
    rows = [_row(f"SELECT pg_advisory_lock(id) FROM t{n} LIMIT $1", screened=SHOWN + 5)
            for n in range(SHOWN + 5)]  # fmt: skip
    found = judged(rows, True, Judge(10.0))
    assert len(found.risky) == SHOWN
    assert found.risky_total == SHOWN + 5
    assert found.counts == {("app", Rule.LOCK_IN_LIMITED_SCAN): SHOWN + 5}


def _samples(
    read: StatementsRead | None, database: str | None = None, wide: bool = True
) -> set[tuple[str, tuple[str, ...], float]]:
    return {(s.name, s.labels, s.value) for s in statements_samples("main", read, database, wide)}


def test_the_series_of_a_read_by_scope() -> None:
    read = StatementsRead(
        counts={("app", Rule.LOCK_IN_WHERE): 2, ("billing", Rule.LOCK_IN_WHERE): 1},
        skipped={"unparsable": 3},
    )
    whole = _samples(read)
    assert ("pg_advisory_statements_up", ("main",), True) in whole
    assert ("pg_advisory_statements_skipped", ("main", "unparsable"), 3) in whole
    assert ("pg_advisory_statements_skipped", ("main", OVER_LIMIT), 0) in whole
    risky = {s for s in whole if s[0] == "pg_advisory_risky_statements"}
    assert risky == {
        ("pg_advisory_risky_statements", ("main", "", "lock_in_limited_scan"), 0),
        ("pg_advisory_risky_statements", ("main", "app", "lock_in_where"), 2),
        ("pg_advisory_risky_statements", ("main", "billing", "lock_in_where"), 1),
        ("pg_advisory_risky_statements", ("main", "", "hashtext_key"), 0),
    }
    # A probe of one database: its statements, 0 under its name, and nothing of the server's.
    assert _samples(read, "billing", wide=False) == {
        ("pg_advisory_risky_statements", ("main", "billing", "lock_in_limited_scan"), 0),
        ("pg_advisory_risky_statements", ("main", "billing", "lock_in_where"), 1),
        ("pg_advisory_risky_statements", ("main", "billing", "hashtext_key"), 0),
    }


def test_an_unreadable_pg_stat_statements_says_only_that() -> None:
    failed = StatementsRead(error="pg_stat_statements is not installed in this database")
    assert _samples(failed) == {("pg_advisory_statements_up", ("main",), False)}
    assert _samples(failed, "app", wide=False) == set()
    assert _samples(None) == set()


class _Pool:
    """Records what is queued, and runs nothing."""

    def __init__(self) -> None:
        self.queued: list[Task[Any]] = []

    def enqueue(self, tasks: list[tuple[Task[Any], object]]) -> None:
        self.queued += [task for task, _ in tasks]


def _statements(interval: float, pool: _Pool, clock: Clock) -> Statements:
    config = TargetSettings(
        name="main",
        dsn="host=192.0.2.1 dbname=postgres",
        collection=CollectionSettings(statements_interval=interval),
        catalog=False,
    )
    return Statements(config, Watchdog(), pool, clock)  # type: ignore[arg-type]


def test_a_read_is_queued_at_most_once_per_interval_and_never_twice_at_once() -> None:
    pool, clock = _Pool(), Clock()
    statements = _statements(600, pool, clock)
    statements.due()
    statements.due()  # the first is still queued
    assert len(pool.queued) == 1
    statements.record(StatementsRead())  # the read ends
    clock.now += 599
    statements.due()
    assert len(pool.queued) == 1
    clock.now += 1
    statements.due()
    assert len(pool.queued) == 2
    assert statements.last() == StatementsRead()


def test_an_interval_of_0_never_reads() -> None:
    pool = _Pool()
    statements = _statements(0, pool, Clock())
    statements.due()
    assert pool.queued == []
    assert statements.last() is None


def test_the_readers_end_when_shut_down_and_a_later_read_has_new_ones() -> None:
    readers = Readers()
    release = threading.Event()
    workers: list[threading.Thread] = []

    def hold() -> None:
        workers.append(threading.current_thread())
        release.wait(30)

    running = [Task(hold) for _ in range(READERS)]
    queued = Task(lambda: None)  # behind the reads that take every worker
    readers.enqueue([(task, Priority.ROUTINE) for task in [*running, queued]])
    wait_until(lambda: all(task.future.running() for task in running), 10, "a worker for each read")
    readers.shutdown()
    assert queued.future.cancelled()
    release.set()
    for worker in workers:
        worker.join(10)
    assert [worker.is_alive() for worker in workers] == [False] * READERS
    again = Task(lambda: "read")
    readers.enqueue([(again, Priority.ROUTINE)])
    assert again.future.result(10) == "read"
    readers.shutdown()


def test_check_says_what_a_read_did_not_judge_even_when_nothing_is_risky() -> None:
    out = io.StringIO()
    unjudged = StatementsRead(skipped={"over_budget": 3, "unparsable": 0}, reads_all=False,
                              role="watcher")  # fmt: skip
    print_hygiene(snapshot_of(IDLE), Hygiene((), unjudged), out)
    text = out.getvalue()
    assert "Risky statements in pg_stat_statements (0), most called first" in text
    assert "Not judged: 3 over_budget\n" in text
    assert 'GRANT pg_read_all_stats TO "watcher"' in text
    out = io.StringIO()
    print_hygiene(snapshot_of(IDLE), Hygiene((), None), out)
    assert "Risky statements: not read (statements_interval is 0)" in out.getvalue()


def test_the_first_statements_shown_are_said_to_be_the_first() -> None:
    rows = [_row(f"SELECT pg_advisory_lock(id) FROM t{n} LIMIT $1", screened=SHOWN + 5)
            for n in range(SHOWN + 5)]  # fmt: skip
    found = judged(rows, True, Judge(10.0))
    out = io.StringIO()
    print_hygiene(snapshot_of(IDLE), Hygiene((), found), out)
    assert f"({SHOWN + 5}, the first {SHOWN} shown)" in out.getvalue()
    document = statements_json(found)
    assert document is not None
    assert document["risky_total"] == SHOWN + 5
    assert len(document["statements"]) == SHOWN
    assert set(document["rules"]["lock_in_where"]) == {"what", "safe_form"}
