"""More migration tools of the catalog (exporter/keys/well_known_migrators.py), run for real
against the test server: each one's own lock, named by the catalog, at the level the catalog
says, and gone when the tool is done, as test_catalog_clients.py does for the others.

Each tool's migration waits for a lock this test holds, so that the tool holds its advisory
lock for as long as the test looks. @slonik/migrator comes from the npm registry and DBOS from
PyPI, each pinned and installed into build/ by tests/clients.py: both take their lock on a
connection of their own, which sits idle while the migration runs on another. Sequel 5.78 or
later comes from Debian sid (devtools/debian_sid.py; Debian 12's 5.63 takes no lock), run by
Debian 12's ruby and ruby-pg. The other entries of that module are tools that do not install
here (RubyGems, Go, Maven, NuGet): tests/test_catalog.py pins their keys as their sources
compute them and names each one on a real server.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from urllib.parse import quote

import pytest
from clients import (
    StartClient,
    Watch,
    blocked_by,
    check_level,
    client_environment,
    database_url,
    fresh_database,
    in_transaction,
    locks_config,
    row_locked,
)
from support import StartExporter

from devtools.debian_sid import InstallError, sequel_lib
from devtools.embedded_postgres import EmbeddedPostgres
from pg_advisory_exporter.keys.catalog import BY_NAME

# SlonikMigrator.up(), as its CLI's `up` runs it, with the table name its README gives.
SLONIK_MIGRATE = """
const { createPool } = require("slonik")
const { SlonikMigrator } = require("@slonik/migrator")

async function main() {
  const slonik = await createPool(process.argv[2])
  const migrator = new SlonikMigrator({
    migrationsPath: "migrations", migrationTableName: "migration", slonik, logger: undefined,
  })
  const done = await migrator.up()
  await slonik.end()
  console.log(`migrated ${done.map((m) => m.name).join(", ")} with @slonik/migrator`)
}
main().catch((error) => { console.error(error); process.exit(1) })
"""


def test_slonik_migrator_lock(
    start_exporter: StartExporter,
    monitor_dsn: str,
    pg: EmbeddedPostgres,
    npm_clients: Path,
    start_client: StartClient,
    tmp_path: Path,
) -> None:
    exporter = start_exporter(config=locks_config(monitor_dsn))
    database = fresh_database(pg, "ledger")
    (tmp_path / "migrations").mkdir()
    (tmp_path / "migrations" / "2024.01.01T00.00.00.touch-blocker.sql").write_text(
        "UPDATE blocker SET n = n + 1 WHERE id = 1;\n"
    )
    (tmp_path / "migrate.js").write_text(SLONIK_MIGRATE)
    watch = Watch(exporter, "slonik_migrator", database)
    with row_locked(pg, database) as row_holder:
        slonik = start_client(
            "slonik-migrator",
            ["node", "migrate.js", database_url(pg, database)],
            client_environment(pg, database),
        )
        blocked_by(pg, database, row_holder.info.backend_pid)
        holder = watch.held(slonik)
    assert "migrated 2024.01.01T00.00.00.touch-blocker.sql" in slonik.finish()
    watch.gone()
    # Its lock's connection sits idle, outside any transaction, while another one migrates.
    check_level(holder, "session")
    assert holder["state"] == "idle", holder
    with pg.connect(database) as conn:
        assert conn.execute("SELECT n FROM blocker WHERE id = 1").fetchone() == (1,)


def test_dbos_migration_lock(
    start_exporter: StartExporter,
    monitor_dsn: str,
    pg: EmbeddedPostgres,
    py_clients: Path,
    start_client: StartClient,
) -> None:
    """`dbos migrate` of DBOS 3.4 creates its system schema while the test's transaction has
    created one of the same name: it waits there, on a connection of its own, while the
    connection that holds its migration lock sits idle. The entry is opt-in: chosen here."""
    assert not BY_NAME["dbos_migration"].default
    config = {**locks_config(monitor_dsn), "catalog": ["dbos_migration"]}
    exporter = start_exporter(config=config)
    database = fresh_database(pg, "workflows")
    url = f"postgresql://postgres:{quote(pg.password)}@127.0.0.1:{pg.port}/{database}"
    command: list[str | Path] = [py_clients.parent / "dbos", "migrate", "--sys-db-url", url]
    watch = Watch(exporter, "dbos_migration", database)
    with in_transaction(pg, database, "CREATE SCHEMA dbos", "schema-holder") as schema_holder:
        dbos = start_client("dbos", command, client_environment(pg, database))
        blocked_by(pg, database, schema_holder.info.backend_pid)
        holder = watch.held(dbos)
    output = dbos.finish()
    watch.gone()
    check_level(holder, "session")
    assert holder["state"] == "idle", holder
    with pg.connect(database) as conn:
        [(version,)] = conn.execute("SELECT version FROM dbos.dbos_migrations").fetchall()
    assert version > 0, output


# Sequel::Migrator.run with use_advisory_lock, as an application's migrate task runs it.
SEQUEL_MIGRATE = """
require "sequel"
Sequel.extension :migration
DB = Sequel.connect(adapter: "postgres", host: ENV["PGHOST"], port: ENV["PGPORT"].to_i,
                    user: ENV["PGUSER"], password: ENV["PGPASSWORD"], database: ARGV[0])
Sequel::Migrator.run(DB, "migrations", use_advisory_lock: true)
puts "migrated with Sequel #{Sequel::VERSION}"
"""
SEQUEL_MIGRATION = """
Sequel.migration do
  up { run "UPDATE blocker SET n = n + 1 WHERE id = 1" }
end
"""


def test_sequel_migrator_lock(
    start_exporter: StartExporter,
    monitor_dsn: str,
    pg: EmbeddedPostgres,
    start_client: StartClient,
    tmp_path: Path,
) -> None:
    ruby = shutil.which("ruby")
    assert ruby, "ruby is not installed (the test command installs Debian's packages)"
    try:
        lib = sequel_lib()
    except InstallError as exc:
        pytest.fail(str(exc))
    exporter = start_exporter(config=locks_config(monitor_dsn))
    database = fresh_database(pg, "pacts")
    (tmp_path / "migrations").mkdir()
    (tmp_path / "migrations" / "001_touch_blocker.rb").write_text(SEQUEL_MIGRATION)
    (tmp_path / "migrate.rb").write_text(SEQUEL_MIGRATE)
    env = {**client_environment(pg, database), "RUBYLIB": str(lib)}
    watch = Watch(exporter, "sequel_migration", database)
    with row_locked(pg, database) as row_holder:
        sequel = start_client("sequel", [ruby, "migrate.rb", database], env)
        blocked_by(pg, database, row_holder.info.backend_pid)
        holder = watch.held(sequel)
    assert f"migrated with Sequel {lib.parent.name.removeprefix('sequel-')}" in sequel.finish()
    watch.gone()
    # Its try-lock cannot be made to wait, and the migration runs in a transaction on the
    # connection that holds it (waiting for the row: active): the name is what this shows.
    assert holder["state"] == "active", holder
    with pg.connect(database) as conn:
        assert conn.execute("SELECT n FROM blocker WHERE id = 1").fetchone() == (1,)
