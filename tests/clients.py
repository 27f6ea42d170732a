"""Real clients against the test server, for the tests of the catalog's well-known keys and of
the registry's worked examples: the npm and Python libraries that take advisory locks (pinned
in tests/npm-clients/ and tests/py-clients.txt, installed into build/ once, and again when a
pin changes), the programs they run as, the databases and the blockers they run against, and
how the exporter shows a lock that one of them holds or awaits.

A client is made to hold its lock for as long as a test looks: its work waits for a lock that
the test holds (a row, a table, a schema), and where the client waits for the advisory lock
itself, the test takes that key first, so that the exporter shows it waiting too.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol
from urllib.parse import quote

import psycopg
import pytest
from psycopg import sql
from support import Connection, RunningExporter, Scrape, wait_until

from devtools.embedded_postgres import EmbeddedPostgres

TESTS = Path(__file__).parent
BUILD = TESTS.parent / "build"
# package.json and package-lock.json: every npm package's version, dependencies' too.
NPM_MANIFEST = TESTS / "npm-clients"
NPM_DIR = BUILD / "npm-clients"
PY_REQUIREMENTS = TESTS / "py-clients.txt"
PY_DIR = BUILD / "py-clients"
INSTALL_TIMEOUT = 600.0
WAIT = 60.0  # for a client to finish once nothing blocks it


# -- Installing them ------------------------------------------------------------------------


def _installed_once(folder: Path, pins: str, install: Callable[[Path], None]) -> Path:
    """`folder`, where `install` put what `pins` names: once, and again (into an emptied
    folder) when the pins change. Under a file lock: `make test` runs versions side by side."""
    BUILD.mkdir(exist_ok=True)
    with (BUILD / f".{folder.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp = folder / ".pins"
        if not stamp.exists() or stamp.read_text() != pins:
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            install(folder)
            stamp.write_text(pins)
    return folder


def _run(command: Sequence[str | Path]) -> None:
    done = subprocess.run(
        [str(part) for part in command],
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, f"{' '.join(map(str, command))}:\n{done.stdout}{done.stderr}"


def install_npm_clients() -> Path:
    """node_modules with the packages of tests/npm-clients/ as its lock file pins them."""
    npm = shutil.which("npm")
    assert npm, "npm is not installed (Node.js with npm: `make system-packages`)"
    files = ("package.json", "package-lock.json")

    def install(folder: Path) -> None:
        for name in files:
            shutil.copy(NPM_MANIFEST / name, folder / name)
        _run([npm, "ci", "--prefix", folder, "--no-audit", "--no-fund"])

    pins = "".join((NPM_MANIFEST / name).read_text() for name in files)
    return _installed_once(NPM_DIR, pins, install) / "node_modules"


def install_py_clients() -> Path:
    """The Python of a virtualenv of its own with exactly the packages tests/py-clients.txt
    pins (no dependency of theirs that it does not list: `pip check` says so)."""

    def install(folder: Path) -> None:
        _run([sys.executable, "-m", "venv", folder])
        python = folder / "bin" / "python"
        _run([python, "-m", "pip", "install", "--quiet", "--no-deps", "-r", PY_REQUIREMENTS])
        _run([python, "-m", "pip", "check"])

    return _installed_once(PY_DIR, PY_REQUIREMENTS.read_text(), install) / "bin" / "python"


# -- Running them ---------------------------------------------------------------------------


def client_environment(pg: EmbeddedPostgres, database: str = "postgres") -> dict[str, str]:
    """libpq's variables, as the superuser: ruby-pg, DBD::Pg, psql, pg_repack, psycopg and
    node's pg all read them."""
    return {
        **os.environ,
        "PGHOST": "127.0.0.1",
        "PGPORT": str(pg.port),
        "PGUSER": "postgres",
        "PGPASSWORD": pg.password,
        "PGDATABASE": database,
    }


def database_url(pg: EmbeddedPostgres, database: str) -> str:
    """A postgres:// URL of the database, as node's pg and pg-boss take it."""
    return f"postgres://postgres:{quote(pg.password)}@127.0.0.1:{pg.port}/{quote(database)}"


@dataclass
class Client:
    """A library's program that a test runs: its output in a log file. A script that waits
    for the test's word reads a line of its standard input (`proceed`)."""

    name: str
    process: subprocess.Popen[str]
    log_path: Path

    def output(self) -> str:
        return self.log_path.read_text()

    def running(self) -> bool:
        """True; fails the test if the client has ended (it cannot have waited, then)."""
        if self.process.poll() is not None:
            pytest.fail(f"{self.name} ended ({self.process.returncode}):\n{self.output()}")
        return True

    def said(self, text: str) -> bool:
        """Whether it has printed `text`; fails the test if it ended without printing it."""
        if text in self.output():
            return True
        if self.process.poll() is not None and text not in self.output():
            pytest.fail(f"{self.name} ended without saying {text!r}:\n{self.output()}")
        return False

    def proceed(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write("\n")
        self.process.stdin.flush()

    def finish(self, timeout: float = WAIT) -> str:
        """Wait for it to end, successfully; its output."""
        try:
            returncode = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"{self.name} did not finish within {timeout}s:\n{self.output()}")
        assert returncode == 0, f"{self.name} failed ({returncode}):\n{self.output()}"
        return self.output()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def start(name: str, command: Sequence[str | Path], cwd: Path, env: Mapping[str, str]) -> Client:
    """Start `command` in `cwd`; its output goes to `cwd`/`name`.log. Node finds the npm
    packages from any folder a test runs it in: `cwd` gets a link to build/'s node_modules."""
    modules = cwd / "node_modules"
    if NPM_DIR.exists() and not modules.exists():
        modules.symlink_to(NPM_DIR / "node_modules")
    log_path = cwd / f"{name.replace(' ', '-')}.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [str(part) for part in command],
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )
    return Client(name, process, log_path)


class StartClient(Protocol):
    """The `start_client` fixture: `start` in the test's folder unless told, and killed at
    its end if it still runs."""

    def __call__(
        self,
        name: str,
        command: Sequence[str | Path],
        env: Mapping[str, str],
        cwd: Path | None = None,
    ) -> Client: ...


# ActiveRecord::MigrationContext#migrate, as `rails db:migrate` runs it (ActiveRecord 6.1,
# whose Migrator takes the lock on a connection of its own).
RAILS_MIGRATE = """
require "active_record"
ActiveRecord::Base.establish_connection(
  adapter: "postgresql", host: ENV["PGHOST"], port: ENV["PGPORT"],
  username: ENV["PGUSER"], password: ENV["PGPASSWORD"], database: ARGV[0]
)
ActiveRecord::MigrationContext.new("db/migrate", ActiveRecord::SchemaMigration).migrate
puts "migrated with ActiveRecord #{ActiveRecord::VERSION::STRING}"
"""
RAILS_MIGRATION = """
class TouchBlocker < ActiveRecord::Migration[6.1]
  def up
    execute "UPDATE blocker SET n = n + 1 WHERE id = 1"
  end
end
"""


# -- What they run against ------------------------------------------------------------------


def fresh_database(pg: EmbeddedPostgres, name: str) -> str:
    """An empty database (made anew) with one row for migrations to wait on."""
    quoted = sql.Identifier(name)
    with pg.connect() as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(quoted))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(quoted))
    with pg.connect(name) as conn:
        conn.execute("CREATE TABLE blocker (id int PRIMARY KEY, n int NOT NULL)")
        conn.execute("INSERT INTO blocker VALUES (1, 0)")
    return name


@contextlib.contextmanager
def in_transaction(
    pg: EmbeddedPostgres, database: str, statement: str, application_name: str = "blocker"
) -> Iterator[Connection]:
    """`statement` run in a transaction that stays open until the block ends (a lock held,
    a snapshot kept), on a session of its own that then closes."""
    with psycopg.connect(pg.dsn(database), application_name=application_name) as conn:
        conn.execute(statement)
        yield conn
        conn.rollback()


def row_locked(pg: EmbeddedPostgres, database: str) -> contextlib.AbstractContextManager[Any]:
    """The blocker row locked (FOR UPDATE) until the block ends: a migration that updates it
    waits."""
    return in_transaction(
        pg, database, "SELECT n FROM blocker WHERE id = 1 FOR UPDATE", "row-holder"
    )


def _until_counted(pg: EmbeddedPostgres, query: str, arguments: tuple[Any, ...], what: str) -> None:
    """Wait until `query` (a count) counts something."""
    with pg.connect() as admin:
        wait_until(lambda: admin.execute(query, arguments).fetchone() != (0,), WAIT, what)


def blocked(pg: EmbeddedPostgres, database: str, application_name: str) -> None:
    """Wait until a backend of `application_name` in `database` waits for some lock."""
    _until_counted(
        pg,
        "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)"
        " WHERE NOT l.granted AND a.datname = %s AND a.application_name = %s",
        (database, application_name),
        f"{application_name} waiting for a lock in {database}",
    )


def blocked_by(pg: EmbeddedPostgres, database: str, pid: int) -> None:
    """Wait until a backend in `database` waits for a lock that backend `pid` holds: a tool's
    migration has reached the row the test locked, the state it stays in until the test lets
    go (the moments before it, a tool's own queries and transactions, are not)."""
    _until_counted(
        pg,
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = %s AND %s = ANY (pg_blocking_pids(pid))",
        (database, pid),
        f"a backend in {database} waiting behind backend {pid}",
    )


def advisory_locks(pg: EmbeddedPostgres, database: str) -> list[tuple[Any, ...]]:
    """The advisory locks in `database`, as pg_locks has them."""
    with pg.connect() as admin:
        return admin.execute(
            "SELECT l.pid, l.classid, l.objid, l.objsubid, l.granted FROM pg_locks l"
            " JOIN pg_database d ON d.oid = l.database"
            " WHERE l.locktype = 'advisory' AND d.datname = %s",
            (database,),
        ).fetchall()


# -- How the exporter shows them ------------------------------------------------------------

Level = Literal["session", "transaction"]
Row = dict[str, Any]  # a backend of the /locks page's JSON


def locks_config(dsn: str, keys: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """An exporter's configuration with one target, `main`, collecting at every scrape and
    reading /locks anew at every request, with these registry entries."""
    return {
        "collection": {"min_interval": "1ms", "reconnect_backoff_max": "1s"},
        "locks_page": {"reuse_for": "1ms"},
        "keys": list(keys),
        "targets": [{"name": "main", "dsn": dsn}],
    }


@dataclass(frozen=True)
class Watch:
    """One named key in one database, through the exporter's series and its /locks page
    (the configuration of `locks_config`)."""

    exporter: RunningExporter
    key: str
    datname: str

    def counts(self, scrape: Scrape) -> tuple[list[float], list[float]]:
        """The key's pg_advisory_key_holders and _waiters samples in its database."""
        labels = {"target": "main", "key": self.key, "datname": self.datname}
        return (
            [value for _, value in scrape.find("pg_advisory_key_holders", **labels)],
            [value for _, value in scrape.find("pg_advisory_key_waiters", **labels)],
        )

    def page(self) -> dict[str, Any]:
        status, body = self.exporter.get("/locks?target=main&format=json")
        assert status == 200, body
        found: dict[str, Any] = json.loads(body)
        return found

    def rows(self, page: Mapping[str, Any]) -> tuple[list[Row], list[Row]]:
        """The /locks holders and waiters of the key in its database."""
        here = [
            row for row in (*page["holders"], *page["waiters"]) if row["datname"] == self.datname
        ]
        holders = [
            r for r in here if any(lock["key_name"] == self.key for lock in r.get("locks", ()))
        ]
        waiters = [r for r in here if r.get("awaits", {}).get("key_name") == self.key]
        return holders, waiters

    def _until(
        self,
        holders: int,
        waiters: int,
        client: Client | None,
        settled: Callable[[Row], bool] = lambda row: True,
    ) -> tuple[list[Row], list[Row]]:
        """Scrape until the series count these holders and waiters, then read /locks until it
        agrees and every row it lists is `settled`; its rows."""
        want = ([float(holders)] if holders else [], [float(waiters)] if holders or waiters else [])

        def counted(scrape: Scrape) -> bool:
            return (client is None or client.running()) and self.counts(scrape) == want

        self.exporter.scrape_until(counted, timeout=WAIT)
        found: list[tuple[list[Row], list[Row]]] = []

        def listed() -> bool:
            found[:] = [self.rows(self.page())]
            rows = [*found[0][0], *found[0][1]]
            return tuple(map(len, found[0])) == (holders, waiters) and all(map(settled, rows))

        wait_until(listed, WAIT, lambda: f"/locks listing {self.key}: {found}")
        return found[0]

    def awaited(self, client: Client) -> Row:
        """Wait until the key is held (by the test) and awaited by one backend, the client's;
        its /locks row."""
        return self._until(1, 1, client)[1][0]

    def held(
        self, client: Client | None = None, settled: Callable[[Row], bool] = lambda row: True
    ) -> Row:
        """Wait until one backend holds the key and none awaits it, and its /locks row is
        `settled` (a tool that works in its lock's connection is read once it waits); the row."""
        return self._until(1, 0, client, settled)[0][0]

    def gone(self) -> None:
        """Wait until nobody holds or awaits the key: its series are gone."""
        self._until(0, 0, None)


def lock_of(row: Row, key: str) -> dict[str, Any]:
    """The /locks row's lock of the named key."""
    found: list[dict[str, Any]] = [lock for lock in row["locks"] if lock["key_name"] == key]
    assert len(found) == 1, row
    return found[0]


def check_level(holder: Row, level: Level, waiter: Row | None = None) -> None:
    """The holder took its lock at `level`, as far as the server lets one tell:

    - transaction: it is inside a transaction (the /locks page does not call its locks
      session-level), and if it waited for the lock (`waiter`, its row then), it is still
      in the transaction it waited in;
    - session: it is outside any transaction (the page calls its locks session-level), or
      it waited for the lock in a transaction that has ended since, and holds it still.
    """
    if level == "transaction":
        assert holder["xact_start"] is not None, holder
        assert holder["session_level"] is False, holder
        if waiter is not None:
            assert (holder["pid"], holder["xact_start"]) == (waiter["pid"], waiter["xact_start"])
        return
    if holder["xact_start"] is None:
        assert holder["session_level"] is True, holder
        return
    assert waiter is not None, f"a session lock held inside a transaction: {holder}"
    assert holder["pid"] == waiter["pid"], (holder, waiter)
    assert holder["xact_start"] != waiter["xact_start"], (holder, waiter)


# -- pg-boss 10.4 (npm), for the catalog's entry and the registry's example -----------------

# Starts pg-boss, which installs its schema, then creates a queue at the test's word.
BOSS_SCRIPT = """\
const PgBoss = require('pg-boss')
const readline = require('node:readline')

async function main () {
  const [url, schema] = process.argv.slice(2)
  const words = readline.createInterface({ input: process.stdin })
  const word = () => new Promise((resolve) => words.once('line', resolve))
  const boss = new PgBoss({ connectionString: url, schema, supervise: false, schedule: false })
  boss.on('error', (error) => { console.error(error); process.exit(1) })
  await boss.start()
  console.log(`pg-boss ${require('pg-boss/package.json').version} started in schema ${schema}`)
  await word()
  await boss.createQueue('reports')
  console.log('created queue reports')
  words.close()
  await boss.stop({ graceful: false, wait: true })
}

main().catch((error) => { console.error(error); process.exit(1) })
"""


def boss_key_sql(schema: str, key: str = "") -> str:
    """pg-boss's own SQL for its advisory key (plans.js, advisoryLock)."""
    text = f"'.pgboss.{schema}{key}'"
    return f"('x' || encode(sha224((current_database() || {text})::bytea), 'hex'))::bit(64)::bigint"


def pg_boss_starts(
    watch: Watch, pg: EmbeddedPostgres, start_client: StartClient, folder: Path, schema: str
) -> tuple[Client, Row]:
    """pg-boss started in the watched database with `schema`, which it installs in a
    transaction holding its schema lock, `watch.key`: seen waiting for the lock (another
    installer holds the key, taken with pg-boss's own SQL), then holding it at the transaction
    level while its DDL waits for the schema (which the test is dropping, in a transaction
    it then rolls back), then letting it go. Returns pg-boss, which waits for the test's
    word to create a queue, and its /locks row while it held the lock."""
    database = watch.datname
    with pg.connect(database) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')  # empty; pg-boss creates it IF NOT EXISTS
    (folder / "boss.js").write_text(BOSS_SCRIPT)
    command = ["node", "boss.js", database_url(pg, database), schema]
    with in_transaction(pg, database, f'DROP SCHEMA "{schema}"', "schema-dropper"):
        other = f"SELECT pg_advisory_xact_lock({boss_key_sql(schema)})"
        with in_transaction(pg, database, other, "other-boss"):
            boss = start_client("pg-boss", command, client_environment(pg, database), folder)
            waiter = watch.awaited(boss)
        holder = watch.held(boss)
    assert waiter["application_name"] == holder["application_name"] == "pgboss"
    check_level(holder, "transaction", waiter)
    wait_until(lambda: boss.said("started"), WAIT, "pg-boss started")
    watch.gone()
    return boss, holder


# -- PgQueuer 1.6 (PyPI), for the catalog's entries and the registry's examples -------------

# The library's own keys, for the prefix in PGQUEUER_PREFIX: its upgrade lock's, and the SQL
# of its statistics fold, which names the text of its hashtext() key.
PGQUEUER_PROBE = """\
import json
from pgqueuer.adapters.persistence.qb import QueryQueueBuilder
from pgqueuer.adapters.persistence.schema_plan import advisory_key
from pgqueuer.domain.settings import DBSettings

statistics = QueryQueueBuilder().build_aggregate_log_data_to_statistics_query(advisory_lock=True)
print(json.dumps({"upgrade": advisory_key(DBSettings()), "statistics": statistics}))
"""
# Enqueues a job (its log row is what the statistics fold), then at the test's word folds the
# log into the statistics, as PgQueuer's periodic task does, and waits for the word to end.
PGQUEUER_STATISTICS = """\
import asyncio
import sys

import psycopg
from pgqueuer.queries import Queries


async def main() -> None:
    conn = await psycopg.AsyncConnection.connect(
        autocommit=True, application_name="pgqueuer-statistics"
    )
    queries = Queries.from_psycopg_connection(conn)
    await queries.enqueue("reports", b"{}")
    print("enqueued", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    await queries.aggregate_logs()
    print("aggregated", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    await conn.close()


asyncio.run(main())
"""


@dataclass(frozen=True)
class PgQueuerKeys:
    """What PgQueuer itself computes for a prefix."""

    upgrade: int  # `pgq upgrade`'s pg_advisory_lock key
    statistics_text: str  # the text of its statistics fold's hashtext() key


def pgqueuer_takes_its_locks(
    exporter: RunningExporter,
    pg: EmbeddedPostgres,
    start_client: StartClient,
    python: Path,
    database: str,
    prefix: str,
    names: tuple[str, str],
) -> PgQueuerKeys:
    """PgQueuer with PGQUEUER_PREFIX=`prefix` in `database` takes its two locks, named
    `names` (upgrade, statistics):

    - `pgq upgrade` on an installation that lacks a column holds its key (session level)
      while its ALTER TABLE waits for a reader of the queue table; seen first waiting for
      the key, which another upgrade (the test) holds;
    - the statistics fold holds its try-lock (transaction level) while its UPDATE waits for
      log rows the test has locked, and lets it go with its statement, its session open.

    Returns the keys the library computes."""
    env = {**client_environment(pg, database), "PGQUEUER_PREFIX": prefix}
    probe = start_client("pgqueuer probe", [python, "-c", PGQUEUER_PROBE], env).finish()
    found = json.loads(probe.splitlines()[-1])
    [statistics_text] = re.findall(
        r"pg_try_advisory_xact_lock\(hashtext\('([^']*)'\)\)", found["statistics"]
    )
    keys = PgQueuerKeys(found["upgrade"], statistics_text)
    pgq = python.parent / "pgq"
    start_client("pgq install", [pgq, "upgrade"], env).finish()
    with pg.connect(database) as conn:
        conn.execute(f"ALTER TABLE {prefix}pgqueuer DROP COLUMN headers")

    upgrade = Watch(exporter, names[0], database)
    reader = f"SELECT count(*) FROM {prefix}pgqueuer"
    with in_transaction(pg, database, reader, "queue-dashboard"):
        other = f"SELECT pg_advisory_xact_lock({keys.upgrade})"
        with in_transaction(pg, database, other, "other-upgrade"):
            client = start_client("pgq upgrade", [pgq, "upgrade"], env)
            waiter = upgrade.awaited(client)
        # Its session lock once its wait ended: until the statement that waited is done, the
        # backend still shows that statement's transaction (check_level's session case).
        holder = upgrade.held(client, lambda row: row["xact_start"] != waiter["xact_start"])
        check_level(holder, "session", waiter)
    assert "Applied 1 statement" in client.finish()
    upgrade.gone()

    statistics = Watch(exporter, names[1], database)
    client = start_client("pgqueuer statistics", [python, "-c", PGQUEUER_STATISTICS], env)
    wait_until(lambda: client.said("enqueued"), WAIT, "PgQueuer enqueuing a job")
    log_rows = f"SELECT id FROM {prefix}pgqueuer_log WHERE NOT aggregated FOR UPDATE"
    with in_transaction(pg, database, log_rows, "log-reader"):
        client.proceed()
        holder = statistics.held(client)
    assert holder["application_name"] == "pgqueuer-statistics"
    check_level(holder, "transaction")
    wait_until(lambda: client.said("aggregated"), WAIT, "PgQueuer folding its log")
    statistics.gone()  # its session still open: the lock went with the transaction
    client.proceed()
    client.finish()
    return keys
