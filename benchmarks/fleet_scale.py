"""What one exporter can serve: collections per second, and a large fleet against its timeout.

Run as `python -m benchmarks.fleet_scale [--targets 10000] [--healthy 100] [--timeout 10]
[--scrapes 5] [--per-target 1000] [--pg-version 15]`. It starts one throwaway PostgreSQL and
the real exporter (a subprocess, scraped over HTTP), in three parts:

1. Throughput. `--healthy` targets, each with its own connection to that server, as many
   small servers would be; `min_interval` is 1ms, so every scrape collects every target.
   The baseline, in the same run, is a single target's scrape: the ratio of a collection's
   share of the fleet scrape to that baseline shows what the pool adds or saves, and
   collections per second bound the fleet that answers within a scrape timeout.
2. A fleet of `--targets`: the healthy ones, 1% that accept connections and never answer,
   and the rest refusing connections (servers that are down). Each /metrics scrape carries
   `X-Prometheus-Scrape-Timeout-Seconds: --timeout`; while it runs, a /probe of one healthy
   target is timed. Start-up time and memory are reported too.
3. What each healthy target costs: `--per-target` of them (0 skips the part), every one
   collected at each scrape, against a one-target exporter in the same run: the memory a
   target adds, and the CPU time of one collection (the process's user and system time over
   the scrapes, divided by the collections), with what that makes at a 15 s interval.

Progress goes to stderr, results to stdout. A benchmark reports, it does not judge.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from functools import partial
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

from devtools.embedded_postgres import DEFAULT_MAJOR, EmbeddedPostgres, free_port

from .collection_cost import _proc_status_mb, _stop, progress

START_TIMEOUT = 120.0
HEALTHY_PREFIX = "healthy-"


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


def _up(text: str) -> dict[str, float]:
    return {
        sample.labels["target"]: sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "pg_advisory_up"
        for sample in family.samples
    }


@contextlib.contextmanager
def _silent_port() -> Iterator[int]:
    """A port that accepts connections and never answers, like a hung server."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1024)
        yield sock.getsockname()[1]


@contextlib.contextmanager
def _exporter(targets: dict[str, str], min_interval: str) -> Iterator[tuple[str, float, int]]:
    """The running exporter: its base URL, its start-up seconds and its pid."""
    config = {
        "collection": {"min_interval": min_interval, "connect_timeout": "10s"},
        "targets": [{"name": name, "dsn": dsn} for name, dsn in targets.items()],
    }
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="fleet-scale-") as folder:
        config_path = Path(folder) / "config.yaml"
        config_path.write_text(yaml.safe_dump(config))
        log_path = Path(folder) / "exporter.log"
        command = [
            sys.executable, "-m", "pg_advisory_exporter", "--config.file", str(config_path),
            "--web.listen-address", f"127.0.0.1:{port}",
        ]  # fmt: skip
        started = time.perf_counter()
        with log_path.open("wb") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
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


def throughput(dsn: str, healthy: int, scrapes: int) -> None:
    with _exporter({"single": dsn}, "1ms") as (base, _, _):
        _get(base + "/metrics", 10)  # connect
        single = statistics.median(_get(base + "/metrics", 10)[0] for _ in range(scrapes))
    targets = {f"{HEALTHY_PREFIX}{i}": dsn for i in range(healthy)}
    with _exporter(targets, "1ms") as (base, _, _):
        _get(base + "/metrics", 60)  # connect them all
        times = []
        for _ in range(scrapes):
            seconds, text = _get(base + "/metrics", 60)
            if sum(_up(text).values()) != healthy:
                raise RuntimeError("a healthy target is reported down")
            times.append(seconds)
    fleet = statistics.median(times)
    print(f"throughput: {healthy} healthy targets, median of {scrapes} scrapes")
    print(f"  baseline  one target's scrape            {single * 1000:8.1f} ms")
    print(f"  fleet     {healthy} targets' scrape        {fleet * 1000:8.1f} ms")
    print(f"  per collection {fleet / healthy * 1000:.2f} ms, ratio to baseline "
          f"{fleet / healthy / single:.2f}; {healthy / fleet:.0f} collections/s")  # fmt: skip


def fleet(dsn: str, size: int, healthy: int, timeout: float, scrapes: int) -> None:
    refused = f"host=127.0.0.1 port={free_port()} user=x dbname=x connect_timeout=10"
    with _silent_port() as silent:
        hung = f"host=127.0.0.1 port={silent} user=x dbname=x"
        hanging = max(1, size // 100)
        targets = {f"{HEALTHY_PREFIX}{i}": dsn for i in range(healthy)}
        targets |= {f"hung-{i}": hung for i in range(hanging)}
        targets |= {f"refused-{i}": refused for i in range(size - len(targets))}
        with _exporter(targets, "5s") as (base, startup, pid):
            print(f"fleet: {size} targets ({healthy} healthy, {hanging} hung, the rest refuse)")
            rss = _proc_status_mb(pid, "VmRSS")
            print(f"  start-up to listening {startup:.1f}s, RSS {rss:.0f} MB")
            header = {"X-Prometheus-Scrape-Timeout-Seconds": str(timeout)}
            for i in range(scrapes):
                answer: list[tuple[float, str]] = []
                scrape = threading.Thread(
                    target=partial(_collect_into, answer, base + "/metrics", timeout, header)
                )
                scrape.start()
                time.sleep(min(1.0, timeout / 4))
                probe_seconds, _ = _get(base + f"/probe?target={HEALTHY_PREFIX}0", timeout)
                scrape.join()
                seconds, text = answer[0]
                up = _up(text)
                print(
                    f"  scrape {i + 1}: {seconds:5.2f}s of {timeout:g}s, "
                    f"{len(up)} targets, {int(sum(up.values()))} up; "
                    f"/probe during it {probe_seconds * 1000:.0f} ms"
                )
                time.sleep(2)
            print(f"  peak RSS {_proc_status_mb(pid, 'VmHWM'):.0f} MB")  # fmt: skip


def _cpu_seconds(pid: int) -> float:
    """User and system time of a process so far, from /proc/PID/stat."""
    # The fields after the command name (which may hold spaces) start at the state, field 3.
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def per_target(dsn: str, size: int, scrapes: int) -> None:
    measured: dict[int, tuple[float, float]] = {}  # targets: (RSS MB, CPU s per collection)
    for count in (1, size):
        targets = {f"{HEALTHY_PREFIX}{i}": dsn for i in range(count)}
        with _exporter(targets, "1ms") as (base, _, pid):
            _get(base + "/metrics", 120)  # connect them all
            before = _cpu_seconds(pid)
            for _ in range(scrapes):
                if sum(_up(_get(base + "/metrics", 120)[1]).values()) != count:
                    raise RuntimeError("a healthy target is reported down")
            cpu = (_cpu_seconds(pid) - before) / (scrapes * count)
            measured[count] = (_proc_status_mb(pid, "VmRSS"), cpu)
    (one_rss, _), (rss, cpu) = measured[1], measured[size]
    print(f"per target: {size} healthy targets, each collected at each of {scrapes} scrapes")
    print(f"  memory {(rss - one_rss) / (size - 1) * 1024:.0f} KB per target "
          f"(RSS {one_rss:.0f} MB with one target, {rss:.0f} MB with {size})")  # fmt: skip
    print(f"  CPU {cpu * 1000:.2f} ms per collection: {size} targets at a 15 s interval "
          f"take {cpu * size / 15:.3f} of a core")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fleet_scale")
    parser.add_argument("--targets", type=int, default=10_000)
    parser.add_argument("--healthy", type=int, default=100)
    parser.add_argument("--timeout", type=float, default=10.0, help="scrape timeout, seconds")
    parser.add_argument("--scrapes", type=int, default=5)
    parser.add_argument(
        "--per-target", type=int, default=1000, help="healthy targets whose cost is measured"
    )
    parser.add_argument("--pg-version", type=int, default=DEFAULT_MAJOR)
    args = parser.parse_args(argv)
    pg = EmbeddedPostgres(major=args.pg_version)
    try:
        progress(f"starting PostgreSQL {args.pg_version}")
        pg.start(max_connections=max(2 * args.healthy, args.per_target) + 20)
        throughput(pg.dsn(), args.healthy, args.scrapes)
        fleet(pg.dsn(), args.targets, args.healthy, args.timeout, args.scrapes)
        if args.per_target > 1:
            per_target(pg.dsn(), args.per_target, args.scrapes)
    finally:
        pg.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
