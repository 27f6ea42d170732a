"""How long a lock has been held, on a real server: through statements and transactions, after
an exporter restart, for a new backend, and the same in the series, /locks and `check`
(collect/holds.py; tests/test_holds.py has the logic without a server)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from support import (
    Cli,
    Config,
    OneTarget,
    RunningExporter,
    Scrape,
    Session,
    StartExporter,
    report_section,
    write_config,
)

KEYS = [
    {"name": "nightly", "key": 7310001},
    {"name": "per_row", "namespace": 2001, "level": "transaction"},
]


def _config(one_target: OneTarget, dsn: str) -> Config:
    return {**one_target(dsn, min_interval="50ms"), "keys": KEYS}


def _held(scrape: Scrape, key: str) -> float | None:
    found = scrape.find("pg_advisory_key_hold_seconds", target="main", key=key)
    return found[0][1] if found else None


def _holder(exporter: RunningExporter, pid: int) -> dict[str, Any]:
    """The holder's entry of a fresh /locks answer."""
    time.sleep(0.1)  # past the answer's reuse (the fixture's locks_page.reuse_for)
    status, body = exporter.get("/locks?target=main&format=json")
    assert status == 200, body
    holders: list[dict[str, Any]] = json.loads(body)["holders"]
    [holder] = [h for h in holders if h["pid"] == pid]
    return holder


def _locks_page(one_target: OneTarget, dsn: str) -> Config:
    config = _config(one_target, dsn)
    config["locks_page"] = {"reuse_for": "50ms"}
    return config


def test_a_hold_lasts_through_statements_and_transactions(
    start_exporter: StartExporter, one_target: OneTarget, monitor_dsn: str, session: Session
) -> None:
    exporter = start_exporter(config=_locks_page(one_target, monitor_dsn))
    exporter.scrape_until(lambda s: s.value("pg_advisory_up", target="main") == 1)
    job = session("nightly-job")
    job.execute("SELECT pg_advisory_lock(7310001)")
    exporter.scrape_until(lambda s: _held(s, "nightly") is not None)
    seen = time.monotonic()
    # The job works: short statements, on their own and in transactions, for 3 seconds.
    while time.monotonic() - seen < 3:
        job.execute("SELECT pg_sleep(0.02)")
        with job.transaction():
            job.execute("SELECT 1")
    scrape = exporter.scrape()
    held, worked = _held(scrape, "nightly"), time.monotonic() - seen
    assert held is not None
    assert held >= worked - 0.5, (held, worked)  # its time in a state was never over 0.1s
    idle = scrape.find("pg_advisory_idle_holder_max_seconds", application_name="nightly-job")
    assert all(value < 1 for _, value in idle)
    # /locks says the same of the holder and of its key, and that it saw the hold begin.
    holder = _holder(exporter, job.info.backend_pid)
    assert holder["held_seconds"] >= worked - 0.5
    assert holder["held_at_least"] is False
    [lock] = [lock for lock in holder["locks"] if lock["key_name"] == "nightly"]
    assert abs(lock["held_seconds"] - holder["held_seconds"]) < 0.1

    # A transaction-level key: held while its transaction lasts, taken anew in the next one.
    with job.transaction():
        job.execute("SELECT pg_advisory_xact_lock(2001, 1)")
        exporter.scrape_until(lambda s: _held(s, "per_row") is not None)
        time.sleep(1.5)
        in_first = _held(exporter.scrape(), "per_row")
        assert in_first is not None
        assert in_first >= 1.4
    with job.transaction():
        job.execute("SELECT pg_advisory_xact_lock(2001, 1)")
        time.sleep(0.2)  # past the last collection's min_interval: a collection of this one
        again = exporter.scrape_until(lambda s: _held(s, "per_row") is not None)
        anew = _held(again, "per_row")
        assert anew is not None
        assert anew < in_first  # never longer than this transaction
        # The session's own key is held all along.
        nightly = _held(again, "nightly")
        assert nightly is not None
        assert nightly >= worked + 1.4

    # A new backend holding the key starts over.
    job.execute("SELECT pg_advisory_unlock(7310001)")
    exporter.scrape_until(lambda s: _held(s, "nightly") is None)
    other = session("nightly-job")
    taken = time.monotonic()
    other.execute("SELECT pg_advisory_lock(7310001)")
    renewed = _held(exporter.scrape_until(lambda s: _held(s, "nightly") is not None), "nightly")
    assert renewed is not None
    assert renewed <= time.monotonic() - taken + 0.1  # since this backend took it, no longer


def test_an_idle_holder_is_held_since_it_went_idle_after_a_restart_and_in_check(
    start_exporter: StartExporter,
    one_target: OneTarget,
    monitor_dsn: str,
    session: Session,
    cli: Cli,
    tmp_path: Path,
) -> None:
    # A Rails migration's lock connection: it takes the lock and sits idle. The exporter
    # starts (or restarts) while it does.
    rails = session("rails-lock")
    rails.execute("SELECT pg_advisory_lock(7310001)")
    went_idle = time.monotonic()
    time.sleep(2)
    exporter = start_exporter(config=_locks_page(one_target, monitor_dsn))
    scrape = exporter.scrape_until(lambda s: _held(s, "nightly") is not None)
    held = _held(scrape, "nightly")
    assert held is not None
    assert held >= 2  # known at the first collection: no page late for the restart
    assert held <= time.monotonic() - went_idle + 0.5
    holder = _holder(exporter, rails.info.backend_pid)
    assert holder["held_at_least"] is True  # held when the exporter began to watch

    path = write_config(tmp_path, _config(one_target, monitor_dsn), "check.yaml")
    report = json.loads(cli("check", "--config.file", str(path), "--format", "json").stdout)
    [checked] = [h for h in report[0]["holders"] if h["pid"] == rails.info.backend_pid]
    assert checked["held_seconds"] >= 2
    assert checked["held_at_least"] is True
    text = cli("check", "--config.file", str(path), check=True).stdout
    holders = report_section(text, "Holders (")
    [line] = [
        row for row in holders.splitlines() if row.split()[:1] == [str(rails.info.backend_pid)]
    ]
    assert "at least " in line


def test_without_the_grant_a_hold_counts_from_the_exporters_first_sight(
    start_exporter: StartExporter, one_target: OneTarget, plain_dsn: str, session: Session
) -> None:
    busy = session("busy-job")
    busy.execute("SELECT pg_advisory_lock(7310001)")
    exporter = start_exporter(config=_config(one_target, plain_dsn))
    exporter.scrape_until(lambda s: _held(s, "nightly") is not None)
    seen = time.monotonic()
    time.sleep(1.5)
    # Its state and timestamps are hidden from this role: the hold is the exporter's own.
    scrape = exporter.scrape()
    assert scrape.value("pg_advisory_exporter_insufficient_privilege", target="main") == 1
    held = _held(scrape, "nightly")
    assert held is not None
    assert held >= time.monotonic() - seen - 0.5


def test_a_hold_ends_with_its_lock(
    start_exporter: StartExporter,
    one_target: OneTarget,
    monitor_dsn: str,
    session: Session,
) -> None:
    exporter = start_exporter(config=_config(one_target, monitor_dsn))
    job = session("short-job")
    for _ in range(2):  # taken, released, taken again by the same backend: it starts over
        job.execute("SELECT pg_advisory_lock(7310001)")
        exporter.scrape_until(lambda s: _held(s, "nightly") is not None)
        seen = time.monotonic()
        while time.monotonic() - seen < 1:
            job.execute("SELECT pg_sleep(0.02)")
        held = _held(exporter.scrape(), "nightly")
        assert held is not None
        assert 0.9 <= held < 3
        job.execute("SELECT pg_advisory_unlock(7310001)")
        exporter.scrape_until(lambda s: _held(s, "nightly") is None)
