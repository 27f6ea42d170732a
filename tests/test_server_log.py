"""The server's own log, read between scrapes: a real server writes every format at once
(stderr, csvlog, and jsonlog from 15), a target reads each, and each counts what happened
between two scrapes alike. On every version: the messages' wording is the server's."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from log_events import DEADLOCKER, FILLER, UNLOCKER, WAITED_KEY, WAITER, every_event
from support import (
    PG_MAJOR,
    REFUSED_DSN,
    SUITE_LOG_PREFIX,
    Config,
    RunningExporter,
    Scrape,
    StartExporter,
)

from devtools.embedded_postgres import EmbeddedPostgres
from pg_advisory_exporter.keys.appnames import OTHER

FORMATS = ("stderr", "csvlog", "jsonlog") if PG_MAJOR >= 15 else ("stderr", "csvlog")
EVENTS = (
    "pg_advisory_log_unlocks_not_held_total",
    "pg_advisory_log_out_of_shared_memory_total",
    "pg_advisory_log_deadlocks_total",
    "pg_advisory_log_lock_waits_total",
    "pg_advisory_log_lock_wait_seconds_total",
)


@pytest.fixture
def logging_server() -> Iterator[EmbeddedPostgres]:
    """A server with the settings docs/server-log.md asks for, a small lock table, and every
    statement logged (multi-line ones too: lines the parsers must all read)."""
    server = EmbeddedPostgres(major=PG_MAJOR)
    try:
        server.start(
            logging_collector="on",
            log_destination=",".join(FORMATS),
            log_line_prefix=SUITE_LOG_PREFIX,
            lc_messages="C",
            log_lock_waits="on",
            deadlock_timeout="200ms",
            log_statement="all",
            max_connections=20,
            max_locks_per_transaction=10,
            autovacuum="off",  # no worker of its own to fail while the table is full
        )
        yield server
    finally:
        server.cleanup()


def _config(server: EmbeddedPostgres) -> Config:
    """A target per format, all of this server, each reading its log_directory."""
    directory = server.datadir / "log"
    return {
        "targets": [
            {
                "name": log_format,
                "dsn": server.dsn(),
                "server_log": {
                    "path": str(directory),
                    "format": log_format,
                    "line_prefix": SUITE_LOG_PREFIX,
                },
            }
            for log_format in FORMATS
        ],
        "keys": [{"name": "nightly_report", "key": WAITED_KEY}],
    }


def _counts(scrape: Scrape, target: str) -> dict[tuple[str, str, str], float]:
    """The events a target counted: (series, application, key) to value, the seconds
    rounded to whether there were any."""
    counts = {}
    for metric in EVENTS:
        for labels, value in scrape.find(metric, target=target):
            assert labels["datname"] == "postgres"
            seconds = metric.endswith("_seconds_total")
            counts[metric, labels["application_name"], labels.get("key", "-")] = (
                float(value > 0) if seconds else value
            )
    return counts


@pytest.mark.slow
@pytest.mark.pg  # starts its own server, logging as no other test's does
def test_each_format_counts_what_happened_between_scrapes(
    logging_server: EmbeddedPostgres, start_exporter: StartExporter
) -> None:
    exporter = start_exporter(config=_config(logging_server))
    exporter.scrape_until(
        lambda s: all(s.value("pg_advisory_log_up", target=f) == 1 for f in FORMATS)
    )
    with logging_server.connect() as conn:
        # A wait for a row, not an advisory lock: logged, and not counted.
        conn.execute("CREATE TABLE jobs (id int PRIMARY KEY)")
        conn.execute("INSERT INTO jobs VALUES (1)")
    dsn = logging_server.dsn()
    with psycopg.connect(dsn, application_name="row-holder") as holder:
        holder.execute("SELECT * FROM jobs FOR UPDATE")
        with psycopg.connect(dsn, application_name="row-waiter") as waiter:
            waiter.execute("SET lock_timeout = '400ms'")  # logged as waiting at 200ms
            with pytest.raises(psycopg.errors.LockNotAvailable):
                waiter.execute("SELECT * FROM jobs FOR UPDATE")
        holder.rollback()
    every_event(dsn, logging_server.datadir / "log")
    # The server moves to new files: what it writes there is counted too.
    with logging_server.connect() as conn:
        conn.execute("SELECT pg_rotate_logfile()")
        conn.execute("SELECT\n  pg_advisory_unlock(\n    1)")  # and a statement of 3 lines

    expected = {
        ("pg_advisory_log_unlocks_not_held_total", UNLOCKER, "-"): 1,
        ("pg_advisory_log_unlocks_not_held_total", "embedded-postgres", "-"): 1,
        ("pg_advisory_log_out_of_shared_memory_total", FILLER, "-"): 1,
        ("pg_advisory_log_deadlocks_total", DEADLOCKER, "-"): 1,
        # Both sessions of the deadlock waited past deadlock_timeout: the survivor logs its
        # wait and then that it got its lock, the victim only that it found the deadlock.
        ("pg_advisory_log_lock_waits_total", DEADLOCKER, ""): 2,
        ("pg_advisory_log_lock_wait_seconds_total", DEADLOCKER, ""): 1,
        ("pg_advisory_log_lock_waits_total", WAITER, "nightly_report"): 1,
        ("pg_advisory_log_lock_wait_seconds_total", WAITER, "nightly_report"): 1,
    }
    scrape = exporter.scrape_until(lambda s: all(_counts(s, f) == expected for f in FORMATS))
    for log_format in FORMATS:
        assert scrape.value("pg_advisory_log_up", target=log_format) == 1
        assert scrape.value("pg_advisory_log_lines_total", target=log_format) > 20
        # Every line the server wrote is a record the exporter could read.
        assert scrape.value("pg_advisory_log_unparsed_lines_total", target=log_format) == 0
        waited = scrape.value(
            "pg_advisory_log_lock_wait_seconds_total", target=log_format, key="nightly_report"
        )
        # Logged once it passed deadlock_timeout (200ms), ended once the test saw that.
        assert 0.2 <= waited < 10, waited
    assert "cannot read the server's log" not in exporter.log()


def _reading(path: Path, start_exporter: StartExporter) -> RunningExporter:
    """An exporter whose one target reads the log at `path` (its server is down: the log
    is read all the same)."""
    server_log = {"path": str(path), "line_prefix": SUITE_LOG_PREFIX}
    return start_exporter(
        config={"targets": [{"name": "main", "dsn": REFUSED_DSN, "server_log": server_log}]}
    )


def test_a_missing_log_is_reported_and_read_once_there(
    tmp_path: Path, start_exporter: StartExporter
) -> None:
    path = tmp_path / "postgresql.log"
    exporter = _reading(path, start_exporter)
    assert exporter.scrape().value("pg_advisory_log_up", target="main") == 0
    path.write_text(
        "2026-12-01 10:00:00.000 UTC [7] 01000 app@orders cron WARNING:  "
        "you don't own a lock of type ExclusiveLock\n"
    )
    scrape = exporter.scrape_until(
        lambda s: bool(s.find("pg_advisory_log_unlocks_not_held_total", target="main"))
    )
    assert scrape.value("pg_advisory_log_up", target="main") == 1
    assert (
        scrape.value(
            "pg_advisory_log_unlocks_not_held_total", datname="orders", application_name="cron"
        )
        == 1
    )
    assert exporter.log().count("cannot read the server's log") == 1


def _peak_rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    [line] = [line for line in status.splitlines() if line.startswith("VmHWM:")]
    return int(line.split()[1]) / 1024


HOSTILE_APPLICATIONS, NOISE, HUGE, GARBAGE = 5_000, 100_000, 20, 1_000


def _hostile_log() -> tuple[bytes, int]:
    """A log as a hostile or broken server could write it, and how many lines it has: unlocks
    from 5,000 application names, 100,000 ordinary records, lines of a megabyte, bytes that
    are no text, and a name that imitates the end of the prefix."""
    prefix = "2026-12-01 10:00:00.000 UTC [7] 01000 app@orders"
    unlock = "WARNING:  you don't own a lock of type ExclusiveLock"
    lines = [f"{prefix} app-{i} {unlock}".encode() for i in range(HOSTILE_APPLICATIONS)]
    lines += [f"{prefix} web LOG:  statement: SELECT {i}".encode() for i in range(NOISE)]
    for i in range(HUGE):
        lines.insert(i * 1000, b"A" * (1024 * 1024))
    for i in range(GARBAGE):
        lines.insert(i * 100 + 1, b"\xff\xfe\x00\x00 not text \xc3\x28")
    lines.append(f"{prefix} x {unlock} LOG:  statement: SELECT 1".encode())
    return b"\n".join(lines) + b"\n", len(lines)


@pytest.mark.slow
def test_a_hostile_log_is_read_in_bounded_memory_while_metrics_answer(
    tmp_path: Path, start_exporter: StartExporter
) -> None:
    path = tmp_path / "postgresql.log"
    path.write_bytes(b"")
    exporter = _reading(path, start_exporter)
    exporter.scrape_until(lambda s: s.value("pg_advisory_log_up", target="main") == 1)
    before = _peak_rss_mb(exporter.process.pid)
    data, lines = _hostile_log()
    with path.open("ab") as log:
        log.write(data)
    # While it reads, the exporter answers: its health and its metrics, never stalled.
    read = 0.0
    answers = []
    while read < lines:
        started = time.monotonic()
        assert exporter.get("/-/healthy")[0] == 200
        scrape = exporter.scrape()
        answers.append(time.monotonic() - started)
        read = scrape.value("pg_advisory_log_lines_total", target="main")
    peak = _peak_rss_mb(exporter.process.pid)
    print(
        f"{lines} lines ({len(data) / 2**20:.0f} MiB) read; {len(answers)} answers meanwhile, "
        f"the slowest {max(answers):.2f}s; peak RSS {before:.0f} -> {peak:.0f} MB"
    )
    assert read == lines
    assert max(answers) < 5  # a stall, not a speed: an answer takes milliseconds
    assert peak - before < 64  # one read (1 MiB) and one line (64 KiB) at a time
    unlocks = scrape.find("pg_advisory_log_unlocks_not_held_total", target="main")
    assert sum(value for _, value in unlocks) == HOSTILE_APPLICATIONS  # not the imitation
    # At most application_name_limit values (100), __other__ among them, as the snapshot's.
    assert len(unlocks) == 100
    assert {labels["application_name"] for labels, _ in unlocks} >= {"app-0", "app-98", OTHER}
    unparsed = scrape.value("pg_advisory_log_unparsed_lines_total", target="main")
    assert unparsed == HUGE + GARBAGE + 1
