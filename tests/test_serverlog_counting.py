"""A target's server log counted (serverlog/counting.py): from a file a test writes, read
once per call, without the thread of the daemon."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support import SUITE_LOG_PREFIX

from pg_advisory_exporter.config.targets import ServerLogSettings
from pg_advisory_exporter.keys.appnames import OTHER, RewriteRule
from pg_advisory_exporter.keys.key_config import KeyConfig
from pg_advisory_exporter.keys.registry import Registry
from pg_advisory_exporter.serverlog.counting import UNKNOWN, ServerLog

PREFIX = "2026-12-01 10:00:00.000 UTC [{pid}] {state} app@orders {app} "
REGISTRY = Registry.resolve([KeyConfig(name="nightly", key=77)], lambda texts, seeds: [])
WAIT = "LOG:  process {pid} {verb} ExclusiveLock on advisory lock [5,0,{key},1] after {ms} ms"


def line(text: str, app: str = "job", pid: int = 7, state: str = "00000") -> str:
    return PREFIX.format(pid=pid, state=state, app=app) + text


def unlock(app: str = "job") -> str:
    return line("WARNING:  you don't own a lock of type ExclusiveLock", app, state="01000")


def wait(pid: int, verb: str, key: int = 77, ms: str = "200.100", app: str = "job") -> str:
    return line(WAIT.format(pid=pid, verb=verb, key=key, ms=ms), app, pid)


class Log:
    """A log file and the ServerLog that reads it from its end."""

    def __init__(self, folder: Path, limit: int = 100, rules: list[RewriteRule] | None = None):
        self.path = folder / "postgresql.log"
        self.path.write_text("checkpoint before the exporter started: not read\n")
        settings = ServerLogSettings(path=self.path, line_prefix=SUITE_LOG_PREFIX)
        self.reader = ServerLog("main", settings, rules or [], limit, lambda: REGISTRY)

    def write(self, *lines: str) -> dict[tuple[str, tuple[str, ...]], float]:
        """Append the lines, read them, and return every sample by (name, labels)."""
        with self.path.open("a") as log:
            log.write("".join(f"{text}\n" for text in lines))
        while self.reader.read():  # until all is read, then once more: the quiet log's flush
            pass
        return {(s.name, s.labels): s.value for s in self.reader.samples()}


@pytest.fixture
def log(tmp_path: Path) -> Iterator[Log]:
    made = Log(tmp_path)
    yield made
    made.reader.close()


def counted(samples: dict[tuple[str, tuple[str, ...]], float], metric: str) -> dict[str, float]:
    """One counter's values by their labels after the target's, joined with "/"."""
    return {"/".join(labels[1:]): v for (name, labels), v in samples.items() if name == metric}


def test_events_count_by_database_and_application(log: Log) -> None:
    samples = log.write(unlock(), unlock(), unlock("cron"), line("LOG:  checkpoint starting"))
    assert counted(samples, "pg_advisory_log_unlocks_not_held_total") == {
        "orders/job": 2,
        "orders/cron": 1,
    }
    assert samples["pg_advisory_log_up", ("main",)] == 1
    assert samples["pg_advisory_log_lines_total", ("main",)] == 4  # the one before: not read
    assert samples["pg_advisory_log_unparsed_lines_total", ("main",)] == 0


def test_a_wait_counts_once_by_its_key_name(log: Log) -> None:
    samples = log.write(
        wait(10, "still waiting for"),
        wait(10, "still waiting for", ms="1200.000"),  # woken, still waiting: the same wait
        wait(10, "acquired", ms="1500.000"),
        wait(11, "acquired", ms="300.000"),  # began before the exporter: counted at its end
        wait(12, "still waiting for", key=78),  # a key the registry lacks, not ended yet
    )
    assert counted(samples, "pg_advisory_log_lock_waits_total") == {
        "orders/job/nightly": 2,
        "orders/job/": 1,
    }
    assert counted(samples, "pg_advisory_log_lock_wait_seconds_total") == {
        "orders/job/nightly": pytest.approx(1.8)
    }
    # The same process waits again for the same key: another wait.
    samples = log.write(wait(10, "still waiting for"))
    assert counted(samples, "pg_advisory_log_lock_waits_total")["orders/job/nightly"] == 3


def test_a_wait_for_an_extension_s_own_lock_counts_apart_by_extension(log: Log) -> None:
    citus = "LOG:  process 20 {verb} ShareLock on advisory lock [5,7,8,5] after {ms} ms"
    samples = log.write(
        line(citus.format(verb="still waiting for", ms="1000.000"), "citus-op", 20),
        line(citus.format(verb="acquired", ms="2500.000"), "citus-op", 20),  # the same wait
        wait(10, "acquired"),
    )
    assert counted(samples, "pg_advisory_log_extension_lock_waits_total") == {
        "orders/citus-op/citus": 1
    }
    # Not the application's waits, nor their time.
    assert counted(samples, "pg_advisory_log_lock_waits_total") == {"orders/job/nightly": 1}
    assert counted(samples, "pg_advisory_log_lock_wait_seconds_total") == {
        "orders/job/nightly": pytest.approx(0.2001)
    }


def test_a_wait_given_up_with_an_error_ends_and_the_next_one_counts(log: Log) -> None:
    """A wait cancelled by lock_timeout (or statement_timeout, a cancel) logs no end, only
    the process's error: a retry loop's next wait for the same key is another wait."""
    timeout = line("ERROR:  canceling statement due to lock timeout", pid=10, state="55P03")
    samples = log.write(
        wait(10, "still waiting for"), timeout,
        wait(10, "still waiting for"), timeout,
        wait(10, "still waiting for"),
        wait(10, "still waiting for", ms="1200.000"),  # woken, still waiting: the same wait
    )  # fmt: skip
    assert counted(samples, "pg_advisory_log_lock_waits_total") == {"orders/job/nightly": 3}
    # Another process's error ends none of them.
    samples = log.write(
        line("ERROR:  division by zero", pid=11, state="22012"),
        wait(10, "still waiting for", ms="1300.000"),
    )
    assert counted(samples, "pg_advisory_log_lock_waits_total") == {"orders/job/nightly": 3}


def test_application_names_are_rewritten_and_capped_for_good(tmp_path: Path) -> None:
    rules = [RewriteRule.compile(r"worker-\d+", "worker")]
    log = Log(tmp_path, limit=3, rules=rules)  # two names and OTHER, as the snapshot caps
    try:
        samples = log.write(unlock("worker-1"), unlock("worker-2"), unlock("api"), unlock("x"))
        assert counted(samples, "pg_advisory_log_unlocks_not_held_total") == {
            "orders/worker": 2,
            "orders/api": 1,
            f"orders/{OTHER}": 1,
        }
        # A name kept stays itself; one that came past the cap never gets a series.
        samples = log.write(unlock("api"), unlock("x"), unlock("y"))
        assert counted(samples, "pg_advisory_log_unlocks_not_held_total") == {
            "orders/worker": 2,
            "orders/api": 2,
            f"orders/{OTHER}": 3,
        }
    finally:
        log.reader.close()


def test_what_the_format_does_not_say_is_unknown(tmp_path: Path) -> None:
    path = tmp_path / "postgresql.log"
    path.write_text("")
    # The server's default prefix: no database, no application.
    reader = ServerLog("main", ServerLogSettings(path=path), [], 100, lambda: REGISTRY)
    try:
        with path.open("a") as log:
            log.write(
                "2026-12-01 10:00:00.000 UTC [7] WARNING:  "
                "you don't own a lock of type ExclusiveLock\n"
            )
        reader.read()
        reader.read()
        found = {(s.name, s.labels): s.value for s in reader.samples()}
        assert found["pg_advisory_log_unlocks_not_held_total", ("main", UNKNOWN, UNKNOWN)] == 1
    finally:
        reader.close()


def test_a_log_that_cannot_be_read_says_so(tmp_path: Path) -> None:
    settings = ServerLogSettings(path=tmp_path / "missing.log")
    reader = ServerLog("main", settings, [], 100, lambda: REGISTRY)
    try:
        reader.read()
        found = {(s.name, s.labels): s.value for s in reader.samples()}
        assert found["pg_advisory_log_up", ("main",)] == 0
        assert found["pg_advisory_log_lines_total", ("main",)] == 0
    finally:
        reader.close()
