"""The /locks read of a server: its statement, its rows mapped to backends, a target read once
on the connection its server keeps."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from pg_advisory_exporter.collect import vocabulary
from pg_advisory_exporter.collect.collection import Reading
from pg_advisory_exporter.collect.databases import NO_DATABASES, Databases
from pg_advisory_exporter.collect.holds import NO_HOLDS, Hold, Holder, Holds, hold_of
from pg_advisory_exporter.collect.poolers import Poolers, PoolerView, owner
from pg_advisory_exporter.collect.scheduling import Watchdog
from pg_advisory_exporter.collect.server import Server
from pg_advisory_exporter.config.settings import TargetSettings
from pg_advisory_exporter.config.targets import LocksPageSettings
from pg_advisory_exporter.hygiene.callers import caller_of
from pg_advisory_exporter.keys.appnames import RewriteRule, rewrite
from pg_advisory_exporter.keys.idle_by_design import NOT_IDLE_BY_DESIGN, IdleByDesign
from pg_advisory_exporter.keys.key import AdvisoryKey
from pg_advisory_exporter.keys.key_config import Level
from pg_advisory_exporter.keys.packed_names import distributed_lock_name
from pg_advisory_exporter.keys.registry import Registry

from .blocking import assemble
from .model import Backend, Forensics, LockEntry, TableHolder

# The most lock entries listed per backend (its total is always given), and the most
# backends listed (the number left out is given): a backend holding 100,000 locks, or a
# server with thousands of sessions, must not make a page of megabytes.
LOCKS_PER_BACKEND = 50
MAX_BACKENDS = 500
# The backends listed as holding the most of the shared lock table, of every lock type.
TABLE_HOLDERS = 10
# How much of each backend's last statement is read for its caller (hygiene/callers.py):
# all of it at the server's default track_activity_query_size (1024 bytes) and four times
# that; an annotation past it, at the end of a longer statement, is not seen.
CALLER_TEXT_LENGTH = 4096

# One statement, in autocommit, so that pg_locks and pg_stat_activity describe one moment.
# Like the collection's, it names functions only (pg_lock_status() and pg_stat_get_activity()
# for the views on them, databases by oid): it takes no lock, and so still reads a server
# whose lock table is full (collect/reads.py says why). Notes:
# - pg_locks is read once, in forensic_locks: every CTE after reads it from there, and
#   MATERIALIZED makes sure the planner never inlines it into each use, which would read
#   pg_locks again. advisory_locks keeps its advisory rows, read twice (NOT MATERIALIZED: two
#   scans of the rows kept, not a second copy of them): the application's keys, objsubid 1
#   or 2, not an extension's own advisory-tag locks (keys/extension_tags.py), which count
#   among a backend's lock-table entries in table_holders only.
# - table_holders: the backends holding the most entries of the shared lock table, of every
#   lock type (a job's advisory locks, or a query's locks on thousands of partitions): who
#   fills it. Its one row is joined with the backends' (a row of NULLs where none holds an
#   advisory lock), so that it comes with any number of them.
# - A row without a pid belongs to a prepared transaction: there is no backend to show or end.
# - contended: somebody awaits the row's key (its database and the three key columns). Those
#   rows are returned whatever the per-backend cap, since the blockers are computed from them;
#   of the others, {locks_per_backend} of a backend's (awaited and contended ones first, the
#   rest in no particular order: sorting each backend's locks by key too doubled the cost of
#   the statement at 100,000 locks, measured with benchmarks.collection_cost).
# - A backend waits for at most one lock, so lock_entries minus the awaited one is what it
#   holds. Every row of one backend carries its current virtualtransaction ("n/0" outside a
#   transaction, where all it holds is session-level): what the collection tells from the
#   backend's own virtualxid lock, a row this read does not keep (they agree:
#   tests/test_outside_transaction.py).
# - The backend cap keeps waiters first, then the holders of contended keys, then those in
#   their state the longest (an idle holder's age is the best age its locks have).
# - oids are cast to bigint, which json_build_array writes as numbers (an oid as a string).
# - client_port is -1 for a Unix socket: read as NULL, like a hidden one (nullif is syntax,
#   not a pg_catalog function).
# - {query} selects the query text only where the target turns it on, cut to a length on the
#   server: the column is not sent otherwise. caller_text is always read, for the caller its
#   comments name, which is all that is kept of it.
# - The start of the backend and of its transaction, and now(), as Unix times: what the
#   collection reads them as, so that a backend is the one its holds were tracked under, and
#   what bounds how long it has held its locks (collect/holds.py).
_FORENSICS_TEMPLATE = """
WITH forensic_locks AS MATERIALIZED (
    SELECT l.pid, l.locktype, l.fastpath, l.database, l.classid, l.objid, l.objsubid, l.mode,
           l.granted, l.waitstart, l.virtualtransaction
    FROM pg_catalog.pg_lock_status() AS l
),
advisory_locks AS NOT MATERIALIZED (
    SELECT * FROM forensic_locks WHERE locktype = 'advisory' AND objsubid <= 2
),
awaited_keys AS (
    SELECT DISTINCT database, classid, objid, objsubid
    FROM advisory_locks
    WHERE NOT granted
),
entries AS (
    SELECT f.*,
           k.objsubid IS NOT NULL AS contended,
           row_number() OVER (
               PARTITION BY f.pid
               ORDER BY f.granted, k.objsubid IS NULL
           ) AS position
    FROM advisory_locks AS f
    LEFT JOIN awaited_keys AS k
           ON k.database = f.database AND k.classid = f.classid AND k.objid = f.objid
          AND k.objsubid = f.objsubid
    WHERE f.pid IS NOT NULL AND f.pid <> pg_catalog.pg_backend_pid()
),
backends AS (
    SELECT e.pid,
           count(*) AS lock_entries,
           bool_or(NOT e.granted) AS waiting,
           bool_or(e.contended AND e.granted) AS blocking,
           min(e.virtualtransaction) AS virtualtransaction,
           pg_catalog.json_agg(
               pg_catalog.json_build_array(
                   e.database::bigint, e.classid::bigint, e.objid::bigint, e.objsubid, e.mode,
                   e.granted, e.waitstart,
                   CASE WHEN NOT e.granted
                        THEN extract(epoch FROM now() - coalesce(e.waitstart, now()))::float8
                   END)
               ORDER BY e.position
           ) FILTER (WHERE e.position <= %(locks_per_backend)s OR e.contended) AS locks
    FROM entries AS e
    GROUP BY e.pid
),
ranked AS (
    SELECT b.*, a.datid, a.application_name, a.client_addr, a.client_port, a.backend_start,
           a.state, a.state_change, a.xact_start,
           pg_catalog.left(a.query, %(caller_text_length)s) AS caller_text{query},
           row_number() OVER (ORDER BY b.waiting DESC, b.blocking DESC,
                                       a.state_change NULLS LAST, b.pid) AS rank,
           count(*) OVER () AS backends_total
    FROM backends AS b
    LEFT JOIN pg_catalog.pg_stat_get_activity(NULL) AS a ON a.pid = b.pid
),
table_holders AS (
    SELECT pg_catalog.json_agg(
               pg_catalog.json_build_array(
                   t.pid, t.entries, a.datid::bigint, a.application_name, a.state)
               ORDER BY t.entries DESC, t.pid) AS table_holders
    FROM (SELECT pid, count(*) AS entries
            FROM forensic_locks
           WHERE NOT fastpath AND pid IS NOT NULL AND pid <> pg_catalog.pg_backend_pid()
           GROUP BY pid
           ORDER BY entries DESC, pid
           LIMIT %(table_holders)s) AS t
    LEFT JOIN pg_catalog.pg_stat_get_activity(NULL) AS a ON a.pid = t.pid
)
SELECT h.table_holders, extract(epoch FROM now())::float8 AS now_unix,
       r.pid, r.lock_entries, r.backends_total, r.locks, r.datid::bigint AS datid,
       r.application_name,
       pg_catalog.split_part(r.virtualtransaction, '/', 2) = '0' AS outside_transaction,
       pg_catalog.host(r.client_addr) AS client_addr,
       nullif(r.client_port, -1) AS client_port,
       r.backend_start, r.state,
       extract(epoch FROM now() - r.state_change)::float8 AS state_seconds,
       r.xact_start,
       extract(epoch FROM r.backend_start)::float8 AS backend_start_unix,
       extract(epoch FROM r.xact_start)::float8 AS xact_start_unix, r.caller_text{query_column}
FROM table_holders AS h
LEFT JOIN ranked AS r ON r.rank <= %(max_backends)s
ORDER BY r.rank
"""
FORENSICS_SQL = _FORENSICS_TEMPLATE.format(query="", query_column="")
FORENSICS_WITH_QUERY_SQL = _FORENSICS_TEMPLATE.format(
    query=",\n           pg_catalog.left(a.query, %(query_text_length)s) AS query",
    query_column=", r.query",
)


# How long a backend has held a named key (its level, its name), in seconds.
_HeldFor = Callable[[Level | None, str], float]


def _entry(
    values: Sequence[Any], datname: str, registry: Registry, held_for: _HeldFor
) -> LockEntry:
    database, classid, objid, objsubid, mode, granted, wait_start, wait_seconds = values
    named = registry.lookup(objsubid, classid, objid, datname)
    key = AdvisoryKey.from_oids(classid, objid, objsubid)
    name: str | None = None
    if named is not None:
        name = named.name
    else:  # a name a library packed into the key, said to be read from it
        packed = distributed_lock_name(key)
        name = None if packed is None else f"DistributedLock {packed!r}"
    return LockEntry(
        database=database,
        key=key,
        mode=vocabulary.mode_word(mode),
        granted=granted,
        wait_start=None if wait_start is None else datetime.fromisoformat(wait_start),
        # now() is the statement's start: a wait begun after it would come out negative.
        wait_seconds=None if wait_seconds is None else max(wait_seconds, 0.0),
        key_name=name,
        catalog=named is not None and named.catalog,
        packed=named is None and name is not None,
        long_lived=named is not None and named.config.long_lived,
        held_seconds=held_for(named.config.level, named.name) if named and granted else None,
    )


def backend_from_row(
    row: Mapping[str, Any],
    registry: Registry,
    poolers: Sequence[PoolerView] = (),
    holds: Holds = NO_HOLDS,
    rules: Sequence[RewriteRule] = (),
    *,
    databases: Databases = NO_DATABASES,
    idle_by_design: IdleByDesign = NOT_IDLE_BY_DESIGN,
) -> Backend:
    """One backend of the read, its database named from the server's list (`databases`), its
    holds bounded by what the collections before saw (`holds`: the server's last collection's)
    and by this read's own timestamps; its application_name as the series give it (the
    target's `rules`) and the entry idle by design that names it, as the series judge it."""
    datname = databases.name(row["datid"])
    state_seconds = None if row["state_seconds"] is None else max(row["state_seconds"], 0.0)
    outside = bool(row["outside_transaction"])
    holder = Holder(
        row["pid"],
        row["backend_start_unix"],
        row["xact_start_unix"],
        row["state"],
        state_seconds,
        not outside,
    )
    now, watching = row["now_unix"], holds.now > 0

    def held(level: Level | None, name: str | None = None) -> Hold:
        return hold_of(holder, now, level, holds.get(holder.identity, name), watching)

    locks = tuple(
        _entry(values, datname, registry, lambda level, name: held(level, name).seconds(now))
        for values in row["locks"] or ()
    )
    application_name = row["application_name"] or ""
    backend = Backend(
        pid=row["pid"],
        datname=datname,
        application_name=application_name,
        rewritten_name=rewrite(application_name, rules),
        idle_by_design=_by_design(idle_by_design, application_name, bool(row["locks"])),
        client_addr=row["client_addr"],
        client_port=row["client_port"],
        backend_start=row["backend_start"],
        state=row["state"],
        state_seconds=state_seconds,
        xact_start=row["xact_start"],
        session_level=holder.session_level,
        lock_entries=row["lock_entries"],
        locks=locks,
        query=row.get("query"),
        caller=caller_of(row["caller_text"]),
        pooled=owner(poolers, row["pid"], row["client_addr"], row["client_port"]),
    )
    if not backend.held_entries:
        return backend
    hold = held(None)
    return dataclasses.replace(
        backend, held_seconds=hold.seconds(now), held_at_least=not hold.seen_begin
    )


def _by_design(idle_by_design: IdleByDesign, application_name: str, locks: bool) -> str:
    entry = idle_by_design.match(application_name) if locks else None
    return "" if entry is None else entry.name


def build(
    target: str,
    rows: Sequence[Mapping[str, Any]],
    registry: Registry,
    poolers: Sequence[PoolerView] = (),
    *,
    databases: Databases = NO_DATABASES,
    query_text: bool = False,
    holds: Holds = NO_HOLDS,
    rules: Sequence[RewriteRule] = (),
    idle_by_design: IdleByDesign = NOT_IDLE_BY_DESIGN,
) -> Forensics:
    """Map the statement's rows (backends_total and table_holders are on each: the same; a
    row without a pid stands for no backend holding or awaiting an advisory lock)."""
    backends = [
        backend_from_row(
            row, registry, poolers, holds, rules, databases=databases, idle_by_design=idle_by_design
        )
        for row in rows
        if row["pid"] is not None
    ]
    total = rows[0]["backends_total"] or 0 if rows else 0
    table_holders = tuple(
        TableHolder(pid, entries, databases.name(datid), application_name or "", state)
        for pid, entries, datid, application_name, state in (
            (rows[0]["table_holders"] if rows else None) or ()
        )
    )
    return assemble(
        target,
        backends,
        total,
        poolers=poolers,
        query_text=query_text,
        table_holders=table_holders,
    )


def parameters(settings: LocksPageSettings) -> dict[str, int]:
    """The forensics statement's parameters: its caps, and how much of a query it reads."""
    return {
        "locks_per_backend": LOCKS_PER_BACKEND,
        "max_backends": MAX_BACKENDS,
        "table_holders": TABLE_HOLDERS,
        "caller_text_length": CALLER_TEXT_LENGTH if settings.callers else 0,
        "query_text_length": settings.query_text_length,
    }


def read_rows(conn: psycopg.Connection[Any], settings: LocksPageSettings) -> list[dict[str, Any]]:
    """Run the forensics statement once."""
    sql = FORENSICS_WITH_QUERY_SQL if settings.query_text else FORENSICS_SQL
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(sql, parameters(settings)).fetchall()


def read_poolers(
    target: TargetSettings, watchdog: Watchdog, seconds: float
) -> tuple[PoolerView, ...]:
    """The target's poolers, each read on a new connection closed after it."""
    if not target.poolers:
        return ()
    poolers = Poolers(target.poolers, target.collection)
    try:
        return poolers.read(watchdog, seconds)
    finally:
        poolers.close()


def answer_kept(
    target: TargetSettings,
    server: Server,
    watchdog: Watchdog,
    holds: Callable[[], Holds] = lambda: NO_HOLDS,
    poolers: tuple[PoolerView, ...] | None = None,
) -> Forensics:
    """Read the target once on the connection its server keeps, between two collections
    (never a new connection, since none can start while the lock table is full), then its
    poolers, unless given (`check`'s collection has just read them), within one collection's
    deadline: the daemon's /locks, and `check` after its one collection. Raises Unanswered."""
    deadline = target.collection.collection_deadline
    started = time.monotonic()
    rows: list[dict[str, Any]] = []

    def read(reading: Reading) -> Reading:
        rows[:] = read_rows(reading.conn, target.locks_page)
        return reading

    reading = server.between_collections(read, deadline)
    views = (
        read_poolers(target, watchdog, deadline - (time.monotonic() - started))
        if poolers is None
        else poolers
    )
    return _built(target, rows, reading, views, holds())


def _built(
    target: TargetSettings,
    rows: Sequence[Mapping[str, Any]],
    reading: Reading,
    views: tuple[PoolerView, ...],
    holds: Holds,
) -> Forensics:
    return build(
        target.name,
        rows,
        reading.registry,
        views,
        databases=reading.databases,
        query_text=target.locks_page.query_text,
        holds=holds,
        rules=target.collection.rewrite_rules,
        idle_by_design=target.idle_by_design,
    )
