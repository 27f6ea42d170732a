"""A server holding tens of thousands of locks: the collection reads them in memory."""

from __future__ import annotations

import re
from collections.abc import Iterator

import psycopg
import pytest
from support import PG_MAJOR

from devtools.embedded_postgres import EmbeddedPostgres
from pg_advisory_exporter.collect.connection import prepare_session
from pg_advisory_exporter.collect.databases import read_databases
from pg_advisory_exporter.collect.snapshot import collect_sql
from pg_advisory_exporter.config.collection import CollectionSettings

# More than the default work_mem (4MB) keeps in a tuplestore (about 150 bytes a lock), far
# fewer than the exporter's session setting does.
LOCKS = 40_000


@pytest.fixture(scope="module")
def crowded() -> Iterator[EmbeddedPostgres]:
    """A server whose lock table has room for about 62,000 entries, LOCKS advisory locks held."""
    server = EmbeddedPostgres(major=PG_MAJOR)
    try:
        server.start(max_locks_per_transaction=512)
        with server.connect(application_name="bulk-import") as holder:
            holder.execute(
                "SELECT count(pg_advisory_lock(k)) FROM generate_series(1, %s) AS k", (LOCKS,)
            )
            yield server
    finally:
        server.cleanup()


def _temporary_blocks(conn: psycopg.Connection[tuple[object, ...]]) -> int:
    statement = collect_sql(conn.info.server_version)
    listed = {"databases": list(read_databases(conn).worked_in)}
    plan = conn.execute("EXPLAIN (ANALYZE, BUFFERS) " + statement, listed).fetchall()
    return sum(
        int(n)
        for (line,) in plan
        for n in re.findall(r"temp (?:read=\d+ )?written=(\d+)", str(line))
    )


@pytest.mark.pg  # starts its own server; on every version, whose spilling differs
def test_the_collection_keeps_its_rows_in_memory_where_a_default_session_spills(
    crowded: EmbeddedPostgres,
) -> None:
    with crowded.connect() as default, crowded.connect() as exporter:
        prepare_session(exporter, CollectionSettings())
        # At the server's work_mem the rows spill to disk before PostgreSQL 18; on 18 and 19
        # the same statement writes no temporary block at all.
        assert (_temporary_blocks(default) > 0) is (PG_MAJOR < 18)
        assert _temporary_blocks(exporter) == 0
        row = exporter.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'")
        assert row.fetchone() == (LOCKS,)
