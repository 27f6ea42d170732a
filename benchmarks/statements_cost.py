"""What reading pg_stat_statements for risky lock statements costs.

Run as `python -m benchmarks.statements_cost [--statements 5000] [--advisory 500]
[--repeat 30] [--pg-version 15] [--json PATH]`. It starts a throwaway PostgreSQL with
pg_stat_statements loaded, runs `--statements` distinct statements as a client (of which
`--advisory` call an advisory lock function, a third of those in a risky form), and then
times, interleaved round after round on a session prepared as the exporter's:

- the floor, `SELECT count(*) FROM pg_stat_statements`: the view reads every entry and its
  text from the server's file, so no read of it costs less;
- the exporter's read (collect/pg_stat_statements.py `read_statements`): the screened statements'
  query, fetching their rows, and judging each with the parser; its parse time apart;

and the Python memory the read and its judging take at their peak (tracemalloc).

Progress goes to stderr, results to stdout (and to `--json PATH`); the exit status is 0
whatever the figures: a benchmark reports, it does not judge.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psycopg

from benchmarks import positive
from devtools.embedded_postgres import DEFAULT_MAJOR, EmbeddedPostgres
from pg_advisory_exporter.collect.connection import prepare_session
from pg_advisory_exporter.collect.pg_stat_statements import StatementsRead, read_statements
from pg_advisory_exporter.config.collection import CollectionSettings

FLOOR_SQL = "SELECT count(*) FROM pg_stat_statements"
TABLES = 100  # statements differ by table and by the number of columns they select
WARMUP_ROUNDS = 3


def progress(message: str) -> None:
    print(f"[statements_cost] {message}", file=sys.stderr, flush=True)


def statement(number: int, advisory: bool) -> str:
    """The number-th distinct statement: its table and its width make its queryid."""
    table, width = number % TABLES, 1 + number // TABLES
    columns = ", ".join(["c"] * width)
    if not advisory:
        return f"SELECT {columns} FROM t{table} WHERE c = 1"
    if number % 3 == 0:  # the manual's "danger!" form
        return f"SELECT pg_advisory_lock(c), {columns} FROM t{table} WHERE c > 1 LIMIT 1"
    return f"SELECT pg_advisory_xact_lock(1), {columns} FROM t{table} WHERE c = 1"


def fill(server: EmbeddedPostgres, statements: int, advisory: int) -> None:
    with server.connect(application_name="bench-client") as conn:
        conn.execute("CREATE EXTENSION pg_stat_statements")
        for table in range(TABLES):
            conn.execute(f"CREATE TABLE t{table} (c int)")
        conn.execute("SELECT pg_stat_statements_reset()")
        every = max(1, statements // max(1, advisory))
        for number in range(statements):
            conn.execute(statement(number, advisory > 0 and number % every == 0))


def _timed(run: Callable[[], object]) -> float:
    started = time.perf_counter()
    run()
    return (time.perf_counter() - started) * 1000


@dataclass(frozen=True)
class Result:
    server_version: str
    statements: int  # entries in pg_stat_statements
    text_bytes: int  # their texts, in all
    screened: int  # those naming an advisory function
    risky: int
    floor_ms: list[float]
    read_ms: list[float]  # query, fetch and parse
    parse_ms: list[float]
    peak_python_mb: float

    def as_json(self) -> dict[str, Any]:
        ratios = [r / f for r, f in zip(self.read_ms, self.floor_ms, strict=True)]
        # What the server and the transfer take: the read less the exporter's parsing.
        query = [r - p for r, p in zip(self.read_ms, self.parse_ms, strict=True)]
        query_ratios = [q / f for q, f in zip(query, self.floor_ms, strict=True)]
        return {
            **asdict(self),
            "floor_ms_median": statistics.median(self.floor_ms),
            "read_ms_median": statistics.median(self.read_ms),
            "parse_ms_median": statistics.median(self.parse_ms),
            "query_ms_median": statistics.median(query),
            "paired_ratio_median": statistics.median(ratios),
            "query_paired_ratio_median": statistics.median(query_ratios),
        }


def measure(server: EmbeddedPostgres, repeat: int) -> Result:
    with psycopg.connect(server.dsn(), autocommit=True) as conn:
        session = prepare_session(conn, CollectionSettings())
        count_row = conn.execute(
            "SELECT count(*), sum(octet_length(query)),"
            " count(*) FILTER (WHERE query ILIKE '%advisory%') FROM pg_stat_statements"
        ).fetchone()
        assert count_row is not None
        floor, read, parse = [], [], []
        found = StatementsRead()
        for round_number in range(WARMUP_ROUNDS + repeat):
            floor_ms = _timed(lambda: conn.execute(FLOOR_SQL).fetchone())
            started = time.perf_counter()
            found = read_statements(session)
            read_ms = (time.perf_counter() - started) * 1000
            if round_number >= WARMUP_ROUNDS:
                floor.append(floor_ms)
                read.append(read_ms)
                parse.append(found.parse_seconds * 1000)
        tracemalloc.start()
        read_statements(session)
        peak = tracemalloc.get_traced_memory()[1] / 1e6
        tracemalloc.stop()
        version = str(conn.execute("SHOW server_version").fetchone()[0])  # type: ignore[index]
    return Result(
        server_version=version,
        statements=int(count_row[0]),
        text_bytes=int(count_row[1] or 0),
        screened=int(count_row[2]),
        risky=sum(found.counts.values()),
        floor_ms=floor,
        read_ms=read,
        parse_ms=parse,
        peak_python_mb=peak,
    )


def format_report(result: Result) -> str:
    figures = result.as_json()
    return "\n".join([
        f"PostgreSQL {result.server_version}: {result.statements:,} statements in "
        f"pg_stat_statements ({result.text_bytes / 1e6:.1f} MB of text), "
        f"{result.screened:,} naming an advisory function, {result.risky} risky",
        f"floor ({FLOOR_SQL}): {figures['floor_ms_median']:.1f} ms",
        f"the exporter's read, parse included: {figures['read_ms_median']:.1f} ms "
        f"(median of paired ratios to the floor {figures['paired_ratio_median']:.2f}); "
        f"parsing {figures['parse_ms_median']:.1f} ms of it, in the exporter",
        f"the query and its transfer alone: {figures['query_ms_median']:.1f} ms "
        f"(to the floor {figures['query_paired_ratio_median']:.2f})",
        f"peak Python memory of a read: {result.peak_python_mb:.2f} MB",
    ])  # fmt: skip


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.statements_cost",
        description="Measure what reading pg_stat_statements for risky statements costs.",
    )
    parser.add_argument("--statements", type=positive, default=5000, help="distinct statements")
    parser.add_argument("--advisory", type=int, default=500, help="of them, advisory ones")
    parser.add_argument("--repeat", type=positive, default=30, help="timed rounds")
    parser.add_argument("--pg-version", type=int, default=DEFAULT_MAJOR, help="major version")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the figures here")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    server = EmbeddedPostgres(major=args.pg_version)
    try:
        server.start(
            shared_preload_libraries="pg_stat_statements",
            **{"pg_stat_statements.max": max(5000, args.statements + 200)},
        )
        progress(f"running {args.statements:,} statements")
        fill(server, args.statements, args.advisory)
        progress(f"timing, interleaved: {WARMUP_ROUNDS} warm-up + {args.repeat} rounds")
        result = measure(server, args.repeat)
    finally:
        server.cleanup()
    print(format_report(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result.as_json(), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
