"""Real migration tools against the test server: each one's own lock, named by the catalog.

Each tool runs a migration that waits for a row this test keeps locked, so that the tool
holds its migration lock for as long as the test looks; then the row is let go, the tool
finishes, and its lock goes with it. ActiveRecord and Sqitch come from Debian (the test
command installs them), node-pg-migrate and pg from the npm registry (pinned, installed by
the fixture below into build/, kept between runs).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from support import RunningExporter, Scrape

from devtools.embedded_postgres import EmbeddedPostgres

# Version-independent (tests/conftest.py): each tool computes its key itself; the statement that
# reads keys is checked on every version (test_scenarios.py).
pytestmark = pytest.mark.any_version

ROOT = Path(__file__).parent.parent
NPM_PACKAGES = ("node-pg-migrate@7.9.1", "pg@8.16.3")  # 7.9 runs on Debian 12's Node 18 too
NPM_DIR = ROOT / "build" / "npm-clients"
WAIT = 60.0  # for a tool to finish once the row is free


def _fresh_database(pg: EmbeddedPostgres, name: str) -> str:
    """An empty database with one row for the migrations to wait on."""
    with pg.connect() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    with psycopg.connect(pg.dsn(name), autocommit=True) as conn:
        conn.execute("CREATE TABLE blocker (id int PRIMARY KEY, n int NOT NULL)")
        conn.execute("INSERT INTO blocker VALUES (1, 0)")
    return name


def _client_environment(pg: EmbeddedPostgres) -> dict[str, str]:
    """libpq's variables: ruby-pg, DBD::Pg, psql and node's pg all read them."""
    return {
        **os.environ,
        "PGHOST": "127.0.0.1",
        "PGPORT": str(pg.port),
        "PGUSER": "postgres",
        "PGPASSWORD": pg.password,
    }


def _installed(name: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} is not installed (the test command installs Debian's packages)"
    return path


def _holders(scrape: Scrape, key: str, datname: str) -> list[float]:
    found = scrape.find("pg_advisory_key_holders", target="main", key=key, datname=datname)
    return [value for _, value in found]


@contextmanager
def _row_locked(pg: EmbeddedPostgres, database: str) -> Iterator[None]:
    """The row stays locked (FOR UPDATE, in an open transaction) until the block ends."""
    with psycopg.connect(pg.dsn(database), application_name="row-holder") as conn:
        conn.execute("SELECT n FROM blocker WHERE id = 1 FOR UPDATE")
        yield
        conn.rollback()


def _migrate_while_held(
    exporter: RunningExporter,
    pg: EmbeddedPostgres,
    database: str,
    key: str,
    command: list[str],
    cwd: Path,
    env: Mapping[str, str],
) -> str:
    """Run the tool while the row is locked: its lock must show by name, and be gone once
    the tool has finished. Returns the tool's output."""
    log_path = cwd / "tool.log"
    with _row_locked(pg, database), log_path.open("w") as log:
        process = subprocess.Popen(
            command, cwd=cwd, env=dict(env), stdout=log, stderr=subprocess.STDOUT
        )

        def named(scrape: Scrape) -> bool:
            if process.poll() is not None:  # it cannot have waited for the row
                pytest.fail(f"{command[0]} ended early:\n{log_path.read_text()}")
            return _holders(scrape, key, database) == [1.0]

        try:
            exporter.scrape_until(named)
        except BaseException:
            process.kill()
            process.wait()
            raise
    try:
        returncode = process.wait(timeout=WAIT)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    output = log_path.read_text()
    assert returncode == 0, output
    exporter.scrape_until(lambda s: _holders(s, key, database) == [])
    with psycopg.connect(pg.dsn(database)) as conn:
        assert conn.execute("SELECT n FROM blocker WHERE id = 1").fetchone() == (1,), output
    return output


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


def test_activerecord_migration_lock(
    exporter: RunningExporter, pg: EmbeddedPostgres, tmp_path: Path
) -> None:
    ruby = _installed("ruby")
    database = _fresh_database(pg, "inventory")
    (tmp_path / "db" / "migrate").mkdir(parents=True)
    (tmp_path / "db" / "migrate" / "20240101000000_touch_blocker.rb").write_text(RAILS_MIGRATION)
    (tmp_path / "migrate.rb").write_text(RAILS_MIGRATE)
    output = _migrate_while_held(
        exporter,
        pg,
        database,
        "rails_migration",
        [ruby, "migrate.rb", database],
        tmp_path,
        _client_environment(pg),
    )
    assert "migrated with ActiveRecord 6.1" in output


SQITCH_PLAN = """%syntax-version=1.0.0
%project=catalog_test

touch_blocker 2024-01-01T00:00:00Z Catalog Test <catalog@example.com> # waits for the row
"""


def test_sqitch_deploy_lock(
    exporter: RunningExporter, pg: EmbeddedPostgres, tmp_path: Path
) -> None:
    sqitch = _installed("sqitch")
    _installed("psql")  # Sqitch runs each change's script with psql
    database = _fresh_database(pg, "warehouse")
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
        **_client_environment(pg),
        "SQITCH_USER_CONFIG": str(tmp_path / "user.conf"),  # none: the user's own stays out
        "SQITCH_FULLNAME": "Catalog Test",
        "SQITCH_EMAIL": "catalog@example.com",
    }
    target = f"db:pg://postgres@127.0.0.1:{pg.port}/{database}"
    output = _migrate_while_held(
        exporter, pg, database, "sqitch", [sqitch, "deploy", target], tmp_path, env
    )
    assert "+ touch_blocker .. ok" in output


@pytest.fixture(scope="session")
def node_pg_migrate() -> Path:
    """node-pg-migrate's command, installed with npm into build/ once, and again only when
    the pinned versions change."""
    npm = shutil.which("npm")
    assert npm, "npm is not installed (Node.js with npm: `apt-get install nodejs npm`)"
    stamp = NPM_DIR / "installed.txt"
    wanted = " ".join(NPM_PACKAGES)
    if not stamp.exists() or stamp.read_text() != wanted:
        shutil.rmtree(NPM_DIR, ignore_errors=True)
        NPM_DIR.mkdir(parents=True)
        subprocess.run(
            [npm, "install", "--prefix", str(NPM_DIR), "--no-audit", "--no-fund",
             "--save-exact", *NPM_PACKAGES],
            check=True, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        stamp.write_text(wanted)
    return NPM_DIR / "node_modules" / ".bin" / "node-pg-migrate"


NODE_MIGRATION = """
exports.up = (pgm) => {
  pgm.sql("UPDATE blocker SET n = n + 1 WHERE id = 1");
};
"""


def test_node_pg_migrate_lock(
    exporter: RunningExporter, pg: EmbeddedPostgres, node_pg_migrate: Path, tmp_path: Path
) -> None:
    database = _fresh_database(pg, "shipping")
    (tmp_path / "migrations").mkdir()
    (tmp_path / "migrations" / "1700000000000_touch-blocker.js").write_text(NODE_MIGRATION)
    env = {
        **_client_environment(pg),
        "DATABASE_URL": f"postgres://postgres:{pg.password}@127.0.0.1:{pg.port}/{database}",
    }
    output = _migrate_while_held(
        exporter,
        pg,
        database,
        "node_pg_migrate",
        [str(node_pg_migrate), "up", "-m", "migrations"],
        tmp_path,
        env,
    )
    assert "Migrations complete!" in output
