"""Lock hygiene on a real server: how long a dead client would keep its locks, as the server's
settings change, and the risky statements a client ran, read from pg_stat_statements and
named by check and /locks. On every version: settings and pg_stat_statements are the
server's own."""

from __future__ import annotations

import json
import logging
import math
import os
import re
import resource
import signal
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from support import PG_MAJOR, Cli, RunningExporter, Scrape, StartExporter, wait_until

from devtools.embedded_postgres import EmbeddedPostgres
from pg_advisory_exporter.collect.connection import prepare_session
from pg_advisory_exporter.collect.dead_client import (
    LINUX_KEEPALIVE_COUNT,
    LINUX_KEEPALIVE_IDLE,
    LINUX_KEEPALIVE_INTERVAL,
)
from pg_advisory_exporter.collect.pg_stat_statements import (
    PARSE_SECONDS,
    READER_NAME,
    TEXT_BYTES,
    Statements,
    StatementsRead,
    read_once,
    read_statements,
)
from pg_advisory_exporter.collect.scheduling import Watchdog
from pg_advisory_exporter.config.collection import CollectionSettings
from pg_advisory_exporter.config.settings import TargetSettings
from pg_advisory_exporter.hygiene.risky import SAFE_FORM, WHAT, Rule

pytestmark = pytest.mark.pg

QUICK = {"min_interval": "1ms", "reconnect_backoff_max": "1s"}
RELEASE = "pg_advisory_dead_client_release_seconds"
IDLE_IN_TRANSACTION = "pg_advisory_idle_in_transaction_release_seconds"
HOLDERS = "pg_advisory_idle_session_holders"
RISKY = "pg_advisory_risky_statements"

# Each risky form and its safe rewrite, on tables of their own so that each statement's text
# tells which it is; the rules the risky one breaks.
FORMS = [
    (
        "SELECT pg_advisory_lock(id) FROM limited WHERE id > 2 LIMIT 3",
        "SELECT pg_advisory_lock(q.id)"
        " FROM (SELECT id FROM limited_safe WHERE id > 2 LIMIT 3) AS q",
        {"lock_in_limited_scan"},
    ),
    (
        "SELECT id FROM queue WHERE pg_try_advisory_lock(id) LIMIT 2",
        "SELECT pg_try_advisory_lock(q.id) FROM (SELECT id FROM queue_safe ORDER BY id LIMIT 2"
        " FOR UPDATE SKIP LOCKED) AS q",
        {"lock_in_limited_scan", "lock_in_where"},
    ),
    (
        "UPDATE jobs SET taken = true WHERE pg_try_advisory_xact_lock(id)",
        "UPDATE jobs_safe SET taken = true WHERE id IN (SELECT id FROM jobs_safe LIMIT 1"
        " FOR UPDATE SKIP LOCKED) AND taken = false",
        {"lock_in_where"},
    ),
    (
        "SELECT pg_advisory_lock(hashtext('signup:' || name)) FROM hashed",
        "SELECT pg_advisory_lock(hashtextextended('signup:' || name, 0)) FROM hashed_safe",
        {"hashtext_key"},
    ),
]
TABLES = ["limited", "limited_safe", "queue", "queue_safe", "jobs", "jobs_safe", "hashed",
          "hashed_safe"]  # fmt: skip


@pytest.fixture(scope="module")
def server() -> Iterator[EmbeddedPostgres]:
    """A server with pg_stat_statements loaded, reachable over TCP and a Unix socket."""
    server = EmbeddedPostgres(major=PG_MAJOR)
    try:
        server.start(
            shared_preload_libraries="pg_stat_statements",
            unix_socket_directories=server.server_path(server.basedir),
        )
        with server.connect() as conn:
            conn.execute("CREATE DATABASE nostatements")
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def settings_reset(server: EmbeddedPostgres) -> Iterator[None]:
    yield
    with server.connect() as conn:
        conn.execute("ALTER SYSTEM RESET ALL")
        conn.execute("SELECT pg_reload_conf()")


def _system(server: EmbeddedPostgres, **settings: str | int) -> None:
    with server.connect() as conn:
        for name, value in settings.items():
            conn.execute(f"ALTER SYSTEM SET {name} = '{value}'")
        conn.execute("SELECT pg_reload_conf()")


def _linux(name: str) -> int:
    return int(Path(f"/proc/sys/net/ipv4/{name}").read_text())


def _exporter(start_exporter: StartExporter, dsn: str, **collection: str) -> RunningExporter:
    return start_exporter(
        config={"collection": {**QUICK, **collection}, "targets": [{"name": "main", "dsn": dsn}]}
    )


def _value_is(name: str, expected: float) -> Callable[[Scrape], bool]:
    def check(scrape: Scrape) -> bool:
        found = scrape.find(name, target="main")
        return len(found) == 1 and found[0][1] == expected

    return check


def test_the_dead_client_bound_follows_the_servers_settings(
    server: EmbeddedPostgres, start_exporter: StartExporter, settings_reset: None
) -> None:
    exporter = _exporter(start_exporter, server.dsn())
    # Keepalives left to the operating system: its own values, as on any TCP session.
    linux = _linux("tcp_keepalive_time") + _linux("tcp_keepalive_intvl") * _linux(
        "tcp_keepalive_probes"
    )
    scrape = exporter.scrape_until(_value_is(RELEASE, linux))
    assert scrape.value(IDLE_IN_TRANSACTION, target="main") == math.inf
    assert scrape.value(HOLDERS, target="main") == 0

    with psycopg.connect(server.dsn(), autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(4242)")
        exporter.scrape_until(_value_is(HOLDERS, 1))
        # A reload applies new keepalives to open connections too (the exporter's own).
        _system(server, tcp_keepalives_idle=60, tcp_keepalives_interval=10, tcp_keepalives_count=6)
        exporter.scrape_until(_value_is(RELEASE, 60 + 10 * 6))
        # tcp_user_timeout overrides the count: dropped at the first tick past 95s of silence.
        _system(server, tcp_user_timeout="95s")
        exporter.scrape_until(_value_is(RELEASE, 60 + 10 * 4))
        _system(server, idle_session_timeout="90s", idle_in_transaction_session_timeout="30s")
        scrape = exporter.scrape_until(_value_is(RELEASE, 90))
        assert scrape.value(IDLE_IN_TRANSACTION, target="main") == 30
        # A holder inside a transaction holds no lock outside one.
        holder.execute("SELECT pg_advisory_unlock(4242)")
        holder.execute("BEGIN")
        holder.execute("SELECT pg_advisory_xact_lock(4242)")
        scrape = exporter.scrape_until(_value_is(HOLDERS, 0))
        assert scrape.value("pg_advisory_holders", target="main", state="idle_in_transaction")
        holder.execute("ROLLBACK")


def test_over_a_unix_socket_the_configured_keepalives_are_read(
    server: EmbeddedPostgres, start_exporter: StartExporter, settings_reset: None
) -> None:
    """SHOW gives 0 on a Unix socket whatever is set: the configured values count, and 0 is
    Linux's default."""
    dsn = f"host={server.basedir} port={server.port} dbname=postgres user=postgres " + (
        f"password={server.password}"
    )
    exporter = _exporter(start_exporter, dsn)
    default = LINUX_KEEPALIVE_IDLE + LINUX_KEEPALIVE_INTERVAL * LINUX_KEEPALIVE_COUNT
    exporter.scrape_until(_value_is(RELEASE, default))
    _system(server, tcp_keepalives_idle=30, tcp_keepalives_interval=5, tcp_keepalives_count=3)
    exporter.scrape_until(_value_is(RELEASE, 30 + 5 * 3))


def _run_forms(server: EmbeddedPostgres) -> None:
    with server.connect() as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        for table in TABLES:
            conn.execute(
                f"CREATE TABLE IF NOT EXISTS {table} (id int, name text, taken bool DEFAULT false)"
            )
            conn.execute(
                f"INSERT INTO {table} (id, name) SELECT g, 'n' || g FROM generate_series(1, 6) g"
            )
        conn.execute("SELECT pg_stat_statements_reset()")
    with psycopg.connect(server.dsn(), autocommit=True, application_name="forms") as client:
        for risky, safe, _ in FORMS:
            for statement in (risky, safe):
                client.execute(statement)
                client.execute("SELECT pg_advisory_unlock_all()")


def _risky_texts(found: list[dict[str, object]]) -> set[str]:
    return {str(entry["statement"]) for entry in found}


def test_risky_statements_are_named_and_their_safe_forms_are_not(
    server: EmbeddedPostgres, start_exporter: StartExporter, cli: Cli
) -> None:
    _run_forms(server)
    exporter = _exporter(start_exporter, server.dsn(), statements_interval="1m")
    scrape = exporter.scrape_until(
        lambda s: bool(s.find("pg_advisory_statements_up", target="main")), timeout=30
    )
    assert scrape.value("pg_advisory_statements_up", target="main") == 1, exporter.log()
    expected: dict[str, int] = {}
    for _, _, rules in FORMS:
        for rule in rules:
            expected[rule] = expected.get(rule, 0) + 1
    found = {labels["rule"]: value for labels, value in scrape.find(RISKY, target="main")}
    assert found == expected
    assert {labels["datname"] for labels, _ in scrape.find(RISKY, target="main")} == {"postgres"}
    assert all(value == 0 for _, value in scrape.find("pg_advisory_statements_skipped"))

    status, body = exporter.get("/locks?target=main&format=json")
    assert status == 200, body
    listed = json.loads(body)["risky_statements"]["statements"]
    by_table = {
        next(t for t in TABLES if f" {t} " in f" {entry['statement']} ".replace(")", " ")): entry
        for entry in listed
    }
    assert set(by_table) == {"limited", "queue", "jobs", "hashed"}, listed
    for (risky, _, rules), table in zip(FORMS, ["limited", "queue", "jobs", "hashed"], strict=True):
        assert set(by_table[table]["rules"]) == rules, risky
        assert by_table[table]["datname"] == "postgres"
        assert by_table[table]["calls"] == 1

    status, page = exporter.get("/locks?target=main")
    assert status == 200
    section = page[page.index("<h2>Risky lock statements (4)</h2>") :].split("<ul")[0]
    assert {table for table in TABLES if re.search(rf"\b{table}\b", section)} == set(by_table)

    report = cli("check", "--dsn", server.dsn(), check=True).stdout
    # The statements, then each rule they break with what is wrong and its safe form.
    hashtext = (
        f"    hashtext_key: {WHAT[Rule.HASHTEXT_KEY]} Safe form: {SAFE_FORM[Rule.HASHTEXT_KEY]}"
    )
    listing = report[report.index("  Hygiene") : report.index(hashtext)]
    named = {table for table in TABLES if re.search(rf"\b{table}\b", listing)}
    assert named == {"limited", "queue", "jobs", "hashed"}, listing
    assert "Risky statements in pg_stat_statements (4)" in listing


# A hash beside a lock, or filtering its rows, and hashes that compute the key (through a
# pair's second half, a cast, an expression, a CTE), each statement on a table of its own.
HASH_BESIDE = {
    "beside": "SELECT hashtext(name), pg_advisory_xact_lock(id) FROM beside",
    "filtering": "SELECT pg_advisory_xact_lock(id) FROM filtering WHERE hashtext(name) <> 7",
}
HASH_KEYED = {
    "pair": "SELECT pg_advisory_lock(1001, hashtext(name)) FROM pair",
    "cast": "SELECT pg_advisory_xact_lock(hashtext(name || 'x')::bigint) FROM cast_key",
    "expression": "SELECT pg_advisory_lock((hashtext(name) & 65535)::bigint + 1) FROM expression",
    "cte": "WITH k AS (SELECT hashtext(name) AS h FROM cte) SELECT pg_advisory_lock(k.h) FROM k",
}


def test_a_hash_is_a_key_only_where_it_computes_a_locks_argument(
    server: EmbeddedPostgres,
) -> None:
    """The issue's two lookalikes and the true forms, run by a client and read back from the
    server's pg_stat_statements (constants normalised to $n) by the real reader."""
    tables = ["beside", "filtering", "pair", "cast_key", "expression", "cte"]
    with server.connect() as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        for table in tables:
            conn.execute(f"CREATE TABLE IF NOT EXISTS {table} (id int, name text)")
            conn.execute(f"INSERT INTO {table} SELECT g, 'n' || g FROM generate_series(1, 3) g")
        conn.execute("SELECT pg_stat_statements_reset()")
    with psycopg.connect(server.dsn(), autocommit=True, application_name="keys") as client:
        for statement in [*HASH_BESIDE.values(), *HASH_KEYED.values()]:
            assert client.execute(statement).fetchall()
            client.execute("SELECT pg_advisory_unlock_all()")
    with psycopg.connect(server.dsn(), autocommit=True) as conn:
        found = read_statements(prepare_session(conn, CollectionSettings()))
    assert found.ok, found.error
    keyed = {
        next(t for t in tables if re.search(rf"\b{t}\b", risky.text))
        for risky in found.risky
        if Rule.HASHTEXT_KEY in risky.rules
    }
    assert keyed == {"pair", "cast_key", "expression", "cte"}, found.risky
    normalised = [r.text for r in found.risky if "$1" in r.text]
    assert normalised, found.risky  # the texts are the server's, constants replaced


def test_a_database_without_the_extension_says_so_once(
    server: EmbeddedPostgres, caplog: pytest.LogCaptureFixture
) -> None:
    """Read twice on a real server: the reason each time, logged once."""
    target = TargetSettings(
        name="plain",
        dsn=server.dsn("nostatements"),
        collection=CollectionSettings(),
        catalog=False,
    )
    statements = Statements(target, Watchdog())
    with caplog.at_level(logging.INFO, logger="pg_advisory_exporter.collect.pg_stat_statements"):
        first = statements.read()
        second = statements.read()
    assert first.error is not None
    assert "CREATE EXTENSION pg_stat_statements" in first.error
    assert second.error == first.error
    said = [r for r in caplog.records if "pg_stat_statements" in r.getMessage()]
    assert len(said) == 1, said


def test_hostile_statement_texts_are_read_and_judged_within_bounds(
    server: EmbeddedPostgres, capsys: pytest.CaptureFixture[str]
) -> None:
    """What applications can put in pg_stat_statements: a text over the per-statement
    limit, texts that together pass the read's byte limit, a comment that names a lock call,
    deep nesting; through the real reader and parser, its time and memory measured."""
    with server.connect() as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        conn.execute("CREATE TABLE IF NOT EXISTS wide (c int)")
        conn.execute("SELECT pg_stat_statements_reset()")
    padding = "x" * 60_000  # each statement just under MAX_STATEMENT_BYTES
    with psycopg.connect(server.dsn(), autocommit=True, application_name="hostile") as client:
        for _ in range(2):  # too long, and called more than the others: read first
            client.execute(f"SELECT pg_advisory_unlock_all() /* {'y' * 70_000} */")
        for width in range(1, 181):  # 180 x 60 KB: past the read's 8 MiB of text
            columns = ", ".join(["c"] * width)
            client.execute(f"SELECT pg_advisory_unlock_all(), {columns} FROM wide /* {padding} */")
        nested = "(" * 500 + "c > 0" + ")" * 500
        for _ in range(3):  # called more than the others: read first
            client.execute("SELECT 1 /* pg_advisory_lock(id) FROM jobs LIMIT 1 */")  # a comment
            client.execute(f"SELECT pg_advisory_lock(c) FROM wide WHERE {nested} LIMIT 1")
        client.execute("SELECT pg_advisory_unlock_all()")
    with server.connect() as conn:
        screened = conn.execute(
            "SELECT count(*) FROM pg_stat_statements WHERE query ILIKE '%advisory%'"
        ).fetchone()
    with psycopg.connect(server.dsn(), autocommit=True) as conn:
        session = prepare_session(conn, CollectionSettings())
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        tracemalloc.start()
        started = time.perf_counter()
        found = read_statements(session)
        seconds = time.perf_counter() - started
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert found.ok, found.error
    assert found.skipped["too_long"] == 1
    assert found.skipped["over_limit"] > 0
    # The statements called more, then the 60 KB ones up to the read's byte limit.
    assert (found.texts - 2) * 60_000 <= TEXT_BYTES < (found.texts - 1) * 60_000
    # Each statement the screen kept is read, too long, or over a limit: once.
    assert screened is not None
    assert found.texts + found.skipped["too_long"] + found.skipped["over_limit"] == screened[0]
    # Only the nested statement is risky: a comment is no call.
    assert [(r.rules, r.calls) for r in found.risky] == [
        (frozenset({Rule.LOCK_IN_LIMITED_SCAN}), 3)
    ]
    assert found.parse_seconds <= PARSE_SECONDS + 1.0  # the budget, and one statement past it
    assert peak < 4 * TEXT_BYTES  # the texts read, and what parsing them takes
    with capsys.disabled():
        print(
            f"\nhostile pg_stat_statements: read {found.texts} statements in {seconds:.2f}s "
            f"(parsing {found.parse_seconds:.2f}s), Python peak {peak / 1e6:.1f} MB, "
            f"max RSS {rss_before / 1024:.0f} -> {rss_after / 1024:.0f} MB; skipped "
            f"{dict(found.skipped)}; risky {[r.text[:40] for r in found.risky]}"
        )


def test_without_the_grant_only_the_roles_own_statements_are_judged(
    server: EmbeddedPostgres, caplog: pytest.LogCaptureFixture
) -> None:
    """Another role's texts read "<insufficient privilege>" without pg_read_all_stats: they
    are never judged, and the GRANT is named once."""
    _run_forms(server)  # as the superuser
    with server.connect() as conn:
        conn.execute("DROP ROLE IF EXISTS watcher")
        conn.execute("CREATE ROLE watcher LOGIN PASSWORD 'watcher'")
    with psycopg.connect(server.dsn(user="watcher", password="watcher"), autocommit=True) as own:
        own.execute("SELECT pg_advisory_lock(hashtext('mine'))")
        own.execute("SELECT pg_advisory_unlock_all()")
    target = TargetSettings(
        name="plain",
        dsn=server.dsn(user="watcher", password="watcher"),
        collection=CollectionSettings(),
        catalog=False,
    )
    statements = Statements(target, Watchdog())
    with caplog.at_level(logging.INFO, logger="pg_advisory_exporter.collect.pg_stat_statements"):
        first = statements.read()
        statements.read()
    assert first.ok, first.error
    assert not first.reads_all
    assert [(r.rolname, r.rules) for r in first.risky] == [
        ("watcher", frozenset({Rule.HASHTEXT_KEY}))
    ]
    said = [r.getMessage() for r in caplog.records if "GRANT pg_read_all_stats" in r.getMessage()]
    assert len(said) == 1, said
    assert said[0].endswith('fix with GRANT pg_read_all_stats TO "watcher"')


def test_the_runbooks_settings_bound_a_dead_client_as_it_says(
    server: EmbeddedPostgres, start_exporter: StartExporter, settings_reset: None
) -> None:
    """The runbook's fix, run as it is written, statement by statement (ALTER SYSTEM runs
    outside a transaction block), gives the bound it promises: 120 s."""
    runbook = (Path(__file__).resolve().parent.parent / "docs" / "runbook.md").read_text()
    section = runbook[runbook.index("## PgAdvisoryDeadClientKeepsLocks") :]
    block = re.search(r"```sql\n(.*?)```", section, flags=re.DOTALL)
    assert block is not None
    exporter = _exporter(start_exporter, server.dsn())
    with server.connect() as conn:
        for statement in re.findall(r"^[^-\n][^;]*;", block[1], flags=re.MULTILINE):
            conn.execute(statement)
    assert "60 + 6 x 10 = 120 s" in block[1]
    exporter.scrape_until(_value_is(RELEASE, 120))


def test_a_read_that_hangs_is_given_up_at_its_deadline_and_says_so(
    server: EmbeddedPostgres,
) -> None:
    """A backend that stops answering mid-read (frozen here while it waits for a lock on the
    view): the read ends at the collection's deadline, 5s, and says that it had no answer."""
    with server.connect() as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    quick = CollectionSettings(connect_timeout=2, statement_timeout=2, lock_timeout=2)
    target = TargetSettings(name="hung", dsn=server.dsn(), collection=quick, catalog=False)
    found: list[StatementsRead] = []
    with psycopg.connect(server.dsn()) as locker:
        locker.execute("LOCK TABLE pg_stat_statements IN ACCESS EXCLUSIVE MODE")
        reading = threading.Thread(target=lambda: found.append(read_once(target, Watchdog())))
        reading.start()
        waiting: list[int] = []

        def reader_waits() -> bool:
            with server.connect() as conn:
                rows = conn.execute(
                    "SELECT pid FROM pg_stat_activity WHERE application_name = %s"
                    " AND wait_event_type = 'Lock'",
                    (READER_NAME,),
                ).fetchall()
            waiting[:] = [row[0] for row in rows]
            return bool(waiting)

        wait_until(reader_waits, 5, "the read waiting for the view's lock")
        os.kill(waiting[0], signal.SIGSTOP)
        try:
            locker.rollback()
            reading.join(15)
        finally:
            os.kill(waiting[0], signal.SIGCONT)
    assert not reading.is_alive()
    [read] = found
    assert read.error is not None
    assert read.error.startswith("no answer within 5s"), read.error
