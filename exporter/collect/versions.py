"""What the collection statement reads by the server's version: each read with the version it
appears in, its part of the statement and the mapping of its columns, as postgres_exporter's
collectors switch their queries on the server's version. The statement is built for the
version of the connection it runs on (psycopg knows it from the connection's start: no round
trip), so a read of a view that an older server lacks is never sent to it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LockWaits:
    """The server's own count of advisory lock waits (pg_stat_lock, PostgreSQL 19): those that
    outlived deadlock_timeout and then got the lock, and the time they waited. A wait given up
    (lock_timeout, a cancel), a shorter one and a pg_try_advisory_* call are not counted."""

    waits: int
    wait_seconds: float


@dataclass(frozen=True)
class VersionedRead:
    """One read of the statement's `totals` (its one row), from `since` on."""

    name: str
    since: int  # server_version_num
    columns: str  # select-list items of `totals`, each after a comma
    series: tuple[str, ...]  # what it is exported as (absent from older servers)


# pg_stat_lock has one row per lock type; wait_time is in milliseconds. As text, like the
# deadlocks: only the first row's value is parsed.
ADVISORY_LOCK_WAITS = VersionedRead(
    "advisory lock waits (pg_stat_lock)",
    190000,
    """,
        (SELECT pg_catalog.json_build_array(s.waits, s.wait_time)
           FROM pg_catalog.pg_stat_lock AS s
          WHERE s.locktype = 'advisory')::text AS advisory_lock_waits""",
    ("pg_advisory_server_lock_waits_total", "pg_advisory_server_lock_wait_seconds_total"),
)

# Newest last.
READS: tuple[VersionedRead, ...] = (ADVISORY_LOCK_WAITS,)


def columns_for(version: int) -> str:
    """The versioned part of `totals` for a server of this version."""
    return "".join(read.columns for read in READS if version >= read.since)


def lock_waits(row: Mapping[str, Any]) -> LockWaits | None:
    """The advisory lock waits of `totals`' row; None before PostgreSQL 19 (not read)."""
    found = row.get("advisory_lock_waits")
    if found is None:
        return None
    waits, wait_ms = json.loads(found)
    return LockWaits(int(waits), float(wait_ms) / 1000.0)
