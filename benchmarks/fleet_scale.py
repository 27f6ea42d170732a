"""What one exporter can serve: collections per second, a large fleet against its timeout,
what each server costs, and what reading a server once for all of its names saves.

Run as `python -m benchmarks.fleet_scale [--targets 10000] [--healthy 100] [--timeout 10]
[--scrapes 5] [--per-target 1000] [--names 100] [--pg-version 15] [--json PATH]`.

The exporter reads a server once per collection however many targets name it: targets whose
DSNs name one host and port share one server, and targets that reach one server under other
addresses are merged by its identity. So N targets of one throwaway server are one
collection, not a fleet; and N PostgreSQL servers are too many for this machine (2 cores).
It starts one throwaway PostgreSQL and makes the fleet out of it where that stays true:

- Servers that are down or hung are distinct for real. Each refusing target has an address
  of its own, 127.0.X.Y (any address of 127.0.0.0/8 reaches this host) at one port where
  nothing listens; each hung target a listening socket of its own, on 127.0.0.1 at a port
  of its own, that accepts connections and never answers.
- Healthy servers are the throwaway server read by `benchmarks.fleet_exporter`: the real
  daemon in a subprocess, scraped over HTTP, with one change, that each of its targets gets
  a server of its own (a connection and collections of its own), as N distinct servers
  would. The exporter's side of N servers is then what it is in production: N connections,
  N collections run, mapped and rendered at each scrape. The servers' side is not: the N
  reads of pg_locks run on the one throwaway server, on the same 2 cores as the exporter
  and seeing the other targets' connections, where N servers would each run their own read
  on their own machine. So wall-clock times are on the slow side; CPU times are the
  exporter process's own. The server holds no advisory locks: a collection maps an idle
  server. Parts 1 and 3 check at each scrape that every target is up and answers for a
  server of its own.

Parts 1 to 3 run `benchmarks.fleet_exporter`, part 4 `pg-advisory-exporter` itself (and the
former beside it).

The parts:

1. Throughput. `--healthy` servers; `min_interval` is 1ms, so every scrape collects every
   one. The baseline, in the same run, is a one-server scrape: the ratio of a collection's
   share of the fleet scrape to that baseline shows what the pool adds or saves, and
   collections per second bound the fleet that answers within a scrape timeout.
2. A fleet of `--targets`: `--healthy` healthy servers, 1% hung and the rest refusing
   connections (servers that are down). Each /metrics scrape carries
   `X-Prometheus-Scrape-Timeout-Seconds: --timeout`; while it runs, a /probe of one healthy
   target is timed. Start-up time and memory are reported too.
3. What each healthy server costs: `--per-target` of them (0 skips the part), every one
   collected at each scrape, against a one-server exporter in the same run. The memory a
   server adds is the growth of the exporter's RSS, read from /proc in its own process: it
   holds libpq's buffers and the threads as well as Python's objects, where tracemalloc
   would see Python's allocations only, and in this process the benchmark's own. The CPU
   time of one collection is the process's user and system time over the scrapes, divided
   by the collections, with what that makes at a 15 s interval. The scrape of them all is
   timed too: collections per second at that size, measured rather than estimated.
4. What reading a server once saves: `--names` targets that name the throwaway server (0
   skips the part), through `pg-advisory-exporter` itself, against one name, and against
   the same names each read on its own (as distinct servers are read, and as every target
   was before the exporter shared them), in the same run: the /metrics scrape's time, the
   exporter's connections at the server, and the reads of pg_locks the server saw per
   scrape, counted in its log (the role of this part has every statement logged).

Progress goes to stderr, results to stdout (and to `--json PATH`). A benchmark reports, it
does not judge.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from devtools.embedded_postgres import DEFAULT_MAJOR, EmbeddedPostgres, free_port
from pg_advisory_exporter.collect.kept_connection import APPLICATION_NAME

from .collection_cost import _proc_status_mb, _stop

ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT = 120.0
HEALTHY_PREFIX = "healthy-"
# What runs the targets: the exporter itself, or its daemon with a server per target.
EXPORTER = "pg_advisory_exporter"
DISTINCT_SERVERS = "benchmarks.fleet_exporter"
# The roles the exporters connect as: the second has its every statement logged.
MONITOR = "fleet_monitor"
LOGGED_MONITOR = "fleet_monitor_logged"
COLLECTION = "WITH lock_groups AS ("  # the collection statement's first CTE, and only its
# Refusing targets' addresses: 127.0.X.Y with X from 0 and Y from 2 to 251.
ADDRESSES_PER_BLOCK = 250
MAX_REFUSING = 256 * ADDRESSES_PER_BLOCK
SILENT_BACKLOG = 64  # connections a hung server holds unanswered
BETWEEN_FLEET_SCRAPES = 2.0  # seconds


def progress(message: str) -> None:
    print(f"[fleet_scale] {message}", file=sys.stderr, flush=True)


def _get(url: str, timeout: float, headers: dict[str, str] | None = None) -> tuple[float, str]:
    started = time.perf_counter()
    request = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(request, timeout=timeout + 30) as response:
        body: bytes = response.read()
    return time.perf_counter() - started, body.decode()


def _collect_into(
    answers: list[tuple[float, str]], url: str, timeout: float, headers: dict[str, str]
) -> None:
    answers.append(_get(url, timeout, headers))


@dataclass(frozen=True)
class Scraped:
    """What one /metrics answer says of its targets."""

    up: dict[str, float]  # pg_advisory_up by target
    servers: int  # targets that answer for a server: those that carry its collection's time

    @property
    def up_count(self) -> int:
        return int(sum(self.up.values()))


def _scraped(text: str) -> Scraped:
    up: dict[str, float] = {}
    servers = 0
    for family in text_string_to_metric_families(text):
        if family.name == "pg_advisory_up":
            up = {sample.labels["target"]: sample.value for sample in family.samples}
        elif family.name == "pg_advisory_exporter_collect_duration_seconds":
            servers = len(family.samples)
    return Scraped(up, servers)


def _all_up(text: str, count: int, servers: int | None = None) -> Scraped:
    """The answer, if every one of `count` targets is up (and `servers` answer for one)."""
    scraped = _scraped(text)
    if len(scraped.up) != count or scraped.up_count != count:
        raise RuntimeError(f"{count - scraped.up_count} of {count} healthy targets are down")
    if servers is not None and scraped.servers != servers:
        raise RuntimeError(f"{scraped.servers} targets answer for a server, not {servers}")
    return scraped


@contextlib.contextmanager
def _silent_port() -> Iterator[int]:
    """A port that accepts connections and never answers, like a hung server."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(SILENT_BACKLOG)
        yield sock.getsockname()[1]


@contextlib.contextmanager
def _exporter(
    targets: dict[str, str], min_interval: str, program: str = DISTINCT_SERVERS
) -> Iterator[tuple[str, float, int]]:
    """The running exporter (`program`, a module): its base URL, its start-up seconds (to
    its first answer over HTTP) and its pid."""
    port = free_port()
    config = {
        "web": {"listen_address": f"127.0.0.1:{port}"},
        "collection": {"min_interval": min_interval, "connect_timeout": "10s"},
        "targets": [{"name": name, "dsn": dsn} for name, dsn in targets.items()],
    }
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="fleet-scale-") as folder:
        config_path = Path(folder) / "config.yaml"
        config_path.write_text(yaml.safe_dump(config))
        log_path = Path(folder) / "exporter.log"
        if program == EXPORTER:
            command = [sys.executable, "-m", program, "--config.file", str(config_path)]
        else:
            command = [sys.executable, "-m", program, str(config_path)]
        started = time.perf_counter()
        with log_path.open("wb") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        try:
            while True:
                if process.poll() is not None:
                    raise RuntimeError(f"the exporter exited:\n{log_path.read_text()[-2000:]}")
                with contextlib.suppress(OSError):
                    _get(base + "/", 5)
                    break
                if time.perf_counter() - started > START_TIMEOUT:
                    raise RuntimeError("the exporter did not start listening")
                time.sleep(0.05)
            yield base, time.perf_counter() - started, process.pid
        finally:
            _stop(process)


def _connections(pg: EmbeddedPostgres, role: str) -> int:
    """The exporter's connections that the server has now, as `role`."""
    with pg.connect() as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE usename = %s AND application_name = %s",
            (role, APPLICATION_NAME),
        ).fetchone()
    assert row is not None
    return int(row[0])


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def throughput(pg: EmbeddedPostgres, dsn: str, healthy: int, scrapes: int) -> dict[str, Any]:
    medians: dict[int, float] = {}
    connections = 0
    for count in (1, healthy):
        progress(f"throughput: {_plural(count, 'server')}, {scrapes} scrapes")
        targets = {f"{HEALTHY_PREFIX}{i}": dsn for i in range(count)}
        with _exporter(targets, "1ms") as (base, _, _):
            _get(base + "/metrics", 60)  # connect them all
            times = []
            for _ in range(scrapes):
                seconds, text = _get(base + "/metrics", 60)
                _all_up(text, count, servers=count)
                times.append(seconds)
            connections = _connections(pg, MONITOR)
        medians[count] = statistics.median(times)
    single, fleet = medians[1], medians[healthy]
    per_collection = fleet / healthy
    print(
        f"throughput: {healthy} healthy servers ({connections} connections at the server, one "
        f"per target), median of {scrapes} scrapes"
    )
    rows = [
        ("baseline  one server's scrape", single),
        (f"fleet     {healthy} servers' scrape", fleet),
    ]
    width = max(len(label) for label, _ in rows)
    for label, seconds in rows:
        print(f"  {label:<{width}}  {seconds * 1000:8.1f} ms")
    print(f"  per collection {per_collection * 1000:.2f} ms, ratio to baseline "
          f"{per_collection / single:.2f}; {healthy / fleet:.0f} collections/s")  # fmt: skip
    return {
        "servers": healthy,
        "connections": connections,
        "baseline_scrape_ms": single * 1000,
        "fleet_scrape_ms": fleet * 1000,
        "per_collection_ms": per_collection * 1000,
        "ratio_to_baseline": per_collection / single,
        "collections_per_second": healthy / fleet,
    }


def _refusing(count: int) -> dict[str, str]:
    """`count` servers that refuse connections, each at an address of its own."""
    port = free_port()
    return {
        f"refused-{i}": (
            f"host=127.0.{i // ADDRESSES_PER_BLOCK}.{i % ADDRESSES_PER_BLOCK + 2} port={port} "
            "user=x dbname=x"
        )
        for i in range(count)
    }


def fleet(dsn: str, size: int, healthy: int, timeout: float, scrapes: int) -> dict[str, Any]:
    hanging = max(1, size // 100)
    refusing = max(0, size - healthy - hanging)
    with contextlib.ExitStack() as silent:
        ports = [silent.enter_context(_silent_port()) for _ in range(hanging)]
        targets = {f"{HEALTHY_PREFIX}{i}": dsn for i in range(healthy)}
        targets |= {f"hung-{i}": f"host=127.0.0.1 port={p} user=x dbname=x" for i, p in
                    enumerate(ports)}  # fmt: skip
        targets |= _refusing(refusing)
        progress(f"fleet: {len(targets)} targets, {scrapes} scrapes of {timeout:g} s at most")
        with _exporter(targets, "5s") as (base, startup, pid):
            print(
                f"fleet: {len(targets)} targets, each a server of its own ({healthy} healthy, "
                f"{hanging} hung, {refusing} refusing)"
            )
            rss = _proc_status_mb(pid, "VmRSS")
            print(f"  start-up to listening {startup:.1f}s, RSS {rss:.0f} MB")
            header = {"X-Prometheus-Scrape-Timeout-Seconds": str(timeout)}
            answers: list[dict[str, Any]] = []
            for i in range(scrapes):
                if i > 0:
                    time.sleep(BETWEEN_FLEET_SCRAPES)
                answer: list[tuple[float, str]] = []
                scrape = threading.Thread(
                    target=partial(_collect_into, answer, base + "/metrics", timeout, header)
                )
                scrape.start()
                time.sleep(min(1.0, timeout / 4))
                probe_seconds, _ = _get(base + f"/probe?target={HEALTHY_PREFIX}0", timeout)
                scrape.join()
                seconds, text = answer[0]
                scraped = _scraped(text)
                healthy_up = sum(scraped.up.get(f"{HEALTHY_PREFIX}{h}", 0) for h in range(healthy))
                print(
                    f"  scrape {i + 1}: {seconds:5.2f}s of {timeout:g}s, "
                    f"{len(scraped.up)} targets, {scraped.up_count} up "
                    f"({int(healthy_up)} of the {healthy} healthy); "
                    f"/probe during it {probe_seconds * 1000:.0f} ms"
                )
                answers.append(
                    {
                        "seconds": seconds,
                        "targets": len(scraped.up),
                        "up": scraped.up_count,
                        "healthy_up": int(healthy_up),
                        "probe_ms": probe_seconds * 1000,
                    }
                )
            peak = _proc_status_mb(pid, "VmHWM")
            print(f"  peak RSS {peak:.0f} MB")
    return {
        "targets": len(targets),
        "healthy": healthy,
        "hung": hanging,
        "refusing": refusing,
        "timeout_seconds": timeout,
        "startup_seconds": startup,
        "rss_mb": rss,
        "peak_rss_mb": peak,
        "scrapes": answers,
    }


def _cpu_seconds(pid: int) -> float:
    """User and system time of a process so far, from /proc/PID/stat."""
    # The fields after the command name (which may hold spaces) start at the state, field 3.
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def per_target(dsn: str, size: int, scrapes: int) -> dict[str, Any]:
    # servers: (RSS MB, CPU s per collection, median scrape s)
    measured: dict[int, tuple[float, float, float]] = {}
    for count in (1, size):
        progress(f"per target: {_plural(count, 'server')}, {scrapes} scrapes")
        targets = {f"{HEALTHY_PREFIX}{i}": dsn for i in range(count)}
        with _exporter(targets, "1ms") as (base, _, pid):
            _get(base + "/metrics", 120)  # connect them all
            before = _cpu_seconds(pid)
            times = []
            for _ in range(scrapes):
                seconds, text = _get(base + "/metrics", 120)
                _all_up(text, count, servers=count)
                times.append(seconds)
            cpu = (_cpu_seconds(pid) - before) / (scrapes * count)
            measured[count] = (_proc_status_mb(pid, "VmRSS"), cpu, statistics.median(times))
    (one_rss, _, _), (rss, cpu, scrape) = measured[1], measured[size]
    per_server_kb = (rss - one_rss) / (size - 1) * 1024
    print(f"per target: {size} healthy servers, each collected at each of {scrapes} scrapes")
    print(f"  memory {per_server_kb:.0f} KB per server "
          f"(RSS {one_rss:.0f} MB with one server, {rss:.0f} MB with {size})")  # fmt: skip
    print(f"  CPU {cpu * 1000:.2f} ms per collection: {size} servers at a 15 s interval "
          f"take {cpu * size / 15:.3f} of a core")  # fmt: skip
    print(f"  scrape of the {size} servers {scrape * 1000:.0f} ms (median), "
          f"{size / scrape:.0f} collections/s")  # fmt: skip
    return {
        "servers": size,
        "memory_kb_per_server": per_server_kb,
        "rss_mb_one_server": one_rss,
        "rss_mb": rss,
        "cpu_ms_per_collection": cpu * 1000,
        "cores_at_15s": cpu * size / 15,
        "scrape_ms": scrape * 1000,
        "collections_per_second": size / scrape,
    }


def _log_from(pg: EmbeddedPostgres, offset: int) -> str:
    with pg.logfile.open("rb") as log:
        log.seek(offset)
        return log.read().decode(errors="replace")


def sharing(pg: EmbeddedPostgres, dsn: str, names: int, scrapes: int) -> list[dict[str, Any]]:
    runs = [
        ("1 name", 1, EXPORTER),
        (f"{_plural(names, 'name')}, read once", names, EXPORTER),
        (f"{_plural(names, 'name')}, each read on its own", names, DISTINCT_SERVERS),
    ]
    results: list[dict[str, Any]] = []
    for label, count, program in runs:
        progress(f"sharing: {label}, {scrapes} scrapes")
        targets = {f"name-{i}": dsn for i in range(count)}
        with _exporter(targets, "1ms", program) as (base, _, _):
            _get(base + "/metrics", 60)  # connect
            offset = pg.logfile.stat().st_size
            times, servers = [], set()
            for _ in range(scrapes):
                seconds, text = _get(base + "/metrics", 60)
                servers.add(_all_up(text, count).servers)
                times.append(seconds)
            reads = _log_from(pg, offset).count(COLLECTION)
            connections = _connections(pg, LOGGED_MONITOR)
        results.append(
            {
                "label": label,
                "names": count,
                "program": program,
                "scrape_ms": statistics.median(times) * 1000,
                "connections": connections,
                "reads_per_scrape": reads / scrapes,
                "answering_for_the_server": sorted(servers),
            }
        )
    print(
        f"sharing: names of one server, median of {scrapes} scrapes; reads of pg_locks "
        "counted in the server's log"
    )
    width = max(len(r["label"]) for r in results)
    for r in results:
        print(
            f"  {r['label']:<{width}}  {r['scrape_ms']:7.1f} ms, "
            f"{_plural(r['connections'], 'connection')}, "
            f"{r['reads_per_scrape']:g} {'read' if r['reads_per_scrape'] == 1 else 'reads'} "
            "per scrape"
        )
    return results


def _roles(pg: EmbeddedPostgres) -> dict[str, str]:
    """The monitoring roles, as the README recommends them, and a DSN for each."""
    dsns = {}
    with pg.connect() as conn:
        for role in (MONITOR, LOGGED_MONITOR):
            password = secrets.token_urlsafe(16)
            conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
            conn.execute(f"GRANT pg_read_all_stats TO {role}")
            dsns[role] = pg.dsn(user=role, password=password)
        conn.execute(f"ALTER ROLE {LOGGED_MONITOR} SET log_statement = 'all'")
    return dsns


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fleet_scale")
    parser.add_argument(
        "--targets", type=int, default=10_000, help="targets of the fleet part, all distinct"
    )
    parser.add_argument(
        "--healthy",
        type=int,
        default=100,
        help="healthy servers, each read on its own, in the throughput and fleet parts",
    )
    parser.add_argument("--timeout", type=float, default=10.0, help="scrape timeout, seconds")
    parser.add_argument("--scrapes", type=int, default=5, help="scrapes of each measurement")
    parser.add_argument(
        "--per-target",
        type=int,
        default=1000,
        help="healthy servers whose cost is measured (0 skips the part)",
    )
    parser.add_argument(
        "--names",
        type=int,
        default=100,
        help="targets naming one server, read once, in the sharing part (0 skips it)",
    )
    parser.add_argument("--pg-version", type=int, default=DEFAULT_MAJOR)
    parser.add_argument("--json", type=Path, help="write the figures to this file too")
    args = parser.parse_args(argv)
    if args.healthy < 1 or args.scrapes < 1:
        parser.error("--healthy and --scrapes take 1 or more")
    if args.targets - args.healthy > MAX_REFUSING:
        parser.error(f"at most {MAX_REFUSING} targets besides the healthy ones")
    pg = EmbeddedPostgres(major=args.pg_version)
    report: dict[str, Any] = {"pg_version": args.pg_version}
    try:
        progress(f"starting PostgreSQL {args.pg_version}")
        pg.start(max_connections=max(2 * args.healthy, args.per_target, 2 * args.names) + 20)
        dsns = _roles(pg)
        dsn = dsns[MONITOR]
        report["throughput"] = throughput(pg, dsn, args.healthy, args.scrapes)
        report["fleet"] = fleet(dsn, args.targets, args.healthy, args.timeout, args.scrapes)
        if args.per_target > 1:
            report["per_target"] = per_target(dsn, args.per_target, args.scrapes)
        if args.names > 0:
            report["sharing"] = sharing(pg, dsns[LOGGED_MONITOR], args.names, args.scrapes)
    finally:
        pg.cleanup()
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
