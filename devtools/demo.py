"""`make demo`: the advisory lock scenarios played on a throwaway server, exported live.

Run from the repository's root as `python -m devtools.demo`; `--help` lists its flags.
"""

from __future__ import annotations

import argparse
import logging
import random
import shlex
import signal
import sys
import threading
import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any

import psycopg
import yaml
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from pydantic import ValidationError

from pg_advisory_exporter import logs
from pg_advisory_exporter.collect.vocabulary import format_age
from pg_advisory_exporter.config.collection import CollectionSettings, RewriteRuleConfig
from pg_advisory_exporter.config.exporter_settings import LogConfig, WebConfig
from pg_advisory_exporter.config.settings import Config, TargetSettings
from pg_advisory_exporter.config.targets import ServerLogSettings
from pg_advisory_exporter.daemon import Daemon
from pg_advisory_exporter.keys import catalog
from pg_advisory_exporter.keys.key_config import KeyConfig

from .embedded_postgres import DEFAULT_MAJOR, EmbeddedPostgres, EmbeddedPostgresError

log = logging.getLogger(__name__)

PROG = "python -m devtools.demo"  # `make demo` runs it so, from the repository's root
LISTEN_ADDRESS = "127.0.0.1:9846"  # the demo's server is throwaway: keep it local
EXIT_FAILED = 1
EXIT_USAGE = 2  # as a bad flag, and as the exporter's configuration errors
BILLING_DB = "billing"
# A small server, so that the bulk import's 2,000 locks fill a visible share of its lock table.
# pg_stat_statements for check's and /locks' risky statements (signup-api keys with hashtext()).
# Its log in csvlog (every supported version writes it) under the data directory, which the
# demo's exporter follows for what no snapshot shows (payments-worker's misplaced unlock).
SERVER_LOG_DIRECTORY = "log"
SERVER_SETTINGS: dict[str, str | int] = {
    "max_connections": 40,
    "shared_preload_libraries": "pg_stat_statements",
    "logging_collector": "on",
    "log_destination": "csvlog",
    "log_directory": SERVER_LOG_DIRECTORY,
    "lc_messages": "C",  # the exporter reads the server's English words
}
SUMMARY_INTERVAL = 5.0
SCRAPE_TIMEOUT = 10.0
RETRY_PAUSE = 3.0
STOP_GRACE = 5.0  # how long the scenario threads get to finish after a cancel

CRON_PODS = (
    "reward-points-cron-7d9f8c6b5d-x2k4p",
    "reward-points-cron-9c4b7f6d8-q7m2z",
    "reward-points-cron-5f6d7c8b9-h3j8k",
)
# The Deployment's pod-name suffix, removed so that all replicas share one label value.
POD_SUFFIX = RewriteRuleConfig(pattern=r"(.+)-[0-9a-f]{8,10}-[0-9a-z]{5}", replacement=r"\1")
CRON_TRY_LOCK_SQL = "SELECT pg_try_advisory_lock(hashtextextended('cron:recalc-reward-points', 0))"
CRON_UNLOCK_SQL = "SELECT pg_advisory_unlock(hashtextextended('cron:recalc-reward-points', 0))"
CRON_ROUND, CRON_HOLD = 10.0, 6.0

LEAKED_LOCK_SQL = "SELECT pg_advisory_lock(7310001)"

# The signup namespace: (1001, hash of the e-mail), one key space per kind of resource.
SIGNUP_LOCK_SQL = "SELECT pg_advisory_xact_lock(1001, hashtext(lower('An@Example.com')))"
# Cycles (here 5.5s, the rebalancer's 9.5s) that are no multiple of SUMMARY_INTERVAL, so
# that successive summaries catch the waits at different points.
SIGNUP_HOLD, SIGNUP_HOLDER_PAUSE, SIGNUP_WAITER_PAUSE = 4.0, 1.5, 0.5

BULK_LOCK_SQL = "SELECT count(pg_advisory_xact_lock(900000, i)) FROM generate_series(1, 2000) i"
BULK_HOLD, BULK_PAUSE = 20.0, 5.0

READER_LOCK_SQL = "SELECT pg_advisory_lock_shared(2001, 81234)"
REBALANCE_TIMEOUT_SQL = "SET LOCAL lock_timeout = '8s'"
# Transaction-level: a session lock taken here would survive the ROLLBACK after a timeout.
REBALANCE_LOCK_SQL = "SELECT pg_advisory_xact_lock(2001, 81234)"
REBALANCE_PAUSE = 1.5

# A job that takes its session lock on one connection of its driver's pool and unlocks on
# another: the unlock finds nothing to release (the server logs "you don't own a lock"), and
# the lock stays on the first until the job's own clean-up there.
PAYMENTS_LOCK_SQL = "SELECT pg_advisory_lock(5550001)"
PAYMENTS_UNLOCK_SQL = "SELECT pg_advisory_unlock(5550001)"
PAYMENTS_HOLD, PAYMENTS_STRANDED, PAYMENTS_PAUSE = 3.0, 4.0, 5.0

LEADER_LOCK_SQL = "SELECT pg_advisory_lock(42)"
# ActiveRecord's migration lock on database billing, as Rails takes it (2053462845 times the
# CRC-32 of the database's name): no registry entry names it, the built-in catalog does.
[_RAILS_MIGRATION] = catalog.key_configs([catalog.BY_NAME["rails_migration"]], [BILLING_DB])
RAILS_MIGRATION_LOCK_SQL = f"SELECT pg_try_advisory_lock({_RAILS_MIGRATION.key})"
BILLING_CRON_LOCK_SQL = "SELECT pg_advisory_lock(-6110350855857795459)"
# Que's locker: its connection names itself as Que's lib/que/locker.rb does and holds one
# session lock per job while workers run the jobs elsewhere: idle by design (the catalog's
# que_locker), judged against its max_hold, never a leak.
QUE_LOCKER_SQL = (
    "SELECT set_config('application_name', 'Que Locker: ' || pg_backend_pid(), false), "
    "pg_advisory_lock(g) FROM generate_series(800001, 800003) AS g"
)

Connection = psycopg.Connection[tuple[Any, ...]]


class _DemoError(Exception):
    """The demo cannot start; the message says why and what to do."""


class _Stage:
    """The scenario threads and their connections, stopped together."""

    def __init__(self, pg: EmbeddedPostgres, stop: threading.Event) -> None:
        self.pg = pg
        self.stop = stop
        self._lock = threading.Lock()  # guards _open: a cancel must not race a close
        self._open: set[Connection] = set()
        self._threads: list[threading.Thread] = []

    @contextmanager
    def session(self, application_name: str, dbname: str = "postgres") -> Iterator[Connection]:
        conn = psycopg.connect(
            self.pg.dsn(dbname), autocommit=True, application_name=application_name
        )
        with self._lock:
            self._open.add(conn)
        try:
            yield conn
        finally:
            with self._lock:
                self._open.discard(conn)
                conn.close()

    def play(self, name: str, scenario: Scenario) -> None:
        thread = threading.Thread(target=self._loop, args=(name, scenario), name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _loop(self, name: str, scenario: Scenario) -> None:
        while not self.stop.is_set():
            try:
                scenario(self)
            except psycopg.Error as exc:
                if self.stop.is_set():
                    return  # cancelled by close()
                log.warning("scenario failed; retrying", extra={"scenario": name, "error": exc})
                self.stop.wait(RETRY_PAUSE)

    def close(self) -> None:
        self.stop.set()
        with self._lock:
            for conn in self._open:  # wakes the sessions that wait for a lock
                try:
                    conn.cancel_safe(timeout=STOP_GRACE)
                except psycopg.Error as exc:
                    log.debug("cancel failed", extra={"error": exc})
        deadline = time.monotonic() + STOP_GRACE
        for thread in self._threads:
            thread.join(max(deadline - time.monotonic(), 0.0))


Scenario = Callable[[_Stage], None]


def _hold(stage: _Stage, application_name: str, sql: str, dbname: str = "postgres") -> None:
    """Take a session lock once and stay idle: a leak, a leader, or a long reader."""
    with stage.session(application_name, dbname) as conn:
        conn.execute(sql)
        stage.stop.wait()


def _cron_pods(stage: _Stage) -> None:
    with ExitStack() as sessions:
        pods = [sessions.enter_context(stage.session(name)) for name in CRON_PODS]
        while not stage.stop.is_set():
            random.shuffle(pods)  # the pod that starts first differs from night to night
            results = [(pod, pod.execute(CRON_TRY_LOCK_SQL).fetchone()) for pod in pods]
            for pod in [pod for pod, row in results if row == (True,)]:  # the others skip
                stage.stop.wait(CRON_HOLD)
                pod.execute(CRON_UNLOCK_SQL)
            stage.stop.wait(CRON_ROUND - CRON_HOLD)


def _in_transactions(
    stage: _Stage, application_name: str, sql: str, hold: float, pause: float
) -> None:
    """Again and again: BEGIN, take the locks, keep them `hold` seconds (the work), COMMIT."""
    with stage.session(application_name) as conn:
        while not stage.stop.is_set():
            with conn.transaction():
                conn.execute(sql)
                stage.stop.wait(hold)
            stage.stop.wait(pause)


def _payments_worker(stage: _Stage) -> None:
    with stage.session("payments-worker") as first, stage.session("payments-worker") as second:
        while not stage.stop.is_set():
            first.execute(PAYMENTS_LOCK_SQL)
            stage.stop.wait(PAYMENTS_HOLD)
            second.execute(PAYMENTS_UNLOCK_SQL)  # the wrong connection: logged, nothing released
            stage.stop.wait(PAYMENTS_STRANDED)
            first.execute(PAYMENTS_UNLOCK_SQL)
            stage.stop.wait(PAYMENTS_PAUSE)


def _rebalancer(stage: _Stage) -> None:
    with stage.session("rebalancer") as conn:
        while not stage.stop.is_set():
            try:
                with conn.transaction():
                    conn.execute(REBALANCE_TIMEOUT_SQL)
                    conn.execute(REBALANCE_LOCK_SQL)
            except psycopg.errors.LockNotAvailable:
                pass  # the readers still hold the account: give up, try again later
            stage.stop.wait(REBALANCE_PAUSE)


@dataclass(frozen=True)
class _Play:
    who: str
    what: str
    scenario: Scenario


def _holder(application_name: str, what: str, sql: str, dbname: str = "postgres") -> _Play:
    hold = partial(_hold, application_name=application_name, sql=sql, dbname=dbname)
    return _Play(application_name, what, hold)


_READER = _holder("report-reader", "shared lock (2001, 81234)", READER_LOCK_SQL)
PLAYS = (
    _Play("reward-points-cron-*", "3 pods race for the nightly job every 10s", _cron_pods),
    _holder("billing-worker", "session lock 7310001 leaked, idle ever since", LEAKED_LOCK_SQL),
    _Play("signup-api", "xact lock (1001, hash of an@example.com) for a check and an INSERT",
          partial(_in_transactions, application_name="signup-api", sql=SIGNUP_LOCK_SQL,
                  hold=SIGNUP_HOLD, pause=SIGNUP_HOLDER_PAUSE)),
    _Play("signup-api", "a second request waits for the same key",
          partial(_in_transactions, application_name="signup-api", sql=SIGNUP_LOCK_SQL,
                  hold=0.0, pause=SIGNUP_WAITER_PAUSE)),
    _Play("bulk-import", "2,000 xact locks (900000, 1..2000) for 20s",
          partial(_in_transactions, application_name="bulk-import", sql=BULK_LOCK_SQL,
                  hold=BULK_HOLD, pause=BULK_PAUSE)),
    _READER,
    _READER,
    _Play("rebalancer", "waits for (2001, 81234) exclusive, gives up after 8s", _rebalancer),
    _Play("payments-worker", "session lock 5550001, unlocked on another pooled connection",
          _payments_worker),
    _holder("leader-elector", "session lock 42 in database billing", LEADER_LOCK_SQL, BILLING_DB),
    _holder("billing-cron", "session lock -6110350855857795459 in database billing",
            BILLING_CRON_LOCK_SQL, BILLING_DB),
    _holder("rails-migrate", "Rails' migration lock on billing: a deploy stuck mid-migration",
            RAILS_MIGRATION_LOCK_SQL, BILLING_DB),
    _holder("Que Locker: *", "3 jobs' session locks on billing, idle while workers run them",
            QUE_LOCKER_SQL, BILLING_DB),
)  # fmt: skip


# The key registry, as docs/configuration.md documents it: what each number means to the
# application.
KEYS = (
    KeyConfig(name="reward_points_cron", text="cron:recalc-reward-points",
              hash="hashtextextended", max_hold=60),
    KeyConfig(name="nightly_billing", key=7310001, max_hold=600),
    KeyConfig(name="signup", namespace=1001),
    KeyConfig(name="account_rebalance", namespace=2001),
    KeyConfig(name="bulk_import", namespace=900000),
    KeyConfig(name="payments_settlement", key=5550001),
    KeyConfig(name="billing_leader", key=42, databases=(BILLING_DB,), long_lived=True,
              expect_held=True),
)  # fmt: skip


def demo_config(web: WebConfig, dsn: str, server_log: Path | None = None) -> Config:
    """The demo's exporter: one target, following the server's log in `server_log` (its
    log_directory) where given."""
    collection = CollectionSettings(
        min_interval=2, statements_interval=60, application_name_rewrites=(POD_SUFFIX,)
    )
    log = None if server_log is None else ServerLogSettings(path=server_log, format="csvlog")
    target = TargetSettings(
        name="demo", dsn=dsn, collection=collection, keys=KEYS, catalog=True, server_log=log
    )
    return Config(web=web, log=LogConfig(), targets=(target,))


def config_file_text(config: Config) -> str:
    """The demo's targets as a configuration file, with their keys, rewrites and settings.

    `check` reads it, so that its report names the keys and applications as the demo's
    exporter does.
    """
    targets = [t.model_dump(mode="json", exclude_defaults=True) for t in config.targets]
    return yaml.safe_dump({"targets": targets}, sort_keys=False)


def check_command(config_file: Path) -> str:
    """The `check` command to paste, working as printed: this very Python, the demo's file.

    Not the bare console script: outside the virtualenv it is not on PATH.
    """
    command = [sys.executable, "-m", "pg_advisory_exporter", "check", "--config.file"]
    return shlex.join([*command, str(config_file)])


def _write_config_file(config: Config, directory: Path) -> Path:
    # The DSN holds the throwaway server's password: the file is for this user alone. It
    # goes with the server's directory when the demo ends.
    path = directory / "exporter.yaml"
    path.touch(mode=0o600)
    path.write_text(config_file_text(config))
    return path


def _start_exporter(config: Config) -> Daemon:
    try:
        daemon = Daemon(config)
    except OSError as exc:
        raise _DemoError(
            f"cannot listen on {config.web.listen_address}: {exc.strerror}; is an exporter "
            "already running there? Pick another address with --web.listen-address"
        ) from None
    daemon.start()
    return daemon


def _stop_on_signals(stop: threading.Event, cleanup: ExitStack) -> None:
    def handler(_signum: int, _frame: FrameType | None) -> None:
        # Event.set() takes a lock the interrupted main thread may be holding.
        threading.Thread(target=stop.set, daemon=True).start()

    for signum in (signal.SIGINT, signal.SIGTERM):
        cleanup.callback(signal.signal, signum, signal.signal(signum, handler))


def _remove(pg: EmbeddedPostgres) -> None:
    pg.cleanup()
    _say(f"stopped, removed {pg.basedir}")


def _say(text: str) -> None:
    print(text, flush=True)


def _complain(text: str) -> None:
    print(f"{PROG}: {text}", file=sys.stderr, flush=True)


def _introduce(daemon: Daemon, report: str) -> None:
    _say("playing:")
    for play in PLAYS:
        _say(f"  {play.who:<22} {play.what}")
    _say(f"metrics:      {daemon.url}")
    _say(f"landing page: {daemon.url.removesuffix(daemon.config.web.telemetry_path)}/")
    _say(f"a report:     {report}")
    _say(f"a summary of the metrics follows every {SUMMARY_INTERVAL:.0f}s; Ctrl-C stops")


def _scrape(url: str) -> list[Sample]:
    with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT) as response:
        text = response.read().decode()
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def _who(sample: Sample) -> str:
    return f"{sample.labels['application_name']} ({sample.labels['datname']})"


def _named(samples: Sequence[Sample], name: str) -> list[Sample]:
    return [s for s in samples if s.name == name]


def _lock_table(samples: Sequence[Sample]) -> str:
    entries = sum(s.value for s in _named(samples, "pg_advisory_lock_table_entries"))
    capacity = sum(s.value for s in _named(samples, "pg_advisory_lock_table_capacity"))
    share = f" of {capacity:,.0f}" if capacity else ""
    percent = f" ({100 * entries / capacity:.1f}%)" if capacity else ""
    return f"lock table: {entries:,.0f}{share} entries{percent}"


def _longest_idle(samples: Sequence[Sample]) -> str:
    idle = _named(samples, "pg_advisory_idle_holder_max_seconds")
    if not idle:
        return "no idle holder"
    top = max(idle, key=lambda s: s.value)
    state = top.labels["state"]
    return f"longest idle holder: {_who(top)}, {state} for {format_age(top.value)}"


def _waiters(samples: Sequence[Sample]) -> str:
    longest = {_who(s): s.value for s in _named(samples, "pg_advisory_wait_max_seconds")}
    waiting = [
        f"{_who(s)} {s.value:.0f} (longest {format_age(longest.get(_who(s)))})"
        for s in _named(samples, "pg_advisory_waiters")
        if s.value > 0
    ]
    return "waiters: " + (", ".join(waiting) or "none")


def _most_locks(samples: Sequence[Sample]) -> str:
    held: dict[str, float] = defaultdict(float)
    for s in _named(samples, "pg_advisory_locks"):
        if s.labels["granted"] == "true":
            held[_who(s)] += s.value
    top = sorted(held.items(), key=lambda item: (-item[1], item[0]))[:3]
    return "most locks held: " + (", ".join(f"{who} {count:,.0f}" for who, count in top) or "none")


def _registered_keys(samples: Sequence[Sample]) -> str:
    held = {s.labels["key"]: s.value for s in _named(samples, "pg_advisory_key_hold_seconds")}
    keys = [
        f"{s.labels['key']} {s.value:.0f}"
        + (f" for {format_age(held[s.labels['key']])}" if s.labels["key"] in held else "")
        for s in _named(samples, "pg_advisory_key_holders")
    ]
    return "key holders: " + (", ".join(keys) or "none")


def _server_log(samples: Sequence[Sample]) -> str:
    unlocks = [
        f"{_who(s)} {s.value:.0f}"
        for s in _named(samples, "pg_advisory_log_unlocks_not_held_total")
        if s.value > 0
    ]
    if not any(s.value == 1 for s in _named(samples, "pg_advisory_log_up")):
        return "server log: not read yet"
    return "server log, unlocks of a lock not held: " + (", ".join(unlocks) or "none")


def _summary(samples: Sequence[Sample]) -> list[str]:
    """A few lines a person can read every few seconds, from one scrape."""
    if not any(s.value == 1 for s in _named(samples, "pg_advisory_up")):
        return ["the exporter cannot collect from the demo server; see the log above"]
    return [
        _lock_table(samples),
        "  " + _longest_idle(samples),
        "  " + _waiters(samples),
        "  " + _most_locks(samples),
        "  " + _registered_keys(samples),
        "  " + _server_log(samples),
    ]


def _print_summary(url: str) -> None:
    stamp = time.strftime("%H:%M:%S")
    try:
        lines = _summary(_scrape(url))
    except OSError as exc:
        lines = [f"cannot scrape {url}: {exc}"]
    _say(f"[{stamp}] " + "\n".join(lines))


def _run(pg_version: int, web: WebConfig, stop: threading.Event, cleanup: ExitStack) -> None:
    _say(f"starting a throwaway PostgreSQL {pg_version} (the first run may download it)")
    pg = EmbeddedPostgres(major=pg_version)
    cleanup.callback(_remove, pg)
    _say(f"data directory: {pg.basedir}")
    config = demo_config(web, pg.dsn(), pg.datadir / SERVER_LOG_DIRECTORY)
    config_file = _write_config_file(config, pg.basedir)
    daemon = _start_exporter(config)
    cleanup.callback(daemon.shutdown)
    pg.start(**SERVER_SETTINGS)
    with pg.connect() as conn:
        conn.execute(f"CREATE DATABASE {BILLING_DB}")
        conn.execute("CREATE EXTENSION pg_stat_statements")
    stage = _Stage(pg, stop)
    cleanup.callback(stage.close)
    for play in PLAYS:
        stage.play(play.who, play.scenario)
    _introduce(daemon, check_command(config_file))
    while not stop.wait(SUMMARY_INTERVAL):
        _print_summary(daemon.url)


def run_demo(pg_version: int, listen_address: str) -> int:
    """Run until SIGINT or SIGTERM, then stop everything and remove the server's files."""
    try:
        web = WebConfig(listen_address=listen_address)
    except ValidationError as exc:
        message = str(exc.errors()[0]["msg"]).removeprefix("Value error, ")
        _complain(f"--web.listen-address: {message}")
        return EXIT_USAGE
    logs.setup("warn", "logfmt")
    stop = threading.Event()
    with ExitStack() as cleanup:
        _stop_on_signals(stop, cleanup)
        try:
            _run(pg_version, web, stop, cleanup)
        except (_DemoError, EmbeddedPostgresError, psycopg.Error) as exc:
            _complain(str(exc))
            return EXIT_FAILED  # the stack cleans up after the message
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Start a throwaway PostgreSQL, play the advisory lock scenarios on it and "
        "export them.",
    )
    parser.add_argument(
        "--web.listen-address",
        dest="listen_address",
        metavar="HOST:PORT",
        default=LISTEN_ADDRESS,
        help=f"where the demo's exporter serves (default {LISTEN_ADDRESS})",
    )
    parser.add_argument(
        "--pg-version",
        type=int,
        default=DEFAULT_MAJOR,
        help=f"PostgreSQL major version (default {DEFAULT_MAJOR})",
    )
    args = parser.parse_args(argv)
    return run_demo(args.pg_version, args.listen_address)


if __name__ == "__main__":
    sys.exit(main())
