"""What one collection costs on a server holding many advisory locks.

Run as `python -m benchmarks.collection_cost [--locks 100000] [--backends 100] [--repeat 100]
[--pg-version 15] [--json PATH]`. It starts a throwaway PostgreSQL, has `--backends` real
connections hold `--locks` session-level advisory locks between them, and then measures:

- the client-side wall time of the exporter's collection statement against the cheapest
  possible read of the same data, `SELECT count(*) FROM pg_locks`, and their ratio: reading
  pg_locks dominates both, so the ratio is what the collection adds. The statement is timed
  in four configurations: without a key registry (`collect_sql(version)`), with an 11-key registry
  (the figure of earlier releases), with the built-in catalog's keys as a server of three
  databases gets them (what a target has by default), and with those plus a 10-key
  registry; and the statement of the `/locks` page, which runs only when a person asks;
- end to end, two real exporters running side by side: one as a target is by default (the
  built-in catalog, on a server of three databases, no registry of its own), one with the
  10-key registry as well. For each, the collection time it reports itself
  (`pg_advisory_exporter_collect_duration_seconds`: the statement, fetching its rows and
  mapping them to series) at each of `--repeat` scrapes, each scrape a real collection
  between two runs of the baseline, the two scraped in turn; and their peak memory (VmHWM).

Progress goes to stderr, results to stdout (and to `--json PATH`). The exit status is 0
whether or not the aims are met: a benchmark reports, it does not judge.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import TupleRow

from benchmarks import positive
from devtools.embedded_postgres import DEFAULT_MAJOR, EmbeddedPostgres, free_port
from pg_advisory_exporter.collect.connection import (
    connect_to_server,
    prepare_session,
    resolve_registry,
    warm_up_session,
)
from pg_advisory_exporter.collect.databases import read_databases
from pg_advisory_exporter.collect.holds import HoldTracker
from pg_advisory_exporter.collect.snapshot import collect_sql, read_snapshot
from pg_advisory_exporter.config.collection import CollectionSettings
from pg_advisory_exporter.config.targets import LocksPageSettings
from pg_advisory_exporter.forensics.read import FORENSICS_SQL, parameters
from pg_advisory_exporter.keys import catalog
from pg_advisory_exporter.keys.catalog_entry import CatalogEntry
from pg_advisory_exporter.keys.key_config import KeyConfig
from pg_advisory_exporter.keys.registry import Registry

Connection = psycopg.Connection[TupleRow]

# -- what is measured -----------------------------------------------------------------------

# One statement per backend takes all of that backend's locks, on a contiguous key range.
TAKE_LOCKS_SQL = "SELECT count(pg_advisory_lock(k)) FROM generate_series(%s::bigint, %s) AS k"
COUNT_ADVISORY_SQL = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
# The floor: pg_locks must be materialised in full (every lock partition copied under its
# lock) for any read of it, so no collection can be cheaper than counting its rows.
BASELINE_SQL = "SELECT count(*) FROM pg_locks"
BASELINE_LABEL = "baseline  SELECT count(*) FROM pg_locks"
SESSION_BASELINE_LABEL = "  the same, on the exporter's session"
COLLECTION_LABEL = "collection, no registry"
FORENSICS_LABEL = "/locks read (on request only)"

# -- how ------------------------------------------------------------------------------------

WARMUP_ROUNDS = 2
APPLICATION_NAMES = 10  # backends are spread over bench-0 .. bench-9
FIRST_KEY = 1
# A registry of the size a team keeps: exact keys (all of them held) and a namespace, so
# that both ways the statement matches keys run. The figure of earlier releases.
BENCH_REGISTRY = [KeyConfig(name=f"job_{i}", key=FIRST_KEY + 997 * i) for i in range(10)] + [
    KeyConfig(name="accounts", namespace=2001)
]
# The databases of the server, for which the catalog's per-database keys are made: the
# built-in catalog as a target of a server of three databases gets it by default, resolved on
# the server as the exporter resolves it (its hashtext() keys computed there). None of its
# keys is held here: the cost of matching is in the 100,000 rows it turns away.
CATALOG_DATABASES = ("postgres", "orders", "billing")
CREATE_DATABASE_SQL = "CREATE DATABASE {}"
# A user's registry next to the catalog: exact bigint keys (held), int pairs and
# namespaces of pairs, the forms the statement matches in different ways.
USER_REGISTRY = [KeyConfig(name=f"job_{i}", key=FIRST_KEY + 997 * i) for i in range(6)] + [
    KeyConfig(name="transfer", pair=(7, 1)),
    KeyConfig(name="import", pair=(-3, 42)),
    KeyConfig(name="accounts", namespace=2001),
    KeyConfig(name="tenants", namespace=-2002),
]
# Lock table headroom over --locks; at least 1.5x is asked for, and the server also needs
# entries for the relation locks its own statements take beyond the fast-path slots.
LOCK_TABLE_HEADROOM = 2.0
# Connections beyond --backends: the timing connection, the exporter's, and spare.
EXTRA_CONNECTIONS = 10
# Server processes that take lock table slots besides max_connections, at their defaults,
# on PostgreSQL 14 to 16 (17 and 18 reserve slightly more, so this errs on the safe side):
# autovacuum_max_workers + the autovacuum launcher + max_worker_processes + max_wal_senders
# + max_prepared_transactions.
OTHER_LOCK_SLOTS = 3 + 1 + 8 + 10 + 0
DEFAULT_MAX_LOCKS_PER_TRANSACTION = 64

EXPORTER_START_TIMEOUT = 60.0  # seconds until /metrics must report the target up
SCRAPE_TIMEOUT = 60.0
EXPORTER_STOP_TIMEOUT = 15.0
EXPORTER_MIN_INTERVAL = "0.001"  # every scrape runs a real collection

UP_METRIC = "pg_advisory_up"
COLLECT_DURATION_METRIC = "pg_advisory_exporter_collect_duration_seconds"
TARGET_LABELS = 'target="default"'

# -- the aims -------------------------------------------------------------------------------

# median(collection) / median(baseline) at most this, without a registry. Judged twice: over
# the baseline as a session with the server's settings runs it (what any other reader of
# pg_locks pays), and over the same count on the exporter's own session (what the statement
# adds to the cheapest read that session can make).
RATIO_AIM = 1.3
CATALOG_RATIO_AIM = 1.5  # median of paired ratios, default catalog + a 10-key registry
# Median of paired ratios: the duration the exporter reports for a target as it is by
# default (the built-in catalog), over the baseline run just before each scrape.
END_TO_END_RATIO_AIM = 1.45
MEMORY_AIM_MB = 80.0  # exporter VmHWM below this


def progress(message: str) -> None:
    print(f"[collection_cost] {message}", file=sys.stderr, flush=True)


# -- the server -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ServerPlan:
    """Server settings chosen so that the locks fit the lock table with headroom."""

    max_connections: int
    max_locks_per_transaction: int
    planned_capacity: int  # by the PostgreSQL 14-16 formula


def plan_server(locks: int, backends: int) -> ServerPlan:
    max_connections = backends + EXTRA_CONNECTIONS
    slots = max_connections + OTHER_LOCK_SLOTS
    per_slot = math.ceil(locks * LOCK_TABLE_HEADROOM / slots)
    max_locks = max(DEFAULT_MAX_LOCKS_PER_TRANSACTION, per_slot)
    return ServerPlan(max_connections, max_locks, max_locks * slots)


def key_ranges(locks: int, backends: int) -> list[tuple[int, int]]:
    """Inclusive, disjoint key ranges, one per backend, whose sizes differ by at most one."""
    base, extra = divmod(locks, backends)
    ranges = []
    start = FIRST_KEY
    for i in range(backends):
        size = base + (1 if i < extra else 0)
        ranges.append((start, start + size - 1))
        start += size
    return ranges


def hold_locks(
    pg: EmbeddedPostgres, locks: int, backends: int, stack: contextlib.ExitStack
) -> None:
    """Open the backends and have each take its share of the locks; they hold them until
    the stack closes."""
    for i, (first, last) in enumerate(key_ranges(locks, backends)):
        conn = psycopg.connect(
            pg.dsn(), autocommit=True, application_name=f"bench-{i % APPLICATION_NAMES}"
        )
        stack.enter_context(conn)
        row = conn.execute(TAKE_LOCKS_SQL, (first, last)).fetchone()
        assert row is not None
        if row[0] != last - first + 1:
            raise RuntimeError(f"backend {i} took {row[0]} locks, not {last - first + 1}")
        if (i + 1) % max(1, backends // 5) == 0 or i + 1 == backends:
            progress(f"  {i + 1}/{backends} backends hold their locks")


def scalar(conn: Connection, sql: str) -> Any:
    row = conn.execute(sql).fetchone()
    assert row is not None
    return row[0]


# -- the statement timings ------------------------------------------------------------------


@dataclass(frozen=True)
class Configuration:
    """One way a statement is run: the collection with a registry's keys, or none; or the
    /locks page's read, which runs only when a person asks."""

    label: str
    keys: int
    sql: str
    parameters: dict[str, Any] | None = None


def configurations(conn: Connection) -> list[Configuration]:
    databases = read_databases(conn)
    # The collection statement reads the deadlocks of the databases the exporter lists.
    listed = {"databases": list(databases.worked_in)}

    def resolve(configs: list[KeyConfig], entries: Sequence[CatalogEntry] = ()) -> Registry:
        return resolve_registry(conn, configs, entries, progress, databases)[0]

    default = resolve([], catalog.DEFAULTS)
    with_registry = resolve(USER_REGISTRY, catalog.DEFAULTS)
    version = conn.info.server_version
    return [
        Configuration(COLLECTION_LABEL, 0, collect_sql(version), listed),
        Configuration(
            f"{len(BENCH_REGISTRY)}-key registry",
            len(BENCH_REGISTRY),
            collect_sql(version, resolve(BENCH_REGISTRY)),
            listed,
        ),
        Configuration(
            FORENSICS_LABEL,
            0,
            FORENSICS_SQL,
            parameters(LocksPageSettings()),
        ),
        Configuration(
            f"default catalog ({len(default.keys)})",
            len(default.keys),
            collect_sql(version, default),
            listed,
        ),
        Configuration(
            f"default catalog ({len(default.keys)}) + {len(USER_REGISTRY)}-key registry",
            len(with_registry.keys),
            collect_sql(version, with_registry),
            listed,
        ),
    ]


@dataclass(frozen=True)
class Series:
    """One configuration's client-side wall times in milliseconds, run i in round i."""

    configuration: Configuration
    ms: list[float]
    rows: int


@dataclass(frozen=True)
class Timings:
    """The baseline's times and each configuration's, run in the same rounds."""

    baseline_ms: list[float]
    series: list[Series]
    # The baseline run on the exporter's session too, in the same rounds: the floor of a read
    # of pg_locks with that session's work_mem, which the statements' rows are read back in.
    session_baseline_ms: list[float]

    @property
    def baseline_median_ms(self) -> float:
        return statistics.median(self.baseline_ms)

    @property
    def session_baseline_median_ms(self) -> float:
        return statistics.median(self.session_baseline_ms)

    def same_session_ratio(self, series: Series) -> float:
        """Median over the median of the baseline on the statement's own session: what the
        statement adds to the cheapest read of pg_locks that session can make."""
        return self.median_ms(series) / self.session_baseline_median_ms

    def median_ms(self, series: Series) -> float:
        return statistics.median(series.ms)

    def ratio(self, series: Series) -> float:
        """Median over median."""
        return self.median_ms(series) / self.baseline_median_ms

    def paired_ratio_median(self, series: Series) -> float:
        """Median of each round's ratio: the least sensitive to drifting machine load."""
        pairs = zip(self.baseline_ms, series.ms, strict=True)
        return statistics.median([c / b for b, c in pairs])

    @property
    def collection(self) -> Series:
        return self.series[0]

    @property
    def catalog(self) -> Series:
        return self.series[-1]


def time_hold_tracking(conn: Connection, repeat: int) -> list[float]:
    """How long the exporter takes to track the holds of one collection (collect/holds.py),
    with the default catalog and the 10-key registry, `repeat` times on one snapshot: every
    hold known from the second on, as between the collections of a steady server."""
    databases = read_databases(conn)
    registry = resolve_registry(conn, USER_REGISTRY, catalog.DEFAULTS, progress, databases)[0]
    snapshot = read_snapshot(conn, registry, databases)
    tracker = HoldTracker()
    found: list[float] = []
    for _ in range(WARMUP_ROUNDS + repeat):
        started = time.perf_counter()
        holds = tracker.update(snapshot, registry)
        found.append((time.perf_counter() - started) * 1000.0)
    if not holds.by_key:
        raise RuntimeError("no hold was tracked: the benchmark's backends hold no lock")
    return found[WARMUP_ROUNDS:]


def _timed(run: Callable[[], int]) -> tuple[float, int]:
    started = time.perf_counter()
    rows = run()
    return (time.perf_counter() - started) * 1000.0, rows


@contextlib.contextmanager
def exporter_session(dsn: str) -> Iterator[Connection]:
    """A connection readied as the exporter readies its own (collect/connection.py): its
    session settings, work_mem among them, and its backend warmed up as before a collection
    of a large table. The statements are timed on it, so they cost what they cost the
    exporter; the baseline runs on a session with the server's settings, as any other
    reader of pg_locks runs it."""
    settings = CollectionSettings()
    with connect_to_server(dsn, settings, "bench-exporter-session") as conn:
        prepare_session(conn, settings, note=progress, names=False)
        warm_up_session(conn)
        yield conn


def time_statements(conn: Connection, session: Connection, repeat: int) -> Timings:
    """Time the baseline (on `conn`) and each configuration (on the exporter's `session`),
    interleaved, `repeat` times each."""

    def runner(
        on: Connection, sql: str, parameters: dict[str, Any] | None = None
    ) -> Callable[[], int]:
        cur = on.cursor()
        return lambda: len(cur.execute(sql, parameters).fetchall())

    baseline = runner(conn, BASELINE_SQL)
    session_baseline = runner(session, BASELINE_SQL)
    configs = configurations(conn)
    runs = [runner(session, config.sql, config.parameters) for config in configs]

    # Interleaved, not one series after the other: this machine has 2 cores shared with
    # noisy neighbours (and our own 100 idle backends, the autovacuum launcher, ...), so
    # the CPU time available drifts over seconds. Two back-to-back series would each see a
    # different stretch of that drift, and their ratio would measure the neighbours as much
    # as the statements. Alternating makes every statement sample the same conditions, so
    # a slow stretch slows all of them and the ratios, the figures that matter, stay put.
    # Each round starts with the baseline, its pair for every configuration, then runs the
    # configurations starting one further each time, so none always follows the baseline.
    baseline_ms: list[float] = []
    session_baseline_ms: list[float] = []
    times: list[list[float]] = [[] for _ in configs]
    rows = [0 for _ in configs]
    for round_ in range(WARMUP_ROUNDS + repeat):
        b_ms, _ = _timed(baseline)
        s_ms, _ = _timed(session_baseline)
        order = [(round_ + i) % len(configs) for i in range(len(configs))]
        measured = {i: _timed(runs[i]) for i in order}
        if round_ >= WARMUP_ROUNDS:
            baseline_ms.append(b_ms)
            session_baseline_ms.append(s_ms)
            for i, (ms, count) in measured.items():
                times[i].append(ms)
                rows[i] = count
    return Timings(
        baseline_ms,
        [Series(config, ms, count) for config, ms, count in zip(configs, times, rows, strict=True)],
        session_baseline_ms,
    )


# -- the exporter process -------------------------------------------------------------------


@dataclass(frozen=True)
class ExporterRun:
    """The real exporter, scraped `scrapes` times after it first reported the target up,
    each scrape between two runs of the baseline."""

    label: str  # what the target is configured with
    scrapes: int
    peak_rss_mb: float  # VmHWM
    rss_mb: float  # VmRSS at the end
    collect_duration_ms: list[float]  # as the exporter reports them
    baseline_ms: list[float]  # the mean of the baseline runs just before and after each scrape
    # The same on a session readied as the exporter's, run beside each baseline.
    session_baseline_ms: list[float]
    scrape_median_ms: float  # client side, HTTP included

    @property
    def collect_duration_median_ms(self) -> float:
        return statistics.median(self.collect_duration_ms)

    @property
    def baseline_median_ms(self) -> float:
        return statistics.median(self.baseline_ms)

    @property
    def paired_ratio_median(self) -> float:
        pairs = zip(self.baseline_ms, self.collect_duration_ms, strict=True)
        return statistics.median([c / b for b, c in pairs])

    @property
    def same_session_paired_ratio_median(self) -> float:
        pairs = zip(self.session_baseline_ms, self.collect_duration_ms, strict=True)
        return statistics.median([c / b for b, c in pairs])


def _sample(text: str, name: str) -> float | None:
    """The value of `name{target="default"}` in a text exposition, if there."""
    match = re.search(
        rf"^{re.escape(name)}\{{{re.escape(TARGET_LABELS)}\}} (\S+)$", text, re.MULTILINE
    )
    return float(match.group(1)) if match else None


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT) as response:
        body: bytes = response.read()
    return body.decode()


def _proc_status_mb(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            value, unit = line.split()[1:3]
            assert unit == "kB"
            return int(value) / 1024.0
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


def _wait_until_up(process: subprocess.Popen[bytes], url: str, log_path: Path) -> None:
    deadline = time.monotonic() + EXPORTER_START_TIMEOUT
    while True:
        if process.poll() is not None:
            raise RuntimeError(
                f"the exporter exited with status {process.returncode}:\n"
                + log_path.read_text()[-2000:]
            )
        with contextlib.suppress(OSError):  # not listening yet, or a slow answer
            if _sample(_scrape(url), UP_METRIC) == 1.0:
                return
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"the exporter did not report {UP_METRIC}{{{TARGET_LABELS}}} 1 within "
                f"{EXPORTER_START_TIMEOUT:.0f}s:\n" + log_path.read_text()[-2000:]
            )
        time.sleep(0.2)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    process.terminate()  # SIGTERM: the exporter shuts down cleanly
    try:
        process.wait(timeout=EXPORTER_STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        progress("the exporter ignored SIGTERM; killing it")
        process.kill()
        process.wait()


@dataclass(frozen=True)
class ExporterSetup:
    """How the exporter's one target is configured for an end-to-end run."""

    label: str
    keys: Sequence[KeyConfig]


# The built-in catalog is on by default: the first is what a target has when nothing but
# its DSN is given.
EXPORTER_SETUPS = (
    ExporterSetup("default (built-in catalog)", ()),
    ExporterSetup(f"default + {len(USER_REGISTRY)}-key registry", USER_REGISTRY),
)


def exporter_config(dsn: str, keys: Sequence[KeyConfig]) -> dict[str, Any]:
    """The exporter's configuration file: one target, `keys` if any, and the built-in
    catalog at its default (on)."""
    config: dict[str, Any] = {"targets": [{"name": "default", "dsn": dsn}]}
    if keys:
        config["keys"] = [key.model_dump(mode="json", exclude_defaults=True) for key in keys]
    return config


@dataclass(frozen=True)
class _Exporter:
    """One running exporter process, configured with `setup`."""

    setup: ExporterSetup
    process: subprocess.Popen[bytes]
    url: str

    def scrape(self) -> tuple[float, float]:
        """One scrape, one real collection: its duration as the exporter reports it, and
        the scrape's wall time (HTTP included), in ms."""
        started = time.perf_counter()
        text = _scrape(self.url)
        elapsed_ms = (time.perf_counter() - started) * 1000.0
        if _sample(text, UP_METRIC) != 1.0:
            raise RuntimeError(f"{self.setup.label}: the exporter reports the target down")
        duration = _sample(text, COLLECT_DURATION_METRIC)
        if duration is None:
            raise RuntimeError(f"{self.setup.label}: no {COLLECT_DURATION_METRIC}")
        return duration * 1000.0, elapsed_ms


@contextlib.contextmanager
def _running_exporter(dsn: str, setup: ExporterSetup) -> Iterator[_Exporter]:
    """The real exporter, up and reporting its target, stopped at the end."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    root = Path(__file__).resolve().parent.parent
    with contextlib.ExitStack() as files:
        # JSON is YAML: the exporter reads it as its configuration file.
        config = files.enter_context(
            tempfile.NamedTemporaryFile("w", prefix="collection-cost-", suffix=".yml")
        )
        config.write(json.dumps(exporter_config(dsn, setup.keys)))
        config.flush()
        log = files.enter_context(
            tempfile.NamedTemporaryFile(prefix="collection-cost-exporter-", suffix=".log")
        )
        command = [
            sys.executable, "-m", "pg_advisory_exporter", "--config.file", config.name,
            "--web.listen-address", f"127.0.0.1:{port}",
            "--collection.min-interval", EXPORTER_MIN_INTERVAL,
        ]  # fmt: skip
        process = subprocess.Popen(command, cwd=root, stdout=log, stderr=subprocess.STDOUT)
        try:
            _wait_until_up(process, url, Path(log.name))
            progress(f"exporter (pid {process.pid}, {setup.label}) is up at {url}")
            yield _Exporter(setup, process, url)
        finally:
            _stop(process)


def run_end_to_end(
    dsn: str, repeat: int, baseline: Callable[[], tuple[float, float]]
) -> tuple[ExporterRun, ...]:
    """An exporter per EXPORTER_SETUPS, all running, scraped in turn `repeat` times each
    (after warm-up), each scrape between two runs of `baseline` (its times in ms, on a
    session with the server's settings and on one readied as the exporter's)."""
    with contextlib.ExitStack() as running:
        exporters = [running.enter_context(_running_exporter(dsn, s)) for s in EXPORTER_SETUPS]
        progress(
            f"scraping each exporter {WARMUP_ROUNDS} + {repeat} times, in turn, each scrape "
            "between two runs of the baseline"
        )
        durations: list[list[float]] = [[] for _ in exporters]
        baselines: list[list[float]] = [[] for _ in exporters]
        session_baselines: list[list[float]] = [[] for _ in exporters]
        walls: list[list[float]] = [[] for _ in exporters]
        # Each scrape is compared with the mean of the baseline runs just before and just
        # after it: the floor as it was while the collection ran, whichever way the
        # machine's load drifted. All setups are scraped in the same rounds, each round
        # starting with the next one, so that they see the same stretches of that load
        # and none always comes first.
        for round_ in range(-WARMUP_ROUNDS, repeat):
            first = round_ % len(exporters)
            before = baseline()
            for i in [*range(first, len(exporters)), *range(first)]:
                duration_ms, wall_ms = exporters[i].scrape()
                after = baseline()
                if round_ >= 0:
                    durations[i].append(duration_ms)
                    baselines[i].append((before[0] + after[0]) / 2)
                    session_baselines[i].append((before[1] + after[1]) / 2)
                    walls[i].append(wall_ms)
                before = after
        return tuple(
            ExporterRun(
                label=exporter.setup.label,
                scrapes=repeat,
                peak_rss_mb=_proc_status_mb(exporter.process.pid, "VmHWM"),
                rss_mb=_proc_status_mb(exporter.process.pid, "VmRSS"),
                collect_duration_ms=durations[i],
                baseline_ms=baselines[i],
                session_baseline_ms=session_baselines[i],
                scrape_median_ms=statistics.median(walls[i]),
            )
            for i, exporter in enumerate(exporters)
        )


# -- the report -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Result:
    locks: int
    backends: int
    server_version: str
    max_connections: int
    max_locks_per_transaction: int
    lock_table_capacity: int | None
    timings: Timings
    exporters: tuple[ExporterRun, ...]  # one per EXPORTER_SETUPS, the default first
    # The exporter's own hold tracking (collect/holds.py) of one collection, in ms, with the
    # default catalog and the 10-key registry (whose keys are held): what it adds to each.
    hold_tracking_ms: list[float]

    @property
    def exporter(self) -> ExporterRun:
        """The exporter as a target is by default: the run the end-to-end aim is about."""
        return self.exporters[0]

    @property
    def ratio_met(self) -> bool:
        return self.timings.ratio(self.timings.collection) <= RATIO_AIM

    @property
    def same_session_ratio_met(self) -> bool:
        return self.timings.same_session_ratio(self.timings.collection) <= RATIO_AIM

    @property
    def catalog_ratio_met(self) -> bool:
        return self.timings.paired_ratio_median(self.timings.catalog) <= CATALOG_RATIO_AIM

    @property
    def end_to_end_met(self) -> bool:
        return self.exporter.paired_ratio_median <= END_TO_END_RATIO_AIM

    @property
    def memory_met(self) -> bool:
        return all(e.peak_rss_mb < MEMORY_AIM_MB for e in self.exporters)

    def as_json(self) -> dict[str, Any]:
        t, e = self.timings, self.exporter
        return {
            "locks": self.locks,
            "backends": self.backends,
            "server_version": self.server_version,
            "max_connections": self.max_connections,
            "max_locks_per_transaction": self.max_locks_per_transaction,
            "lock_table_capacity": self.lock_table_capacity,
            "repeat": len(t.baseline_ms),
            "warmup_rounds": WARMUP_ROUNDS,
            "baseline_median_ms": t.baseline_median_ms,
            "baseline_ms": t.baseline_ms,
            "session_baseline_median_ms": t.session_baseline_median_ms,
            "session_baseline_ms": t.session_baseline_ms,
            "configurations": [
                {
                    "label": series.configuration.label,
                    "registry_keys": series.configuration.keys,
                    "median_ms": t.median_ms(series),
                    "ratio": t.ratio(series),
                    "paired_ratio_median": t.paired_ratio_median(series),
                    "same_session_ratio": t.same_session_ratio(series),
                    "rows": series.rows,
                    "ms": series.ms,
                }
                for series in t.series
            ],
            "ratio_aim": RATIO_AIM,
            "ratio_aim_met": self.ratio_met,
            "same_session_ratio_aim_met": self.same_session_ratio_met,
            "catalog_ratio_aim": CATALOG_RATIO_AIM,
            "catalog_ratio_aim_met": self.catalog_ratio_met,
            "exporters": [asdict(run) for run in self.exporters],
            "end_to_end_paired_ratio_median": e.paired_ratio_median,
            "end_to_end_same_session_paired_ratio_median": e.same_session_paired_ratio_median,
            "end_to_end_ratio_aim": END_TO_END_RATIO_AIM,
            "end_to_end_ratio_aim_met": self.end_to_end_met,
            "memory_aim_mb": MEMORY_AIM_MB,
            "memory_aim_met": self.memory_met,
            "hold_tracking_median_ms": statistics.median(self.hold_tracking_ms),
            "hold_tracking_ms": self.hold_tracking_ms,
        }


def _verdict(met: bool) -> str:
    return "met" if met else "NOT MET"


def format_report(result: Result) -> str:
    t, e = result.timings, result.exporter
    runs = len(t.baseline_ms)
    capacity = (
        f", lock table ~{result.lock_table_capacity:,} entries"
        if result.lock_table_capacity
        else ""
    )
    width = 44
    aims = {
        t.collection.configuration.label: f"aim: ratio <= {RATIO_AIM}: "
        f"{_verdict(result.ratio_met)}, over the same session's: "
        f"{_verdict(result.same_session_ratio_met)}",
        t.catalog.configuration.label: f"aim: paired <= {CATALOG_RATIO_AIM}: "
        f"{_verdict(result.catalog_ratio_met)}",
    }
    lines = [
        f"advisory locks held: {result.locks:,} across {result.backends} backends "
        f"(PostgreSQL {result.server_version}{capacity})",
        f"{BASELINE_LABEL:<{width}} median {t.baseline_median_ms:5.1f} ms ({runs} runs, "
        "interleaved with each line below; a session with the server's settings)",
        f"{SESSION_BASELINE_LABEL:<{width}} median {t.session_baseline_median_ms:5.1f} ms "
        f"({t.session_baseline_median_ms / t.baseline_median_ms:.2f} of it; the statements "
        "below run on that session)",
    ]
    for series in t.series:
        label = series.configuration.label
        aim = f"; {aims[label]}" if label in aims else ""
        lines.append(
            f"{label:<{width}} median {t.median_ms(series):5.1f} ms, ratio "
            f"{t.ratio(series):.2f}, median of paired ratios "
            f"{t.paired_ratio_median(series):.2f}, over the same session's "
            f"{t.same_session_ratio(series):.2f} ({series.rows} rows{aim})"
        )
    tracking = statistics.median(result.hold_tracking_ms)
    lines.append(
        f"{'hold tracking (the exporter, per collection)':<{width}} median {tracking:5.2f} ms, "
        f"ratio {tracking / t.baseline_median_ms:.4f} ({len(result.hold_tracking_ms)} runs)"
    )
    peaks = ", ".join(f"{run.peak_rss_mb:.1f}" for run in result.exporters)
    lines.append(
        f"{'exporter peak memory (VmHWM)':<{width}} {peaks} MB "
        f"(aim: < {MEMORY_AIM_MB:.0f} MB: {_verdict(result.memory_met)}) "
        f"after {e.scrapes} scrapes each"
    )
    for run in result.exporters:
        aim = (
            f"; aim: paired <= {END_TO_END_RATIO_AIM}: {_verdict(result.end_to_end_met)}"
            if run is e
            else ""
        )
        lines += [
            f"{'end to end, ' + run.label:<{width}} median "
            f"{run.collect_duration_median_ms:5.1f} ms over baseline median "
            f"{run.baseline_median_ms:5.1f} ms, median of paired ratios "
            f"{run.paired_ratio_median:.2f}, over the same session's "
            f"{run.same_session_paired_ratio_median:.2f} ({run.scrapes} scrapes{aim})",
            f"{'':<{width}} (the exporter's collect duration, {len(CATALOG_DATABASES)} "
            f"databases; scrape median {run.scrape_median_ms:.1f} ms, HTTP included)",
        ]
    return "\n".join(lines)


# -- the command ----------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.collection_cost",
        description="Measure the exporter's collection cost and memory on many advisory locks.",
    )
    parser.add_argument("--locks", type=positive, default=100_000, help="advisory locks held")
    parser.add_argument("--backends", type=positive, default=100, help="backends holding them")
    parser.add_argument("--repeat", type=positive, default=100, help="timed runs and scrapes")
    parser.add_argument("--pg-version", type=int, default=DEFAULT_MAJOR, help="major version")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the figures here")
    args = parser.parse_args(argv)
    if args.backends > args.locks:
        parser.error("--backends must not exceed --locks (each backend holds at least one)")
    return args


def run(locks: int, backends: int, repeat: int, pg_version: int) -> Result:
    plan = plan_server(locks, backends)
    progress(
        f"starting PostgreSQL {pg_version}: max_connections={plan.max_connections}, "
        f"max_locks_per_transaction={plan.max_locks_per_transaction} "
        f"(~{plan.planned_capacity:,} lock table entries for {locks:,} locks)"
    )
    pg = EmbeddedPostgres(major=pg_version)
    try:
        pg.start(
            max_connections=plan.max_connections,
            max_locks_per_transaction=plan.max_locks_per_transaction,
        )
        with contextlib.ExitStack() as stack:
            timing_conn = stack.enter_context(pg.connect(application_name="bench-timing"))
            for datname in CATALOG_DATABASES:  # the databases the catalog's keys are made for
                if datname != timing_conn.info.dbname:
                    timing_conn.execute(CREATE_DATABASE_SQL.format(datname))
            snapshot = read_snapshot(timing_conn)
            version = snapshot.server_version
            capacity = snapshot.lock_table_capacity
            progress(f"PostgreSQL {version} up; {backends} backends take {locks:,} locks")
            started = time.monotonic()
            hold_locks(pg, locks, backends, stack)
            held = scalar(timing_conn, COUNT_ADVISORY_SQL)
            if held != locks:
                raise RuntimeError(f"pg_locks shows {held} advisory locks, not {locks}")
            progress(f"{held:,} advisory locks held ({time.monotonic() - started:.1f}s)")

            progress(f"timing, interleaved: {WARMUP_ROUNDS} warm-up + {repeat} rounds")
            with exporter_session(pg.dsn()) as session:
                timings = time_statements(timing_conn, session, repeat)
                tracking = time_hold_tracking(timing_conn, repeat)
                progress("starting the exporters")
                exporters = run_end_to_end(
                    pg.dsn(),
                    repeat,
                    lambda: (
                        _timed(lambda: scalar(timing_conn, BASELINE_SQL))[0],
                        _timed(lambda: scalar(session, BASELINE_SQL))[0],
                    ),
                )
            progress("closing the backends")
        return Result(
            locks=locks,
            backends=backends,
            server_version=version,
            max_connections=plan.max_connections,
            max_locks_per_transaction=plan.max_locks_per_transaction,
            lock_table_capacity=capacity,
            timings=timings,
            exporters=exporters,
            hold_tracking_ms=tracking,
        )
    finally:
        pg.cleanup()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args.locks, args.backends, args.repeat, args.pg_version)
    print(format_report(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result.as_json(), indent=2) + "\n")
        progress(f"figures written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
