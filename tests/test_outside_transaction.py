""" "Outside any transaction", read two ways from pg_locks: the collection from a backend's own
virtualxid lock (count(virtualxid) > 0), /locks from its locks' virtual transaction ("n/0").
Each statement reads what it already scans, so the two are kept and proven to agree on every
state a backend can be in while it holds or awaits advisory locks, on every version."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any, Protocol

import psycopg
import pytest
from support import block_on, wait_until

from devtools.embedded_postgres import EmbeddedPostgres
from pg_advisory_exporter.collect.snapshot import read_snapshot
from pg_advisory_exporter.config.targets import LocksPageSettings
from pg_advisory_exporter.forensics.read import read_rows

Connection = psycopg.Connection[Any]


class Connect(Protocol):
    def __call__(self, name: str, autocommit: bool = True) -> Connection: ...


@pytest.fixture
def server(own_server: EmbeddedPostgres) -> EmbeddedPostgres:
    """A server of its own that can prepare transactions (whose locks have no pid)."""
    own_server.stop()
    own_server.start(max_prepared_transactions=2)
    return own_server


@pytest.fixture
def connect(server: EmbeddedPostgres) -> Iterator[Connect]:
    """Sessions on that server, named by application_name, closed at the end."""
    opened: list[Connection] = []

    def open_session(name: str, autocommit: bool = True) -> Connection:
        conn = psycopg.connect(server.dsn(), autocommit=autocommit, application_name=name)
        opened.append(conn)
        return conn

    yield open_session
    for conn in opened:
        conn.cancel_safe()
        conn.close()


def _run_in_thread(conn: Connection, sql: str) -> threading.Thread:
    def run() -> None:
        with contextlib.suppress(psycopg.Error):  # cancelled at the end of the test
            conn.execute(sql)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _state_of(server: EmbeddedPostgres, conn: Connection) -> str | None:
    with server.connect() as admin:
        row = admin.execute(
            "SELECT state FROM pg_stat_activity WHERE pid = %s", (conn.info.backend_pid,)
        ).fetchone()
    return None if row is None else row[0]


def test_the_collection_and_locks_agree_on_outside_any_transaction(
    server: EmbeddedPostgres, connect: Connect
) -> None:
    expected: dict[str, tuple[str, bool]] = {}  # application_name: (state, outside)

    idle = connect("idle")  # session locks, between transactions: the classic leak
    idle.execute("SELECT pg_advisory_lock(1), pg_advisory_lock_shared(2)")
    expected["idle"] = ("idle", True)

    open_tx = connect("idle_in_transaction", autocommit=False)  # both levels, not committing
    open_tx.execute("SELECT pg_advisory_lock(3), pg_advisory_xact_lock(4)")
    expected["idle_in_transaction"] = ("idle in transaction", False)

    xact_only = connect("transaction_level_only", autocommit=False)
    xact_only.execute("SELECT pg_advisory_xact_lock(5), pg_advisory_xact_lock_shared(6)")
    expected["transaction_level_only"] = ("idle in transaction", False)

    # An error ends the transaction's work (and frees its transaction-level locks: 8) but not
    # the block: until ROLLBACK the backend is in no transaction, holding session locks only.
    aborted = connect("aborted", autocommit=False)
    aborted.execute("SELECT pg_advisory_lock(7), pg_advisory_xact_lock(8)")
    with pytest.raises(psycopg.errors.DivisionByZero):
        aborted.execute("SELECT 1 / 0")
    expected["aborted"] = ("idle in transaction (aborted)", True)

    active = connect("active", autocommit=False)
    active.execute("SELECT pg_advisory_xact_lock(9)")
    _run_in_thread(active, "SELECT pg_sleep(60)")
    wait_until(lambda: _state_of(server, active) == "active", 10, "the sleep to run")
    expected["active"] = ("active", False)

    # Waiters: a session lock asked for outside a transaction (its statement is one), and a
    # transaction-level lock inside one.
    block_on(server, connect("waiting_session"), "SELECT pg_advisory_lock(1)")
    expected["waiting_session"] = ("active", False)
    waiting_tx = connect("waiting_transaction", autocommit=False)
    waiting_tx.execute("SELECT 1")
    block_on(server, waiting_tx, "SELECT pg_advisory_xact_lock(3)")
    expected["waiting_transaction"] = ("active", False)

    # A prepared transaction keeps its locks with no backend: neither read lists them.
    prepared = connect("prepared", autocommit=False)
    prepared.execute("SELECT pg_advisory_xact_lock(10)")
    prepared.execute("PREPARE TRANSACTION 'holds_10'")
    prepared.commit()  # psycopg's transaction ends with it; the backend holds nothing now

    try:
        with server.connect(application_name="monitor") as conn:
            without_pid = conn.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid IS NULL"
            ).fetchone()
            aborted_holds = conn.execute(
                "SELECT array_agg(objid::int ORDER BY objid) FROM pg_locks"
                " WHERE locktype = 'advisory' AND pid = %s",
                (aborted.info.backend_pid,),
            ).fetchone()
            snapshot = read_snapshot(conn)
            rows = read_rows(conn, LocksPageSettings())
    finally:
        with server.connect() as admin:
            admin.execute("ROLLBACK PREPARED 'holds_10'")

    assert without_pid == (1,)
    assert aborted_holds == ([7],)  # its session lock only
    collection = {b.application_name: (b.state, not b.in_transaction) for b in snapshot.backends}
    locks = {row["application_name"]: (row["state"], row["outside_transaction"]) for row in rows}
    assert collection == expected
    assert locks == expected
