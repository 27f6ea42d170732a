"""Real migration tools and job queues against the test server: each one's own lock, named
by the catalog, at the level the catalog says, and gone when the tool is done.

Each tool runs work that waits for a lock this test holds (a row its migration updates, a
table or a schema its DDL needs), so that the tool holds its advisory lock for as long as the
test looks; then the test lets go, the tool finishes, and its lock goes with it. Where a tool
waits for its advisory lock, the test takes that key first, so that the tool is seen waiting
too. ActiveRecord and Sqitch come from Debian (the test command installs them);
node-pg-migrate, pg-boss and Kysely from the npm registry, PgQueuer and langchain-postgres from
PyPI, each pinned and installed into build/ by tests/clients.py. pg_repack and pg_partman,
which run in the server, are in test_catalog_extensions.py. Run on every supported version: a
tool's session, its transactions and its lock are read as each version shows them.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

import pytest
from clients import (
    RAILS_MIGRATE,
    RAILS_MIGRATION,
    Client,
    Level,
    PgQueuerKeys,
    Row,
    StartClient,
    Watch,
    advisory_locks,
    blocked,
    blocked_by,
    check_level,
    client_environment,
    database_url,
    fresh_database,
    in_transaction,
    locks_config,
    pg_boss_starts,
    pgqueuer_takes_its_locks,
    row_locked,
)
from support import RunningExporter, StartExporter

from devtools.embedded_postgres import EmbeddedPostgres
from pg_advisory_exporter.keys.catalog import BY_NAME


@pytest.fixture
def exporter(start_exporter: StartExporter, monitor_dsn: str) -> RunningExporter:
    """The exporter with the catalog as it ships, /locks read anew at each request."""
    return start_exporter(config=locks_config(monitor_dsn))


def _installed(name: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} is not installed (the test command installs Debian's packages)"
    return path


def _migrates(
    watch: Watch,
    pg: EmbeddedPostgres,
    start: Callable[[], Client],
    settled: Callable[[Row], bool] = lambda row: True,
) -> tuple[Row, str]:
    """The tool that `start` starts migrates while the blocker row is locked: its lock is
    named while its migration waits for the row, and gone once it has finished. Its /locks
    row while it held the lock and waited (once `settled`), and its output."""
    with row_locked(pg, watch.datname) as row_holder:
        tool = start()
        blocked_by(pg, watch.datname, row_holder.info.backend_pid)
        holder = watch.held(tool, settled)
    output = tool.finish()
    watch.gone()
    with pg.connect(watch.datname) as conn:
        assert conn.execute("SELECT n FROM blocker WHERE id = 1").fetchone() == (1,), output
    return holder, output


def test_activerecord_migration_lock(
    exporter: RunningExporter, pg: EmbeddedPostgres, start_client: StartClient, tmp_path: Path
) -> None:
    ruby = _installed("ruby")
    database = fresh_database(pg, "inventory")
    (tmp_path / "db" / "migrate").mkdir(parents=True)
    (tmp_path / "db" / "migrate" / "20240101000000_touch_blocker.rb").write_text(RAILS_MIGRATION)
    (tmp_path / "migrate.rb").write_text(RAILS_MIGRATE)
    env = client_environment(pg)
    holder, output = _migrates(
        Watch(exporter, "rails_migration", database),
        pg,
        lambda: start_client("rails", [ruby, "migrate.rb", database], env),
    )
    assert "migrated with ActiveRecord 6.1" in output
    # Its lock connection sits idle, outside any transaction, while another one migrates.
    check_level(holder, "session")
    assert holder["state"] == "idle"


SQITCH_PLAN = """%syntax-version=1.0.0
%project=catalog_test

touch_blocker 2024-01-01T00:00:00Z Catalog Test <catalog@example.com> # waits for the row
"""


def test_sqitch_deploy_lock(
    exporter: RunningExporter, pg: EmbeddedPostgres, start_client: StartClient, tmp_path: Path
) -> None:
    sqitch = _installed("sqitch")
    _installed("psql")  # Sqitch runs each change's script with psql
    database = fresh_database(pg, "warehouse")
    (tmp_path / "sqitch.conf").write_text("[core]\n\tengine = pg\n")
    (tmp_path / "sqitch.plan").write_text(SQITCH_PLAN)
    scripts = {
        "deploy": "UPDATE blocker SET n = n + 1 WHERE id = 1;",
        "revert": "SELECT 1;",
        "verify": "SELECT 1;",
    }
    for folder, script in scripts.items():
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "touch_blocker.sql").write_text(script + "\n")
    env = {
        **client_environment(pg),
        "SQITCH_USER_CONFIG": str(tmp_path / "user.conf"),  # none: the user's own stays out
        "SQITCH_FULLNAME": "Catalog Test",
        "SQITCH_EMAIL": "catalog@example.com",
    }
    target = f"db:pg://postgres@127.0.0.1:{pg.port}/{database}"
    # Sqitch takes its session lock outside a transaction (pg_try_advisory_lock), then, on the
    # same connection, opens its registry transaction (LOCK TABLE changes) before psql runs
    # the change (App::Sqitch::Engine deploy_change: begin_work, then run_deploy): while the
    # change waits for the row, its lock's connection is idle in that transaction, where
    # nobody can tell a session lock from a transaction one, and the page does not claim it.
    holder, output = _migrates(
        Watch(exporter, "sqitch", database),
        pg,
        lambda: start_client("sqitch", [sqitch, "deploy", target], env),
    )
    assert "+ touch_blocker .. ok" in output
    assert holder["state"] == "idle_in_transaction", holder
    assert holder["session_level"] is False, holder


NODE_MIGRATION = """
exports.up = (pgm) => {
  pgm.sql("UPDATE blocker SET n = n + 1 WHERE id = 1");
};
"""


def test_node_pg_migrate_lock(
    exporter: RunningExporter,
    pg: EmbeddedPostgres,
    npm_clients: Path,
    start_client: StartClient,
    tmp_path: Path,
) -> None:
    database = fresh_database(pg, "shipping")
    (tmp_path / "migrations").mkdir()
    (tmp_path / "migrations" / "1700000000000_touch-blocker.js").write_text(NODE_MIGRATION)
    env = {**client_environment(pg), "DATABASE_URL": database_url(pg, database)}
    command: list[str | Path] = [npm_clients / ".bin" / "node-pg-migrate", "up", "-m", "migrations"]
    # Its try-lock cannot be made to wait, and the migration runs in a transaction on the
    # connection that holds it (waiting for the row: active): the name, not the level, is
    # what this shows.
    holder, output = _migrates(
        Watch(exporter, "node_pg_migrate", database),
        pg,
        lambda: start_client("node-pg-migrate", command, env),
    )
    assert "Migrations complete!" in output
    assert holder["state"] == "active"


def test_pg_boss_schema_lock_and_queues(
    exporter: RunningExporter,
    pg: EmbeddedPostgres,
    npm_clients: Path,
    start_client: StartClient,
    tmp_path: Path,
) -> None:
    """pg-boss 10.4 installs its schema under its schema lock, `pgboss_migration`, computed
    from a database name that needs quoting; its createQueue takes no advisory lock at all
    (pgboss_create_queue is 11's and 12's)."""
    database = fresh_database(pg, 'Boss "DB"-\u00fc')
    boss, _ = pg_boss_starts(
        Watch(exporter, "pgboss_migration", database), pg, start_client, tmp_path, "pgboss"
    )
    assert "pg-boss 10.4.2 started" in boss.output()
    # createQueue inserts into pgboss.queue, which the test holds: it waits there, and no
    # backend of the database holds or awaits an advisory lock.
    with in_transaction(pg, database, "LOCK TABLE pgboss.queue IN SHARE MODE", "queue-locker"):
        boss.proceed()
        blocked(pg, database, "pgboss")
        assert advisory_locks(pg, database) == []
        scrape = exporter.scrape()
        assert scrape.find("pg_advisory_key_holders", datname=database) == []
        assert scrape.find("pg_advisory_key_waiters", datname=database) == []
    assert "created queue reports" in boss.finish()


# Kysely's Migrator with one migration that waits for the row; the version is the package
# given (`kysely` is 0.29.9, `kysely-0.28` 0.28.17: tests/npm-clients/package.json).
KYSELY_MIGRATE = """\
import pg from 'pg'

const [pkg, url] = process.argv.slice(2)
const { Kysely, PostgresDialect, sql, ...kysely } = await import(pkg)
const { Migrator } = kysely.Migrator ? kysely : await import(`${pkg}/migration`)
const pool = new pg.Pool({ connectionString: url, application_name: 'kysely-migrator' })
const db = new Kysely({ dialect: new PostgresDialect({ pool }) })
const migrations = {
  '0001_touch_blocker': {
    async up (db) { await sql`UPDATE blocker SET n = n + 1 WHERE id = 1`.execute(db) }
  }
}
const migrator = new Migrator({ db, provider: { getMigrations: async () => migrations } })
const { error, results } = await migrator.migrateToLatest()
await db.destroy()
if (error) {
  console.error(error)
  process.exit(1)
}
for (const result of results) console.log(`${result.migrationName}: ${result.status}`)
"""


@pytest.mark.parametrize(
    ("package", "level"),
    [
        ("kysely", "session"),  # 0.29.9: pg_advisory_lock, then a transaction, then unlock
        ("kysely-0.28", "transaction"),  # 0.28.17: pg_advisory_xact_lock in its transaction
    ],
)
def test_kysely_migration_lock(
    exporter: RunningExporter,
    pg: EmbeddedPostgres,
    npm_clients: Path,
    start_client: StartClient,
    tmp_path: Path,
    package: str,
    level: Level,
) -> None:
    assert BY_NAME["kysely_migration"].lock_level is None  # it depends on the version
    database = fresh_database(pg, "catalogue")
    (tmp_path / "migrate.mjs").write_text(KYSELY_MIGRATE)
    command = ["node", "migrate.mjs", package, database_url(pg, database)]
    watch = Watch(exporter, "kysely_migration", database)
    with row_locked(pg, database):
        other = "SELECT pg_advisory_xact_lock(3853314791062309107)"  # another migrator
        with in_transaction(pg, database, other, "other-migrator"):
            kysely = start_client(package, command, client_environment(pg, database))
            waiter = watch.awaited(kysely)
        # A session lock once the statement that waited for it is done: until then the
        # backend still shows that statement's transaction. A transaction lock stays in it.
        holder = watch.held(
            kysely,
            lambda row: level == "transaction" or row["xact_start"] != waiter["xact_start"],
        )
    assert waiter["application_name"] == holder["application_name"] == "kysely-migrator"
    check_level(holder, level, waiter)
    assert "0001_touch_blocker: Success" in kysely.finish()
    watch.gone()


def test_pgqueuer_upgrade_and_statistics_locks(
    exporter: RunningExporter,
    pg: EmbeddedPostgres,
    py_clients: Path,
    start_client: StartClient,
) -> None:
    """PgQueuer 1.6 with its default names: `pgq upgrade`'s lock and its statistics fold's,
    the keys the catalog computes as the library does."""
    database = fresh_database(pg, "queues")
    names = ("pgqueuer_upgrade", "pgqueuer_statistics")
    keys = pgqueuer_takes_its_locks(exporter, pg, start_client, py_clients, database, "", names)
    # As the catalog says (crc32 of the queue table's name; hashtext of the statistics
    # table's), and the exporter named both as the library took them.
    assert keys == PgQueuerKeys(upgrade=2389487409, statistics_text="pgqueuer_statistics")


# LangChain's PGVector as an application builds it: the store creates the vector extension
# under its lock in __post_init__. Whether the server has pgvector or not, the lock is taken
# first; the script says which way it went.
LANGCHAIN_PGVECTOR = """\
import sys
from importlib.metadata import version

from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_postgres import PGVector

print(f"langchain-postgres {version('langchain-postgres')}", flush=True)
try:
    PGVector(embeddings=DeterministicFakeEmbedding(size=3), connection=sys.argv[1])
    print("vector store ready")
except Exception as error:
    print(f"no vector store: {error}")
"""

# CREATE EXTENSION waits for the test's row before it runs (an event trigger fires first):
# the store's transaction holds its advisory lock while it waits.
EXTENSION_WAITS = """
CREATE FUNCTION wait_for_blocker() RETURNS event_trigger LANGUAGE plpgsql
  AS $$ BEGIN UPDATE blocker SET n = n + 1 WHERE id = 1; END $$;
CREATE EVENT TRIGGER extension_waits ON ddl_command_start WHEN TAG IN ('CREATE EXTENSION')
  EXECUTE FUNCTION wait_for_blocker();
"""


def test_langchain_pgvector_extension_lock(
    exporter: RunningExporter,
    pg: EmbeddedPostgres,
    py_clients: Path,
    start_client: StartClient,
    tmp_path: Path,
) -> None:
    database = fresh_database(pg, "embeddings")
    with pg.connect(database) as conn:
        conn.execute(EXTENSION_WAITS)
    (tmp_path / "pgvector.py").write_text(LANGCHAIN_PGVECTOR)
    url = (
        f"postgresql+psycopg://postgres:{quote(pg.password)}@127.0.0.1:{pg.port}/{database}"
        "?application_name=langchain-pgvector"
    )
    watch = Watch(exporter, "langchain_pgvector_extension", database)
    with row_locked(pg, database) as row_holder:
        store = start_client("langchain", [py_clients, "pgvector.py", url], client_environment(pg))
        blocked_by(pg, database, row_holder.info.backend_pid)
        holder = watch.held(store)
    output = store.finish()
    watch.gone()
    assert "langchain-postgres 0.0.19" in output
    assert holder["application_name"] == "langchain-pgvector"
    # Taken in the transaction that creates the extension, and held there while it waits.
    check_level(holder, "transaction")
    assert holder["state"] == "active"
