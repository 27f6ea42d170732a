"""A leaked lock pages: real PostgreSQL, exporter, Prometheus, Alertmanager and a webhook."""

from __future__ import annotations

import contextlib
import json
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from clients import (
    RAILS_MIGRATE,
    RAILS_MIGRATION,
    StartClient,
    client_environment,
    database_url,
    fresh_database,
    row_locked,
)
from log_events import fill_lock_table
from pgbouncer import SESSION_POOL, STATS_PASSWORD, PgBouncer
from support import (
    SUITE_LOG_PREFIX,
    Cli,
    OneTarget,
    RunningExporter,
    StartExporter,
    StartService,
    load_yaml,
    prometheus_query,
    start_prometheus,
    wait_until,
)

from devtools.embedded_postgres import EmbeddedPostgres, free_port
from pg_advisory_exporter.keys.catalog import selected_idle_by_design

# Version-independent (tests/conftest.py): Prometheus and Alertmanager end to end; any server gives
# the lock.
pytestmark = pytest.mark.any_version

ROOT = Path(__file__).parent.parent
RUNBOOK = ROOT / "docs" / "runbook.md"
ARRIVES_WITHIN = 60.0


@dataclass
class Webhook:
    """Alertmanager's webhook receiver: keeps every alert it is sent."""

    port: int
    alerts: list[dict[str, Any]] = field(default_factory=list)

    def wait_for(
        self, alertname: str, status: str, within: float = ARRIVES_WITHIN, *others: str
    ) -> dict[str, Any]:
        """The first alert of this name (or of one of `others`) and status to arrive."""
        names = {alertname, *others}
        found: list[dict[str, Any]] = []

        def arrived() -> bool:
            found[:] = [
                alert
                for alert in list(self.alerts)  # a copy: the server's thread appends
                if alert["labels"]["alertname"] in names and alert["status"] == status
            ]
            return bool(found)

        wait_until(arrived, within, lambda: f"a {status} {sorted(names)}: {self.alerts}")
        return found[0]


@pytest.fixture
def webhook() -> Iterator[Webhook]:
    hook = Webhook(free_port())

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            hook.alerts.extend(body["alerts"])
            self.send_response(200)
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", hook.port), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield hook
    server.shutdown()
    server.server_close()


def _alertmanager_config(webhook: Webhook) -> dict[str, Any]:
    """The example configuration in docs/, pointed at the test's webhook, with short waits."""
    config: dict[str, Any] = load_yaml((ROOT / "docs" / "alertmanager.yml").read_text())
    config["route"].update(group_wait="1s", group_interval="1s", repeat_interval="1h")
    config["receivers"][0]["webhook_configs"][0]["url"] = f"http://127.0.0.1:{webhook.port}/"
    return config


def _prometheus_and_alertmanager(
    exporter: RunningExporter,
    rules: Path,
    webhook: Webhook,
    start_service: StartService,
    tmp_path: Path,
) -> int:
    """Alertmanager with the example configuration, and Prometheus scraping the exporter
    every second as job pg-advisory with these rules; Prometheus' port."""
    (tmp_path / "alertmanager.yml").write_text(yaml.safe_dump(_alertmanager_config(webhook)))
    alertmanager = start_service(
        "prometheus-alertmanager",
        "--config.file=alertmanager.yml",
        "--storage.path=alertmanager-data",
        "--cluster.listen-address=",  # no gossip port on all interfaces
        ready_path="/-/ready",
    )
    prometheus_config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "alerting": {
            "alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{alertmanager}"]}]}]
        },
        "scrape_configs": [
            {
                "job_name": "pg-advisory",
                "static_configs": [{"targets": [f"127.0.0.1:{exporter.port}"]}],
            }
        ],
    }
    return start_prometheus(start_service, tmp_path, prometheus_config)


def _has_series(prometheus: int, query: str) -> bool:
    return bool(prometheus_query(prometheus, query))


@pytest.mark.slow
def test_a_leaked_lock_pages_and_resolves(
    start_exporter: StartExporter,
    one_target: OneTarget,
    monitor_dsn: str,
    pg: EmbeddedPostgres,
    webhook: Webhook,
    start_service: StartService,
    tmp_path: Path,
    cli: Cli,
) -> None:
    exporter = start_exporter(config=one_target(monitor_dsn, name="orders"))

    # The documented tuning: the generator with lowered thresholds.
    rules = tmp_path / "rules.yml"
    rules.write_text(
        cli("rules", "--set", "leaked_lock_after=2s", "--set", "leaked_lock_for=1s",
            "--set", "exporter_job=pg-advisory", check=True).stdout
    )  # fmt: skip

    _prometheus_and_alertmanager(exporter, rules, webhook, start_service, tmp_path)

    with psycopg.connect(pg.dsn(), autocommit=True, application_name="billing-worker") as leaked:
        leaked.execute("SELECT pg_advisory_lock(7310001)")
        firing = webhook.wait_for("PgAdvisoryLockLeaked", "firing")
        labels = firing["labels"]
        assert (labels["target"], labels["datname"], labels["application_name"]) == (
            "orders",
            "postgres",
            "billing-worker",
        )
        assert labels["severity"] == "critical"
        assert (
            "billing-worker in database postgres on orders"
            in (firing["annotations"]["description"])
        )
        assert firing["annotations"]["runbook_url"].endswith("#pgadvisorylockleaked")
        leaked.execute("SELECT pg_advisory_unlock(7310001)")
    resolved = webhook.wait_for("PgAdvisoryLockLeaked", "resolved")
    assert resolved["labels"]["application_name"] == "billing-worker"


# The stranded-lock alert with its shipped thresholds (`for` 1m): it pages in about a
# minute, where the leak alert would take 17. One PostgreSQL version is enough: what is
# tested is PgBouncer, the rule and the alerting path, not the server.
PAGES_WITHIN = 100.0


@pytest.mark.slow
def test_a_session_lock_stranded_in_a_transaction_pool_pages_in_a_minute(
    pgbouncer: PgBouncer,
    start_exporter: StartExporter,
    one_target: OneTarget,
    monitor_dsn: str,
    webhook: Webhook,
    start_service: StartService,
    tmp_path: Path,
    cli: Cli,
) -> None:
    password = tmp_path / "pgbouncer-password"
    password.write_text(STATS_PASSWORD)
    config = one_target(monitor_dsn, name="orders")
    config["targets"][0]["poolers"] = [
        {"name": "pgbouncer-main", "admin_dsn": pgbouncer.admin_dsn(with_password=False),
         "password_file": str(password)}
    ]  # fmt: skip
    exporter = start_exporter("--web.external-url", "https://exporter.example.com/", config=config)
    rules = tmp_path / "rules.yml"
    rules.write_text(cli("rules", "--set", "exporter_job=pg-advisory", check=True).stdout)
    _prometheus_and_alertmanager(exporter, rules, webhook, start_service, tmp_path)

    # A job holds its session lock through the session pool all along: that is its own.
    with psycopg.connect(
        pgbouncer.dsn(SESSION_POOL), autocommit=True, application_name="session-job"
    ) as own:
        own.execute("SELECT pg_advisory_lock(8001)")
        started = time.monotonic()
        with psycopg.connect(
            pgbouncer.dsn(), autocommit=True, application_name="nightly-job"
        ) as job:
            job.execute("SELECT pg_advisory_lock(8002)")
        firing = webhook.wait_for(
            "PgAdvisorySessionLockInTransactionPool", "firing", within=PAGES_WITHIN
        )
        took = time.monotonic() - started
        print(f"PgAdvisorySessionLockInTransactionPool arrived {took:.1f}s after the lock")
        labels = firing["labels"]
        assert labels["severity"] == "critical"
        assert (labels["target"], labels["pooler"], labels["pool"]) == (
            "orders", "pgbouncer-main", "app/postgres",
        )  # fmt: skip
        assert labels["application_name"] == "nightly-job"
        description = firing["annotations"]["description"]
        assert "pgbouncer-main (pool app/postgres)" in description
        assert description.endswith(
            "Holders and waiters: https://exporter.example.com/locks?target=orders"
        )
        assert took >= 60  # the rule's `for`
        names = {alert["labels"].get("application_name") for alert in webhook.alerts}
        assert "session-job" not in names
        assert {a["labels"]["alertname"] for a in webhook.alerts} == {
            "PgAdvisorySessionLockInTransactionPool"
        }  # not the leak alert, 15 minutes away


WINDOW = "5s"


@pytest.mark.slow
def test_a_misplaced_unlock_and_a_full_lock_table_page_from_the_servers_log(
    pg: EmbeddedPostgres,
    start_exporter: StartExporter,
    one_target: OneTarget,
    monitor_dsn: str,
    webhook: Webhook,
    start_service: StartService,
    tmp_path: Path,
    cli: Cli,
) -> None:
    config = one_target(monitor_dsn, name="orders")
    config["targets"][0]["server_log"] = {"path": str(pg.logfile), "line_prefix": SUITE_LOG_PREFIX}
    exporter = start_exporter(config=config)
    # Windows of seconds rather than minutes: a series that appears pages where Prometheus
    # has read the log for a window already.
    rules = tmp_path / "rules.yml"
    rules.write_text(
        cli("rules", "--set", "exporter_job=pg-advisory",
            "--set", f"unlocks_not_held_window={WINDOW}",
            "--set", f"out_of_shared_memory_window={WINDOW}", check=True).stdout
    )  # fmt: skip
    prometheus = _prometheus_and_alertmanager(exporter, rules, webhook, start_service, tmp_path)
    wait_until(
        lambda: _has_series(prometheus, f"pg_advisory_log_up offset {WINDOW}"),
        30,
        f"Prometheus reading the log {WINDOW} ago",
    )

    bouncer = PgBouncer(pg, pool_size=2)
    try:
        bouncer.start()
        with psycopg.connect(bouncer.dsn(), autocommit=True, application_name="nightly-job") as job:
            job.execute("SELECT pg_advisory_lock(8101)")  # on the pool's one server connection
            with psycopg.connect(bouncer.dsn(), application_name="api") as other:
                other.execute("SELECT 1")  # which another client's transaction now has:
                unlocked = job.execute("SELECT pg_advisory_unlock(8101)").fetchone()
                assert unlocked == (False,)  # the unlock ran on a second one
        fill_lock_table(pg.dsn(), "batch-import")

        unlock = webhook.wait_for("PgAdvisoryUnlockNotHeld", "firing")
        # One page for the full table: the server log's, or where a collection happened to
        # read the table while it was full (the fill lasts a moment), the exporter's own; then
        # the log's stays quiet.
        full = webhook.wait_for(
            "PgLockTableOutOfSharedMemory", "firing", ARRIVES_WITHIN, "PgLockTableFull"
        )
    finally:
        bouncer.cleanup()  # its server connections, and the lock stranded on one, end
    assert (unlock["labels"]["severity"], full["labels"]["severity"]) == ("warning", "critical")

    def where(alert: dict[str, Any]) -> tuple[str, ...]:
        return tuple(alert["labels"][label] for label in ("target", "datname", "application_name"))

    assert where(unlock) == ("orders", "postgres", "nightly-job")
    # The exporter counted the one misplaced unlock, and no other.
    unlocks = exporter.scrape().find("pg_advisory_log_unlocks_not_held_total")
    assert [(labels["application_name"], value) for labels, value in unlocks] == [
        ("nightly-job", 1)
    ]
    # The lock table is the server's: one page for the server, not one per application.
    assert (full["labels"]["target"], "application_name" in full["labels"]) == ("orders", False)
    assert "unlocked advisory locks they did not hold" in unlock["annotations"]["description"]
    full_page = full["labels"]["alertname"]
    assert full["annotations"]["runbook_url"].endswith("#" + full_page.lower())
    # One problem, one page: a few evaluations later, still one alert of each.
    time.sleep(5)
    pages = {
        (a["labels"]["alertname"], a["labels"].get("application_name")) for a in webhook.alerts
    }
    assert pages == {("PgAdvisoryUnlockNotHeld", "nightly-job"), (full_page, None)}


def _alerts_in_prometheus(prometheus: int, alertname: str) -> list[dict[str, Any]]:
    """The alert's series in Prometheus (pending or firing), whatever Alertmanager was sent."""
    query = f'ALERTS{{alertname="{alertname}"}}'
    return [found["metric"] for found in prometheus_query(prometheus, query)]


def _migration_rules(cli: Cli, tmp_path: Path, held_after: str) -> Path:
    """The shipped rules, their migration and leak thresholds lowered to seconds."""
    rules = tmp_path / "rules.yml"
    rules.write_text(
        cli("rules", "--set", "exporter_job=pg-advisory",
            "--set", f"migration_lock_held_after={held_after}", "--set", "migration_lock_for=1s",
            "--set", "leaked_lock_after=2s", "--set", "leaked_lock_for=1s", check=True).stdout
    )  # fmt: skip
    return rules


@pytest.mark.slow
def test_a_long_rails_migration_pages_as_stuck_and_never_as_a_leak(
    start_exporter: StartExporter,
    one_target: OneTarget,
    monitor_dsn: str,
    pg: EmbeddedPostgres,
    webhook: Webhook,
    start_service: StartService,
    start_client: StartClient,
    tmp_path: Path,
    cli: Cli,
) -> None:
    """ActiveRecord 6.1 takes its migration lock on a connection of its own, which sits idle
    while the migration runs on another: past the leak threshold, only the stuck alert may
    page, once, on how long the lock has been held."""
    ruby = shutil.which("ruby")
    assert ruby, "ruby is not installed (the test command installs Debian's packages)"
    exporter = start_exporter(config=one_target(monitor_dsn, name="orders"))
    rules = _migration_rules(cli, tmp_path, "4s")
    prometheus = _prometheus_and_alertmanager(exporter, rules, webhook, start_service, tmp_path)
    database = fresh_database(pg, "inventory")
    app = tmp_path / "app"
    (app / "db" / "migrate").mkdir(parents=True)
    (app / "db" / "migrate" / "20240101000000_touch_blocker.rb").write_text(RAILS_MIGRATION)
    (app / "migrate.rb").write_text(RAILS_MIGRATE)
    with row_locked(pg, database):
        rails = start_client("rails", [ruby, "migrate.rb", database], client_environment(pg), app)
        stuck = webhook.wait_for("PgAdvisoryMigrationLockStuck", "firing")
        assert rails.running()
        # The leak's threshold and `for` passed long ago; a few evaluations more.
        time.sleep(3)
        assert _alerts_in_prometheus(prometheus, "PgAdvisoryLockLeaked") == []
    rails.finish()
    labels = stuck["labels"]
    assert (labels["key"], labels["datname"], labels["target"]) == (
        "rails_migration",
        "inventory",
        "orders",
    )
    assert "has been held for" in stuck["annotations"]["description"]
    assert {a["labels"]["alertname"] for a in webhook.alerts} == {"PgAdvisoryMigrationLockStuck"}


# postgres-migrations' migrate(), as its CLI runs it: it takes its lock with
# pg_try_advisory_lock(-8525285245963000605), retried until it gets it, and migrates on the
# same connection. The exporter's catalog does not know it.
POSTGRES_MIGRATIONS_MIGRATE = """
const { migrate } = require("postgres-migrations")
migrate({ host: process.env.PGHOST, port: Number(process.env.PGPORT), user: process.env.PGUSER,
          password: process.env.PGPASSWORD, database: process.env.PGDATABASE }, "migrations")
  .then(() => console.log("migrated"))
  .catch((error) => { console.error(error); process.exit(1) })
"""


def _runbook_example(heading: str) -> Any:
    """The YAML block of the runbook's section under `heading`, as YAML loads it."""
    section = RUNBOOK.read_text().split(f"\n{heading}\n", 1)[1]
    return yaml.safe_load(section.split("```yaml\n", 1)[1].split("```", 1)[0])


@pytest.mark.slow
def test_a_migrator_the_catalog_does_not_know_pages_from_one_registry_entry(
    start_exporter: StartExporter,
    one_target: OneTarget,
    monitor_dsn: str,
    pg: EmbeddedPostgres,
    webhook: Webhook,
    start_service: StartService,
    npm_clients: Path,
    start_client: StartClient,
    tmp_path: Path,
    cli: Cli,
) -> None:
    """postgres-migrations, stuck behind a row lock while it holds its migration lock: with
    one registry entry naming its key, the shipped rules page PgAdvisoryKeyHeldTooLong on
    how long the key has been held, and nothing else."""
    # The runbook's worked example, as an operator adds it: one entry of the registry, its
    # max_hold lowered to seconds.
    (entry,) = _runbook_example("### A migration tool the catalog does not know")["keys"]
    assert entry["key"] == -8525285245963000605  # postgres-migrations' (with-lock.js)
    config = {**one_target(monitor_dsn, name="orders"), "keys": [{**entry, "max_hold": "3s"}]}
    exporter = start_exporter(config=config)
    rules = tmp_path / "rules.yml"
    rules.write_text(
        cli("rules", "--set", "exporter_job=pg-advisory", "--set", "key_held_too_long_for=1s",
            "--set", "leaked_lock_after=2s", "--set", "leaked_lock_for=1s", check=True).stdout
    )  # fmt: skip
    prometheus = _prometheus_and_alertmanager(exporter, rules, webhook, start_service, tmp_path)
    database = fresh_database(pg, "ledger")
    (tmp_path / "migrations").mkdir()
    (tmp_path / "migrations" / "1_touch-blocker.sql").write_text(
        "UPDATE blocker SET n = n + 1 WHERE id = 1;\n"
    )
    (tmp_path / "migrate.js").write_text(POSTGRES_MIGRATIONS_MIGRATE)
    with row_locked(pg, database):
        migrate = start_client(
            "postgres-migrations", ["node", "migrate.js"], client_environment(pg, database)
        )
        stuck = webhook.wait_for("PgAdvisoryKeyHeldTooLong", "firing")
        assert migrate.running(), "it paged only once the migration had ended"
        assert _alerts_in_prometheus(prometheus, "PgAdvisoryLockLeaked") == []
    migrate.finish()
    assert (stuck["labels"]["key"], stuck["labels"]["datname"]) == ("orders_migration", database)
    assert "longer than the key's max_hold" in stuck["annotations"]["description"]
    assert {a["labels"]["alertname"] for a in webhook.alerts} == {"PgAdvisoryKeyHeldTooLong"}
    webhook.wait_for("PgAdvisoryKeyHeldTooLong", "resolved")


# Short statements until the test says stop (a row in `stop`), at most a minute of them: the
# migration runs until the page has come, however long that takes on a busy machine.
NODE_MIGRATION_OF_SHORT_STATEMENTS = """
exports.up = (pgm) => {
  for (let i = 0; i < 600; i++) pgm.sql("SELECT pg_sleep(0.1) WHERE NOT EXISTS (SELECT FROM stop)");
};
"""


@pytest.mark.slow
def test_a_migration_of_short_statements_held_past_the_threshold_pages(
    start_exporter: StartExporter,
    one_target: OneTarget,
    monitor_dsn: str,
    pg: EmbeddedPostgres,
    webhook: Webhook,
    start_service: StartService,
    npm_clients: Path,
    start_client: StartClient,
    tmp_path: Path,
    cli: Cli,
) -> None:
    """node-pg-migrate holds its lock on the migrating connection through statements of 0.1s:
    its time in any state never reaches a second, its hold time passes 3s."""
    exporter = start_exporter(config=one_target(monitor_dsn, name="orders"))
    rules = _migration_rules(cli, tmp_path, "3s")
    prometheus = _prometheus_and_alertmanager(exporter, rules, webhook, start_service, tmp_path)
    database = fresh_database(pg, "shipping")
    with pg.connect(database) as conn:
        conn.execute("CREATE TABLE stop ()")
    (tmp_path / "migrations").mkdir()
    (tmp_path / "migrations" / "1700000000000_many-statements.js").write_text(
        NODE_MIGRATION_OF_SHORT_STATEMENTS
    )
    env = {**client_environment(pg), "DATABASE_URL": database_url(pg, database)}
    migrate = start_client(
        "node-pg-migrate", [npm_clients / ".bin" / "node-pg-migrate", "up", "-m", "migrations"], env
    )
    stuck = webhook.wait_for("PgAdvisoryMigrationLockStuck", "firing")
    assert migrate.running(), "it paged only once the migration had ended"
    with pg.connect(database) as conn:
        conn.execute("INSERT INTO stop DEFAULT VALUES")
    migrate.finish()
    assert (stuck["labels"]["key"], stuck["labels"]["datname"]) == ("node_pg_migrate", database)
    assert _alerts_in_prometheus(prometheus, "PgAdvisoryLockLeaked") == []
    webhook.wait_for("PgAdvisoryMigrationLockStuck", "resolved")


# -- Applications idle by design --------------------------------------------------------------

# Que's locker, reproduced with psycopg (Que is a Ruby gem: RubyGems is out of reach here, and
# none of PyPI's, npm's or Debian's packages searched takes one lock per job on an idle
# consumer: delayed_job and Sidekiq take none, the Python and Node queues lock rows with SKIP
# LOCKED). As Que 2.4.1's
# lib/que/locker.rb does: the locker's own connection names itself
# set_config('application_name', 'Que Locker: ' || its pid), locks each job it hands out with
# pg_try_advisory_lock(job id) in its poll (a recursive CTE, as Que's), and sits idle while a
# worker runs each job on a connection of its own; it unlocks a job's id once its worker is
# done, with Que's own statement.
QUE_NAME = "SELECT set_config('application_name', 'Que Locker: ' || pg_backend_pid(), false)"
QUE_POLL = """
WITH RECURSIVE jobs AS (
  SELECT (j).id, pg_try_advisory_lock((j).id) AS locked
  FROM (SELECT j FROM que_jobs AS j ORDER BY id LIMIT 1) AS t1
  UNION ALL (
    SELECT (j).id, pg_try_advisory_lock((j).id) AS locked
    FROM (SELECT (SELECT j FROM que_jobs AS j WHERE id > jobs.id ORDER BY id LIMIT 1) AS j
          FROM jobs WHERE jobs.id IS NOT NULL LIMIT 1) AS t1
  )
)
SELECT id FROM jobs WHERE locked
"""
QUE_UNLOCK = "SELECT pg_advisory_unlock(v.i) FROM (VALUES ({})) v (i)"


@contextlib.contextmanager
def que_locker(pg: EmbeddedPostgres, database: str, jobs: int) -> Iterator[str]:
    """`jobs` jobs locked by a locker that sits idle while each job runs on a worker's
    connection: a job updates the blocker row, which the block holds locked, so it runs until
    the block ends. The locker's application_name; every job done and unlocked at the end."""
    with pg.connect(database) as setup:
        setup.execute("CREATE TABLE que_jobs (id bigint PRIMARY KEY)")
        setup.execute("INSERT INTO que_jobs SELECT generate_series(1, %s)", (jobs,))

    def work(job: int) -> None:
        with psycopg.connect(pg.dsn(database), autocommit=True) as worker:
            worker.execute("SET application_name = 'que-worker'")
            worker.execute("UPDATE blocker SET n = n + %s WHERE id = 1", (job,))

    with psycopg.connect(pg.dsn(database), autocommit=True) as locker:
        named = locker.execute(QUE_NAME).fetchone()
        assert named is not None
        locked = [row[0] for row in locker.execute(QUE_POLL).fetchall()]
        assert len(locked) == jobs, locked
        workers = [threading.Thread(target=work, args=(job,)) for job in locked]
        with row_locked(pg, database):
            for thread in workers:
                thread.start()
            yield str(named[0])
        for thread in workers:
            thread.join()
        locker.execute(QUE_UNLOCK.format("), (".join(map(str, locked))))


def _idle_by_design_rules(cli: Cli, tmp_path: Path) -> Path:
    """The shipped rules, the leak's threshold and `for` lowered to seconds (the bound's `for`
    is the leak's)."""
    rules = tmp_path / "rules.yml"
    rules.write_text(
        cli("rules", "--set", "exporter_job=pg-advisory", "--set", "leaked_lock_after=2s",
            "--set", "leaked_lock_for=1s", check=True).stdout
    )  # fmt: skip
    return rules


def _past_the_leak_threshold_then_past_its_bound(
    prometheus: int, webhook: Webhook, entry: str
) -> dict[str, Any]:
    """Once Prometheus has seen the application idle past the leak threshold (2s) at five
    evaluations, past the leak's `for` (1s), no leak alert, pending or firing; then its
    bound's page. (Its first scrape may find the holder idle for seconds already.)"""
    past = f'pg_advisory_idle_by_design_seconds{{idle_by_design="{entry}"}} > 2'
    idle = f"count_over_time(({past})[10s:1s]) >= 5"
    wait_until(lambda: _has_series(prometheus, idle), ARRIVES_WITHIN, idle)
    assert _alerts_in_prometheus(prometheus, "PgAdvisoryLockLeaked") == []
    assert not _has_series(prometheus, "pg_advisory_idle_holder_max_seconds")
    return webhook.wait_for("PgAdvisoryIdleByDesignHeldTooLong", "firing")


@pytest.mark.slow
def test_a_job_queue_idle_by_design_never_pages_as_a_leak_and_pages_past_its_bound(
    start_exporter: StartExporter,
    one_target: OneTarget,
    monitor_dsn: str,
    pg: EmbeddedPostgres,
    webhook: Webhook,
    start_service: StartService,
    tmp_path: Path,
    cli: Cli,
) -> None:
    """Que's locker holding one key per job while two workers run them, named by the catalog's
    pattern: past the leak threshold, no PgAdvisoryLockLeaked; past the entry's max_hold (the
    catalog's entry tuned to 10s by one of the same name), its bound pages."""
    (que,) = (e for e in selected_idle_by_design(True) if e.name == "que_locker")
    assert que.pattern is not None
    entry = {"name": "que_locker", "pattern": que.pattern, "max_hold": "10s"}
    config = one_target(monitor_dsn, name="orders")
    config["collection"]["idle_by_design"] = [entry]
    exporter = start_exporter(config=config)
    rules = _idle_by_design_rules(cli, tmp_path)
    prometheus = _prometheus_and_alertmanager(exporter, rules, webhook, start_service, tmp_path)
    database = fresh_database(pg, "queue")
    with que_locker(pg, database, jobs=2) as locker:
        firing = _past_the_leak_threshold_then_past_its_bound(prometheus, webhook, "que_locker")
        held = prometheus_query(prometheus, "pg_advisory_locks")
        assert {(s["metric"]["application_name"], s["value"][1]) for s in held} == {(locker, "2")}
        # /locks names the entry the locker answers to, as the series judge it.
        status, body = exporter.get("/locks?target=orders&format=json")
        assert status == 200, body
        holders = [h for h in json.loads(body)["holders"] if h["application_name"] == locker]
        assert [(h["idle_by_design"], h["leak_suspect"]) for h in holders] == [
            ("que_locker", False)
        ]
    labels = firing["labels"]
    assert (labels["application_name"], labels["datname"], labels["idle_by_design"]) == (
        locker,
        database,
        "que_locker",
    )
    assert labels["severity"] == "critical"
    assert "longer than the entry's max_hold" in firing["annotations"]["description"]
    webhook.wait_for("PgAdvisoryIdleByDesignHeldTooLong", "resolved")
    assert {a["labels"]["alertname"] for a in webhook.alerts} == {
        "PgAdvisoryIdleByDesignHeldTooLong"
    }


@pytest.mark.slow
def test_a_migrator_idle_by_design_never_pages_as_a_leak_and_pages_past_its_bound(
    start_exporter: StartExporter,
    one_target: OneTarget,
    monitor_dsn: str,
    pg: EmbeddedPostgres,
    webhook: Webhook,
    start_service: StartService,
    start_client: StartClient,
    tmp_path: Path,
    cli: Cli,
) -> None:
    """ActiveRecord 6.1 holds its migration lock on a connection of its own, idle while the
    migration waits on another: named by its application_name (PGAPPNAME), with the catalog
    off so that its key does not spare it, no leak page; past its max_hold, its bound's."""
    ruby = shutil.which("ruby")
    assert ruby, "ruby is not installed (the test command installs Debian's packages)"
    entry = {"name": "deploys", "application_name": "deploy-migrate", "max_hold": "10s"}
    config = {**one_target(monitor_dsn, name="orders"), "catalog": False}
    config["collection"]["idle_by_design"] = [entry]
    exporter = start_exporter(config=config)
    rules = _idle_by_design_rules(cli, tmp_path)
    prometheus = _prometheus_and_alertmanager(exporter, rules, webhook, start_service, tmp_path)
    database = fresh_database(pg, "inventory")
    app = tmp_path / "app"
    (app / "db" / "migrate").mkdir(parents=True)
    (app / "db" / "migrate" / "20240101000000_touch_blocker.rb").write_text(RAILS_MIGRATION)
    (app / "migrate.rb").write_text(RAILS_MIGRATE)
    env = {**client_environment(pg), "PGAPPNAME": "deploy-migrate"}
    with row_locked(pg, database):
        rails = start_client("rails", [ruby, "migrate.rb", database], env, app)
        firing = _past_the_leak_threshold_then_past_its_bound(prometheus, webhook, "deploys")
        assert rails.running(), "it paged only once the migration had ended"
    rails.finish()
    labels = firing["labels"]
    assert (labels["application_name"], labels["datname"], labels["idle_by_design"]) == (
        "deploy-migrate",
        database,
        "deploys",
    )
    webhook.wait_for("PgAdvisoryIdleByDesignHeldTooLong", "resolved")
    assert {a["labels"]["alertname"] for a in webhook.alerts} == {
        "PgAdvisoryIdleByDesignHeldTooLong"
    }
