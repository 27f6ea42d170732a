"""Risky advisory-lock statements in pg_stat_statements, read rarely, on a connection of its
own and a worker of its own, so that no collection ever waits for them."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from psycopg import errors, sql
from psycopg.rows import dict_row

from pg_advisory_exporter import logs
from pg_advisory_exporter.config.settings import TargetSettings
from pg_advisory_exporter.hygiene.risky import (
    MAX_STATEMENT_BYTES,
    RULES,
    Judge,
    Rule,
    Skip,
    shorten,
)
from pg_advisory_exporter.metrics import Sample

from .connection import Session, Unanswered, new_session
from .kept_connection import APPLICATION_NAME
from .scheduling import CollectionPool, Priority, Task, Watchdog
from .snapshot import grant_read_all_stats

log = logging.getLogger(__name__)

# The reads' own name on the server (pg_stat_activity), apart from the kept connection's.
READER_NAME = f"{APPLICATION_NAME} statements"
# What one read takes from the server and gives the parser, at most: the statements that
# name an advisory function, most called first; their texts, each up to MAX_STATEMENT_BYTES
# and TEXT_BYTES in all (the rest are counted, not read); and PARSE_SECONDS of parsing.
MAX_STATEMENTS = 5000
TEXT_BYTES = 8 << 20
PARSE_SECONDS = 2.0
# The risky statements kept for check and /locks (all are counted in the series).
SHOWN = 100
# Reads of all servers at once: a server that hangs holds one until its deadline.
READERS = 2

# Where the extension lives in the connection's database (it is created per database, and
# shows the statements of all of them), and whether the role may read others' texts (without
# pg_read_all_stats they read "<insufficient privilege>").
EXTENSION_SQL = """
SELECT (SELECT n.nspname
          FROM pg_catalog.pg_extension AS e
          JOIN pg_catalog.pg_namespace AS n ON n.oid = e.extnamespace
         WHERE e.extname = 'pg_stat_statements') AS schema,
       pg_catalog.pg_has_role('pg_read_all_stats', 'USAGE') AS reads_all
"""

# The statements whose text names an advisory function (a screen, so that the others' texts
# never leave the server; the parser decides), most called first, within MAX_STATEMENTS and
# TEXT_BYTES; a text over MAX_STATEMENT_BYTES comes as NULL (and counts for none of them).
# Each row also counts what the screen kept: those it kept and did not send are over a limit.
STATEMENTS_SQL = """
SELECT d.datname, r.rolname, s.calls, s.query, s.screened
FROM (SELECT s.dbid, s.userid, s.calls,
             CASE WHEN NOT s.long THEN s.query END AS query,
             pg_catalog.count(*) OVER () AS screened,
             pg_catalog.row_number() OVER (ORDER BY s.calls DESC) AS position,
             pg_catalog.sum(CASE WHEN s.long THEN 0 ELSE pg_catalog.octet_length(s.query) END)
                 OVER (ORDER BY s.calls DESC ROWS UNBOUNDED PRECEDING) AS running_bytes
        FROM (SELECT p.dbid, p.userid, p.calls, p.query,
                     pg_catalog.octet_length(p.query) > %(max_bytes)s AS long
                FROM {view} AS p
               WHERE p.query ILIKE '%%advisory%%') AS s) AS s
LEFT JOIN pg_catalog.pg_database AS d ON d.oid = s.dbid
LEFT JOIN pg_catalog.pg_roles AS r ON r.oid = s.userid
WHERE s.position <= %(max_statements)s AND s.running_bytes <= %(text_bytes)s
ORDER BY s.position
"""

# Why a statement that the screen kept was not judged, besides the parser's own reasons.
OVER_LIMIT = "over_limit"  # past MAX_STATEMENTS or TEXT_BYTES
SKIP_REASONS = (*(skip.value for skip in Skip), OVER_LIMIT)


@dataclass(frozen=True)
class RiskyStatement:
    datname: str
    rolname: str
    calls: int
    text: str  # shortened, for people: never a label
    rules: frozenset[Rule]


@dataclass(frozen=True)
class StatementsRead:
    """What one read of pg_stat_statements found, or why it found nothing."""

    risky: tuple[RiskyStatement, ...] = ()
    # Statements that break each rule, by (database, rule): all of them, not only those shown.
    counts: Mapping[tuple[str, Rule], int] = field(default_factory=dict)
    skipped: Mapping[str, int] = field(default_factory=dict)  # by reason
    risky_total: int = 0  # statements that break a rule: `risky` shows the first SHOWN
    error: str | None = None
    reads_all: bool = True  # False: only the monitoring role's own texts could be read
    role: str = ""  # the monitoring role
    texts: int = 0  # statements whose text was read (a too long one's is not)
    parse_seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None


class NotReadable(Exception):
    """pg_stat_statements cannot be read here: missing, not loaded, or not granted."""


def _view(session: Session) -> tuple[sql.Composed, bool]:
    """The view, schema-qualified, and whether the role reads every role's texts."""
    row = session.conn.execute(EXTENSION_SQL).fetchone()
    assert row is not None
    schema, reads_all = row
    if schema is None:
        raise NotReadable(
            "pg_stat_statements is not installed in this database: CREATE EXTENSION "
            "pg_stat_statements (and shared_preload_libraries = 'pg_stat_statements')"
        )
    return sql.SQL("{}.pg_stat_statements").format(sql.Identifier(schema)), bool(reads_all)


def read_statements(
    session: Session, clock: Callable[[], float] = time.perf_counter
) -> StatementsRead:
    """Read the screened statements once and judge each (raises psycopg.Error, NotReadable)."""
    view, reads_all = _view(session)
    query = sql.SQL(STATEMENTS_SQL).format(view=view)
    parameters = {
        "max_bytes": MAX_STATEMENT_BYTES,
        "max_statements": MAX_STATEMENTS,
        "text_bytes": TEXT_BYTES,
    }
    with session.conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(query, parameters).fetchall()
    return judged(rows, reads_all, Judge(PARSE_SECONDS, clock), session.role)


def judged(
    rows: list[dict[str, Any]], reads_all: bool, judge: Judge, role: str = ""
) -> StatementsRead:
    """The rows of STATEMENTS_SQL, judged."""
    skipped: Counter[str] = Counter()
    counts: Counter[tuple[str, Rule]] = Counter()
    risky: list[RiskyStatement] = []
    risky_total = 0
    for row in rows:
        if row["query"] is None:
            skipped[Skip.TOO_LONG.value] += 1  # its text stayed on the server
            continue
        verdict = judge.judge(row["query"])
        if verdict.skipped is not None:
            skipped[verdict.skipped.value] += 1
            continue
        if not verdict.rules:
            continue
        datname = row["datname"] or ""
        risky_total += 1
        for rule in verdict.rules:
            counts[datname, rule] += 1
        if len(risky) < SHOWN:
            risky.append(
                RiskyStatement(
                    datname,
                    row["rolname"] or "",
                    int(row["calls"]),
                    shorten(row["query"]),
                    verdict.rules,
                )
            )
    if rows:
        skipped[OVER_LIMIT] += int(rows[0]["screened"]) - len(rows)
    return StatementsRead(
        tuple(risky),
        dict(counts),
        dict(skipped),
        risky_total=risky_total,
        reads_all=reads_all,
        role=role,
        texts=sum(row["query"] is not None for row in rows),
        parse_seconds=judge.spent,
    )


def read_once(config: TargetSettings, watchdog: Watchdog) -> StatementsRead:
    """One read of the target's pg_stat_statements on a new connection, given up at the
    collection's deadline; what it found, or why it found nothing (it never raises)."""
    try:
        with new_session(
            config, watchdog, config.collection.collection_deadline, READER_NAME, registry=False
        ) as session:
            try:
                return read_statements(session)
            except (NotReadable, *_NOT_READABLE) as exc:  # the server says why: and the fix
                return StatementsRead(error=describe(exc))
    except Unanswered as exc:  # down, refusing, too slow (the deadline says so) or hung
        return StatementsRead(error=str(exc))
    except Exception:  # never let one server's statements take the exporter down
        log.exception("reading pg_stat_statements failed", extra={"target": config.name})
        return StatementsRead(error="internal error, see the exporter's log")


# The server's answers that say pg_stat_statements cannot be read here (describe() says what
# fixes each); any other error is the connection's, and new_session words it.
_NOT_READABLE = (errors.ObjectNotInPrerequisiteState, errors.InsufficientPrivilege)


def describe(exc: Exception) -> str:
    """Why pg_stat_statements could not be read, and what fixes it."""
    if isinstance(exc, NotReadable):
        return str(exc)
    if isinstance(exc, errors.ObjectNotInPrerequisiteState):
        return (
            "pg_stat_statements is installed but not loaded: add it to "
            "shared_preload_libraries (a restart)"
        )
    if isinstance(exc, errors.InsufficientPrivilege):
        return f"the role may not read pg_stat_statements: {str(exc).strip()}"
    return str(exc).strip()


class Statements:
    """The rare reads of one server's pg_stat_statements: after a successful collection, when
    `statements_interval` has passed since the last read began, one read is queued on a
    small pool of its own, on a new connection (its own name on the server, READER_NAME),
    given up at the collection's deadline. What it cannot see is said once."""

    def __init__(
        self,
        config: TargetSettings,
        watchdog: Watchdog,
        pool: Readers | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = config.name
        self._config = config
        self._interval = config.collection.statements_interval
        self._watchdog = watchdog
        self._pool = pool or READERS_POOL
        self._clock = clock
        self._lock = threading.Lock()
        self._began: float | None = None  # the last read's start, monotonic
        self._pending = False
        self._last: StatementsRead | None = None
        self._said = logs.Changes()

    def last(self) -> StatementsRead | None:
        with self._lock:
            return self._last

    def due(self) -> None:
        """Queue a read if one is due (called after each successful collection)."""
        if self._interval <= 0:
            return
        now = self._clock()
        with self._lock:
            if self._pending or (self._began is not None and now - self._began < self._interval):
                return
            self._pending, self._began = True, now
        self._pool.enqueue([(Task(self.read), Priority.ROUTINE)])

    def read(self) -> StatementsRead:
        """Read now, in the caller's thread (the pool's, when due)."""
        found = read_once(self._config, self._watchdog)
        self.record(found)
        return found

    def record(self, found: StatementsRead) -> None:
        """Keep a read's outcome, and say what changed (read() does, at its end)."""
        self._tell(found)
        with self._lock:
            self._last, self._pending = found, False

    def _tell(self, found: StatementsRead) -> None:
        if self._said.changed("read", found.error, initial=True):
            if found.error is None:
                log.info("pg_stat_statements read", extra={"target": self.name})
            else:
                log.warning(
                    "cannot read pg_stat_statements: risky lock statements are not reported",
                    extra={"target": self.name, "error": found.error},
                )
        said = found.ok and self._said.changed("texts", found.reads_all, initial=True)
        if said and not found.reads_all:
            log.warning(
                "only the monitoring role's own statements are judged in "
                "pg_stat_statements; fix with " + grant_read_all_stats(found.role),
                extra={"target": self.name},
            )


def statements_samples(
    target: str, read: StatementsRead | None, database: str | None, server_wide: bool
) -> list[Sample]:
    """The risky statements of the last read, in `database` only if one is given (0 for a
    rule none breaks, under the database, or an empty one for the whole server); on the
    server's target, whether the read succeeded and what it skipped."""
    if read is None:  # not read yet, or never (statements_interval 0)
        return []
    samples = []
    if server_wide:
        samples.append(Sample("pg_advisory_statements_up", (target,), read.ok))
    if not read.ok:
        return samples
    if server_wide:
        samples += [
            Sample("pg_advisory_statements_skipped", (target, reason), read.skipped.get(reason, 0))
            for reason in SKIP_REASONS
        ]
    for rule in RULES:
        found = sorted(
            (datname, count)
            for (datname, broken), count in read.counts.items()
            if broken is rule and (database is None or datname == database)
        )
        samples += [
            Sample("pg_advisory_risky_statements", (target, datname, rule.value), count)
            for datname, count in found or [(database or "", 0)]
        ]
    return samples


class Readers:
    """The pool that reads every server's pg_stat_statements, READERS at once, apart from the
    collection pool so that no collection waits for a read: made at the first read, and shut
    down by the daemon when it stops (shutdown). A read queued after that makes a new one,
    for the next daemon of the process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pool: CollectionPool | None = None

    def enqueue(self, tasks: Sequence[tuple[Task[Any], Priority]]) -> None:
        with self._lock:
            if self._pool is None:
                self._pool = CollectionPool(READERS, name="statements")
            self._pool.enqueue(tasks)

    def shutdown(self) -> None:
        """Cancel the reads queued and let the workers end: a read running ends at its
        deadline at the latest, and its worker with it."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown()


# The daemon's: every server's Statements queues its reads here.
READERS_POOL = Readers()
