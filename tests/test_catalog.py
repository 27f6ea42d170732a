"""The built-in catalog of well-known keys: each library's key as its own source computes it,
the `catalog` setting, precedence over it, and every entry named on a real server."""

from __future__ import annotations

import hashlib
import re
import uuid
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest
from clients import boss_key_sql
from support import (
    Cli,
    Config,
    LoggedReads,
    OneTarget,
    RunningExporter,
    Scrape,
    Session,
    StartExporter,
    write_config,
)

from devtools.embedded_postgres import EmbeddedPostgres
from pg_advisory_exporter.cli import main
from pg_advisory_exporter.collect.databases import DATABASES_SQL
from pg_advisory_exporter.config.loader import load
from pg_advisory_exporter.config.model import FileConfig
from pg_advisory_exporter.keys import catalog
from pg_advisory_exporter.keys.catalog import BY_NAME, DEFAULTS, MIGRATION_KEYS, NAMES, key_configs
from pg_advisory_exporter.keys.catalog_entry import (
    crc32,
    fnv1_32,
    golang_migrate_key,
    java_string_hash,
)
from pg_advisory_exporter.keys.key import signed
from pg_advisory_exporter.keys.key_config import KeyConfig
from pg_advisory_exporter.keys.registry import Registry
from pg_advisory_exporter.keys.well_known_keys import ENTRIES
from pg_advisory_exporter.keys.well_known_migrators import MIGRATORS

# well_known_migrators.py's entries, every one a migration tool's; the opt-in ones last.
MIGRATORS_NAMES = tuple(e.name for e in MIGRATORS)
OPT_IN_MIGRATORS = ["dbos_migration", "evolve_migration", "marten_apply_changes", "lucid_migration"]

# -- Each key, from the values the libraries' own sources and tests give -------------------


def test_the_names_are_the_contract() -> None:
    assert NAMES == (
        "rails_migration", "sqlx_migration", "golang_migrate", "golang_migrate_instance",
        "grafana_migration", "prisma_migrate", "sqitch", "goose", "goose_legacy", "flyway",
        "node_pg_migrate", "kysely_migration", "graphile_migrate", "tern", "atlas_migrate",
        "pgboss_migration", "pgboss_create_queue", "pgboss_delete_queue", "pgboss_queue_stats",
        "pg_repack", "pg_partman_maintenance", "pg_partman_partition_data",
        "pg_partman_undo_partition", "pg_partman_undo_partition_proc",
        "pg_partman_drop_partition_id", "pg_partman_drop_partition_time",
        "pg_partman_reapply_constraints", "pg_partman_run_analyze", "pgqueuer_upgrade",
        "pgqueuer_statistics", "airflow_migration", "authentik_migration",
        # Job queues, leader elections, mutexes and schedulers (well_known_queues.py).
        "rihanna_jobs", "electric_replication", "unleash_migration",
        "langchain_pgvector_extension", "langchaingo_pgvector_collection",
        "langchaingo_pgvector_embedding", "airflow_scheduler", "marten_async_daemon",
        "wolverine_leader_election", "spicedb_gc", "spicedb_revision_heartbeat",
        "n8n_auth_roles_sync", "n8n_trusted_key_refresh", "netbox_available_prefixes",
        "netbox_available_ips", "netbox_available_vlans", "netbox_available_asns",
        "netbox_job_schedules", "terraform_pg_backend_create",
        # Migration tools (well_known_migrators.py).
        "sequel_migration", "pact_broker_migration", "slonik_migrator", "pgroll_init",
        "liquibase_sessionlock", "pgmigrate", "n8n_migration", "dbos_migration",
        "evolve_migration", "marten_apply_changes", "lucid_migration",
    )  # fmt: skip
    # The migration tools' keys: PgAdvisoryMigrationLockStuck's, and never a leak.
    assert MIGRATION_KEYS == (
        "rails_migration", "sqlx_migration", "golang_migrate", "golang_migrate_instance",
        "grafana_migration", "prisma_migrate", "sqitch", "goose", "goose_legacy", "flyway",
        "node_pg_migrate", "kysely_migration", "graphile_migrate", "tern", "atlas_migrate",
        "pgboss_migration", "pgqueuer_upgrade", "airflow_migration", "authentik_migration",
        "unleash_migration", "langchain_pgvector_extension", "langchaingo_pgvector_collection",
        "langchaingo_pgvector_embedding", "sequel_migration", "pact_broker_migration",
        "slonik_migrator", "pgroll_init", "liquibase_sessionlock", "pgmigrate", "n8n_migration",
        "dbos_migration", "evolve_migration", "marten_apply_changes", "lucid_migration",
    )  # fmt: skip
    assert all(BY_NAME[name].kind == "migration" for name in MIGRATION_KEYS)
    assert [e.name for e in ENTRIES if not e.default] == [
        "airflow_migration", "authentik_migration", "airflow_scheduler", "marten_async_daemon",
        "wolverine_leader_election", "spicedb_gc", "spicedb_revision_heartbeat",
        "n8n_auth_roles_sync", "n8n_trusted_key_refresh", "netbox_available_prefixes",
        "netbox_available_ips", "netbox_available_vlans", "netbox_available_asns",
        "netbox_job_schedules", "terraform_pg_backend_create", *OPT_IN_MIGRATORS,
    ]  # fmt: skip
    # Held on purpose by a connection that idles while the work runs elsewhere: never a leak.
    assert [e.name for e in ENTRIES if e.idle_holder] == [
        "pg_repack", "rihanna_jobs", "electric_replication", "marten_async_daemon",
        "spicedb_revision_heartbeat",
    ]  # fmt: skip
    assert {e.kind for e in ENTRIES} == {"migration", "maintenance", "queue", "leader", "mutex"}
    assert tuple(e for e in ENTRIES if e.default) == DEFAULTS


# Worked values: the research's, recomputed here from each library's formula.
@pytest.mark.parametrize(
    ("name", "database", "key"),
    [
        # 2053462845 * Zlib.crc32("orders"): the example.
        ("rails_migration", "orders", 7895826788198718390),
        ("rails_migration", "postgres", 737815420147457505),
        ("sqlx_migration", "orders", 3947913392176795364),
        ("sqlx_migration", "postgres", 368907709894077238),
        ("golang_migrate", "orders", 660104171),  # the URL path "/orders"
        ("golang_migrate", "postgres", 3280485947),
        ("golang_migrate_instance", "orders", 2900846959),  # CURRENT_DATABASE() "orders"
        ("golang_migrate_instance", "postgres", 143310882),
        ("grafana_migration", "orders", 3139563098),
        ("grafana_migration", "grafana", 4004004031),
    ],
)
def test_per_database_keys(name: str, database: str, key: int) -> None:
    assert _key(name, database) == key


def test_golang_migrate_follows_its_own_test_vectors() -> None:
    # database/util_test.go, TestGenerateAdvisoryLockId (golang-migrate 18966c75).
    assert golang_migrate_key("database_name") == 1764327054
    assert golang_migrate_key("database_name", "schema_name_1") == 2453313553
    assert golang_migrate_key("database_name", "schema_name_2") == 235207038
    assert golang_migrate_key("database_name", "schema_name_1", "schema_name_2") == 3743845847


def _go_crc64_ecma(data: bytes) -> int:
    """Go's crc64.Checksum(data, crc64.MakeTable(crc64.ECMA)): reflected, inverted."""
    crc = 0xFFFFFFFFFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0xC96C5795D7870F42 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFFFFFFFFFF


def test_fixed_keys_follow_from_their_recipes() -> None:
    assert BY_NAME["goose"].key == crc32("goose") == 4097083626
    assert BY_NAME["goose_legacy"].key == _go_crc64_ecma(b"goose") == 5887940537704921958
    # Java's "hello".hashCode() is 99162322; Flyway's base is "Flyway" in ASCII.
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("") == 0
    assert int.from_bytes(b"Flyway", "big") == 77431708279161
    assert BY_NAME["flyway"].key == 77431708279161 + java_string_hash(
        '"public"."flyway_schema_history"'
    )
    assert BY_NAME["flyway"].key == 77433833903597
    assert fnv1_32("a") == 0x050C5D7E  # FNV-1's published value for "a"
    assert BY_NAME["atlas_migrate"].key == 2686470616
    fixed = {
        "prisma_migrate": 72707369,
        "sqitch": 75474063,
        "node_pg_migrate": 7241865325823964,
        "kysely_migration": 3853314791062309107,
        "graphile_migrate": 4727445306447283,
        "tern": 9628173550095224,
        "airflow_migration": 1,
        "authentik_migration": 1000,
        # The constants of each library's source (well_known_queues.py cites the lines).
        "unleash_migration": 479341,  # db-lock.ts, defaultLockKey
        "langchain_pgvector_extension": 1573678846307946496,  # langchain-postgres 0.0.19
        "langchaingo_pgvector_collection": 1573678846307946495,  # pgLockIDCollectionTable
        "langchaingo_pgvector_embedding": 1573678846307946494,  # pgLockIDEmbeddingTable
        "airflow_scheduler": 2,  # DBLocks.SCHEDULER_CRITICAL_SECTION, enum.auto()
        "marten_async_daemon": 4444,  # DaemonLockId
        "wolverine_leader_election": 9999999,  # PostgresqlNodePersistence.LeaderLockId
        "spicedb_gc": 1,  # locks.go, gcRunLock
        "spicedb_revision_heartbeat": 2,  # locks.go, revisionHeartbeatLock
        "n8n_auth_roles_sync": 1001,  # DbLock.AUTH_ROLES_SYNC
        "n8n_trusted_key_refresh": 1002,  # DbLock.TRUSTED_KEY_REFRESH
        "netbox_available_prefixes": 100100,  # ADVISORY_LOCK_KEYS['available-prefixes']
        "netbox_available_ips": 100200,
        "netbox_available_vlans": 100300,
        "netbox_available_asns": 100400,
        "netbox_job_schedules": 110100,
        "terraform_pg_backend_create": -1,  # pg_try_advisory_lock(-1), the creation lock
    }
    assert {name: BY_NAME[name].key for name in fixed} == fixed
    # Rihanna's classid (config.ex's default) paired with each job's id; Electric's lock is
    # the server's hashtext() of its slot's default name.
    assert BY_NAME["rihanna_jobs"].form == KeyConfig(name="_", namespace=1_759_441_536)
    assert BY_NAME["electric_replication"].form == KeyConfig(
        name="_", text="electric_slot_default", hash="hashtext"
    )


def test_the_migrators_keys_follow_their_sources() -> None:
    """Each key of well_known_migrators.py as the tool's own code computes it (the files are
    cited there; the lines here)."""
    assert java_string_hash("public") == -977423767  # Java's "public".hashCode()
    keys = {
        # sequel extensions/migration.rb: MIGRATION_ADVISORY_LOCK_ID = 4966325471869609408
        "sequel_migration": 4966325471869609408,
        # sequel-pg_advisory_lock: advisory_lock_key_for(name) = Zlib.crc32(name.to_s) % 2 ** 31
        "pact_broker_migration": zlib.crc32(b"migrate") % 2**31,
        # @slonik/migrator dist/index.js advisoryLockId: parseInt(md5(hashable).slice(0, 8), 16)
        "slonik_migrator": int(
            hashlib.md5(b'@slonik/migrator advisory lock:"migration"').hexdigest()[:8], 16
        ),
        # pgroll pkg/state/state.go Init: const key int64 = 0x2c03057fb9525b
        "pgroll_init": 0x2C03057FB9525B,
        # pgmigrate sessionlock.go ID: crc32.ChecksumIEEE([]byte(IDPrefix + name)), IDPrefix
        # "sessionlock-"; migrator.go: name fmt.Sprintf("%s-%s", "pgmigrate-", m.TableName)
        "pgmigrate": zlib.crc32(b"sessionlock-pgmigrate--public.pgmigrate_migrations"),
        # dbos/_sys_db_postgres.py: MIGRATION_LOCK_ID = 1234567890
        "dbos_migration": 1234567890,
        # Evolve PostgreSQLDatabase.cs: private const int LOCK_ID = 12345
        "evolve_migration": 12345,
        # Marten StoreOptions.cs: private int _applyChangesLockId = 4004
        "marten_apply_changes": 4004,
        # Lucid build/src/migration/runner.js acquireLock: dialect.getAdvisoryLock(1)
        "lucid_migration": 1,
    }
    assert {name: BY_NAME[name].key for name in keys} == keys
    assert keys["pact_broker_migration"] == 223143857
    assert keys["slonik_migrator"] == 1230759186
    assert keys["pgroll_init"] == 12388221127840347
    assert keys["pgmigrate"] == 3175788019
    # liquibase-sessionlock PGLockService.getChangeLogLockId: {lockTableName.hashCode(),
    # defaultSchemaName.hashCode()}, the table's name lower-cased by Liquibase's PostgresDatabase.
    [liquibase] = key_configs([BY_NAME["liquibase_sessionlock"]], ["orders"])
    assert liquibase.pair == (java_string_hash("databasechangeloglock"), -977423767)
    assert liquibase.pair == (-1497367772, -977423767)
    # n8n db-connection.js migrateWithAdvisoryLock: withLock(1005, ..., {subKey}), subKey =
    # createHash('sha256').update(`${schema ?? 'public'}:${entityPrefix ?? ''}`).digest()
    # .readInt32BE(0)
    [n8n] = key_configs([BY_NAME["n8n_migration"]], ["orders"])
    sub_key = int.from_bytes(hashlib.sha256(b"public:").digest()[:4], "big", signed=True)
    assert n8n.pair == (1005, sub_key) == (1005, 349025233)
    assert {BY_NAME[name].kind for name in MIGRATORS_NAMES} == {"migration"}


DATABASES = ["orders", "postgres", "Caf\u00e9 \u2603", "x" * 63, "plumless", "buckeroo"]


def test_every_key_is_a_valid_registry_entry() -> None:
    for config in key_configs(ENTRIES, DATABASES):
        assert KeyConfig.model_validate(config.model_dump()) == config


def test_describe_gives_the_readme_table_its_columns() -> None:
    rows = [entry.describe() for entry in ENTRIES]
    assert all(
        set(row)
        == {"name", "library", "versions", "key", "per_database", "level", "kind", "default"}
        and all(row.values())
        for row in rows
    )
    assert rows[0]["per_database"] == "yes"
    assert BY_NAME["flyway"].describe()["level"].startswith("transaction")
    assert BY_NAME["airflow_migration"].describe()["default"] == "opt-in"


# -- The setting ----------------------------------------------------------------------------


def _check_config(tmp_path: Path, data: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> str:
    path = write_config(tmp_path, data)
    assert main(["--config.file", str(path), "--config.check"]) == 2
    return capsys.readouterr().err.replace(str(path), "FILE")


def test_unknown_entries_are_located_and_the_names_listed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = {"name": "a", "dsn": "host=db"}
    message = _check_config(tmp_path, {"catalog": ["rails"], "targets": [target]}, capsys)
    assert (
        f"FILE: catalog: unknown catalog entry 'rails'; the entries are {', '.join(NAMES)}"
    ) in message
    message = _check_config(
        tmp_path, {"targets": [{**target, "catalog": ["sqitch", "sqitch"]}]}, capsys
    )
    assert "FILE: targets[0] (a).catalog: catalog entry 'sqitch' is listed twice" in message
    message = _check_config(tmp_path, {"catalog": "yes", "targets": [target]}, capsys)
    assert "FILE: catalog: expected true, false or a list of catalog entry names" in message


def test_a_target_overrides_the_files_choice(tmp_path: Path) -> None:
    path = write_config(
        tmp_path,
        {
            "catalog": ["sqitch", "airflow_migration"],
            "targets": [
                {"name": "a", "dsn": "host=db"},
                {"name": "b", "dsn": "host=db", "catalog": False},
                {"name": "c", "dsn": "host=db", "catalog": True},
            ],
        },
    )
    targets = load({"config_file": str(path)}).targets
    chosen = [[e.name for e in catalog.selected(t.catalog)] for t in targets]
    assert chosen == [["sqitch", "airflow_migration"], [], [e.name for e in DEFAULTS]]
    # Without a file (--dsn), and in a file that does not say: the default entries.
    default = FileConfig.model_validate({"targets": [{"name": "a", "dsn": "host=db"}]})
    assert catalog.selected(default.catalog) == DEFAULTS
    assert catalog.selected(None) == DEFAULTS


# -- Precedence -----------------------------------------------------------------------------


RAILS_ORDERS = 7895826788198718390


def _server_hash(texts: Sequence[str], seeds: Sequence[int | None]) -> list[int]:
    """Stands in for the server's hashtext(): distinct values for distinct texts."""
    return [signed(crc32(text), 32) for text in texts]


def _resolve(
    keys: list[KeyConfig], databases: list[str], entries: Sequence[KeyConfig] | None = None
) -> tuple[Registry, list[str]]:
    notes: list[str] = []
    catalog_keys = key_configs(DEFAULTS, databases) if entries is None else entries
    registry = Registry.resolve(keys, _server_hash, catalog_keys, notes.append, databases)
    return registry, notes


def _where(registry: Registry, name: str) -> list[tuple[str, ...]]:
    return [k.config.databases for k in registry.keys if k.name == name]


def test_the_users_entry_wins_and_says_so() -> None:
    user = [
        KeyConfig(name="deploy_lock", key=RAILS_ORDERS),
        KeyConfig(name="jobs", namespace=75474063),  # an (int, int) space: not sqitch's key
    ]
    registry, notes = _resolve(user, ["orders", "shop"])
    assert [k.name for k in registry.keys[:2]] == ["deploy_lock", "jobs"]
    assert not any(k.catalog for k in registry.keys[:2])
    assert all(k.catalog for k in registry.keys[2:])
    assert _where(registry, "rails_migration") == [("shop",)]
    assert _where(registry, "sqitch") == [()]
    assert notes == [
        "key 'deploy_lock' (key 7895826788198718390) of the registry names the lock of the "
        "catalog's 'rails_migration' in database 'orders': it keeps its name"
    ]
    # The user's own clashes are still errors, catalog or not.
    with pytest.raises(ValueError, match="name the same lock"):
        _resolve([*user, KeyConfig(name="again", key=RAILS_ORDERS)], ["orders"])


def test_catalog_entries_that_collide_keep_the_first() -> None:
    # "plumless" and "buckeroo" have the same CRC-32, and so have both after the same prefix:
    # each library locks one key for the two databases, and one entry covers both.
    registry, notes = _resolve([], ["buckeroo", "plumless"])
    per_database = [e.name for e in DEFAULTS if e.per_database is not None]
    assert len(per_database) == 5
    for name in per_database:
        assert _where(registry, name) == [("buckeroo", "plumless")], name
    assert notes == []
    # Two entries, one lock: the first in catalog order keeps it, and the log says so.
    first = KeyConfig(name="first", key=42, databases=("a",))
    second = KeyConfig(name="second", key=42, databases=("b",))
    third = KeyConfig(name="third", key=43)
    registry, notes = _resolve([], [], [first, second, third])
    kept = registry.keys
    assert [(k.name, k.config.databases) for k in kept] == [("first", ("a",)), ("third", ())]
    assert notes == [
        "the catalog's 'first' in database 'a' and 'second' in database 'b' name the same "
        "lock (key 42): it is named 'first'"
    ]


# -- On a real server -----------------------------------------------------------------------


def _database(pg: EmbeddedPostgres, name: str) -> str:
    with pg.connect() as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')
    return name


def _key(name: str, database: str) -> int:
    """The key of catalog entry `name` in `database`, as the exporter registers it there."""
    [config] = key_configs([BY_NAME[name]], [database])
    assert config.key is not None
    return config.key


# How each library takes its lock (catalog.py cites the code): the function, and whether it
# runs in an open transaction, in database `orders`.
def _takers(db: str) -> list[tuple[str, str, bool]]:
    """(entry, statement, autocommit)."""
    return [
        ("rails_migration", f"SELECT pg_try_advisory_lock({_key('rails_migration', db)})", True),
        ("sqlx_migration", f"SELECT pg_advisory_lock({_key('sqlx_migration', db)})", True),
        ("golang_migrate", f"SELECT pg_advisory_lock({_key('golang_migrate', db)})", True),
        (
            "golang_migrate_instance",
            f"SELECT pg_advisory_lock({_key('golang_migrate_instance', db)})",
            True,
        ),
        # Inside the migrator's transaction, a session-level lock all the same.
        (
            "grafana_migration",
            f"SELECT pg_try_advisory_lock({_key('grafana_migration', db)})",
            False,
        ),
        ("prisma_migrate", "SELECT pg_advisory_lock(72707369)", True),
        ("sqitch", "SELECT pg_try_advisory_lock(75474063)", True),
        ("goose", "SELECT pg_try_advisory_lock(4097083626)", True),
        ("goose_legacy", "SELECT pg_try_advisory_lock(5887940537704921958)", True),
        # Transaction-level, the default since Flyway 9.1.2: held while the transaction is.
        ("flyway", "SELECT pg_try_advisory_xact_lock(77433833903597)", False),
        (
            "node_pg_migrate",
            'SELECT pg_try_advisory_lock(7241865325823964) AS "lockObtained"',
            True,
        ),
        (
            "kysely_migration",
            "with set_timeout as (select set_config('lock_timeout', '3600000', true) as "
            "config_val) select pg_advisory_lock(3853314791062309107) from set_timeout",
            True,
        ),
        ("graphile_migrate", "select pg_try_advisory_lock(4727445306447283) as locked", True),
        ("tern", "select pg_advisory_lock(9628173550095224)", True),
        ("atlas_migrate", "SELECT pg_try_advisory_lock(2686470616)", True),
        *(
            (name, f"SELECT pg_advisory_xact_lock({boss_key_sql('pgboss', key)})", False)
            for name, key in (
                ("pgboss_migration", ""),
                ("pgboss_create_queue", "create-queue"),
                ("pgboss_delete_queue", "delete-queue"),
                ("pgboss_queue_stats", "queue-stats"),
            )
        ),
        (
            "pg_repack",
            "SELECT pg_try_advisory_lock($1, CAST(-2147483648 + $2::bigint AS integer))".replace(
                "$1", "16185446"
            ).replace("$2", "'pg_class'::regclass::oid"),
            True,
        ),
        ("pg_partman_maintenance", _partman("run_maintenance", "_xact"), False),
        ("pg_partman_partition_data", _partman("partition_data_proc", "_xact", True), False),
        ("pg_partman_undo_partition", _partman("undo_partition_native", "_xact"), False),
        ("pg_partman_undo_partition_proc", _partman("undo_partition_proc", "_xact", True), False),
        ("pg_partman_drop_partition_id", _partman("drop_partition_id", "_xact"), False),
        ("pg_partman_drop_partition_time", _partman("drop_partition_time", "_xact"), False),
        ("pg_partman_reapply_constraints", _partman("reapply_constraints"), True),
        ("pg_partman_run_analyze", _partman("run_analyze"), True),
        ("pgqueuer_upgrade", "SELECT pg_advisory_lock(2389487409)", True),
        (
            "pgqueuer_statistics",
            "SELECT pg_try_advisory_xact_lock(hashtext('pgqueuer_statistics'))",
            False,
        ),
        ("airflow_migration", "SELECT pg_advisory_lock(1)", True),
        ("authentik_migration", "SELECT pg_advisory_lock(1000)", True),
        # A job of id 42, as Rihanna's lock/3 takes it ($1::integer, (j).id).
        ("rihanna_jobs", "SELECT pg_try_advisory_lock(1759441536::integer, 42)", True),
        (
            "electric_replication",
            "SELECT pg_advisory_lock(hashtext('electric_slot_default'))",
            True,
        ),
        ("unleash_migration", "SELECT pg_advisory_lock(479341)", True),
        (
            "langchain_pgvector_extension",
            "SELECT pg_advisory_xact_lock(1573678846307946496)",
            False,
        ),
        (
            "langchaingo_pgvector_collection",
            "SELECT pg_advisory_xact_lock(1573678846307946495)",
            False,
        ),
        (
            "langchaingo_pgvector_embedding",
            "SELECT pg_advisory_xact_lock(1573678846307946494)",
            False,
        ),
        # Opt-in: named by the exporter that chooses them.
        ("marten_async_daemon", "SELECT pg_try_advisory_lock(4444)", True),
        ("wolverine_leader_election", "SELECT pg_try_advisory_lock(9999999)", True),
        ("spicedb_revision_heartbeat", "SELECT pg_try_advisory_lock(2)", True),
        ("n8n_auth_roles_sync", "SELECT pg_advisory_xact_lock(1001)", False),
        ("n8n_trusted_key_refresh", "SELECT pg_try_advisory_xact_lock(1002)", False),
        *(
            (name, f"SELECT pg_advisory_lock({BY_NAME[name].key})", True)
            for name in NAMES
            if name.startswith("netbox_")
        ),
        ("terraform_pg_backend_create", "SELECT pg_try_advisory_lock(-1)", True),
        ("sequel_migration", "SELECT pg_try_advisory_lock(4966325471869609408) LIMIT 1", True),
        ("pact_broker_migration", "SELECT pg_advisory_lock(223143857) LIMIT 1", True),
        ("slonik_migrator", "select pg_advisory_lock(1230759186)", True),
        ("pgroll_init", "SELECT pg_advisory_xact_lock(12388221127840347)", False),
        ("liquibase_sessionlock", "SELECT pg_try_advisory_lock(-1497367772, -977423767)", True),
        ("pgmigrate", "SELECT pg_try_advisory_lock(3175788019)", True),
        ("n8n_migration", "SELECT pg_advisory_xact_lock(1005, 349025233)", False),
        ("dbos_migration", "SELECT pg_try_advisory_lock(1234567890)", True),
        ("evolve_migration", "SELECT pg_try_advisory_lock(12345)", True),
        ("marten_apply_changes", "SELECT pg_try_advisory_lock(4004)", True),
        # lucid_migration: PG_TRY_ADVISORY_LOCK('1'), Airflow's key, which its taker holds.
    ]


def _partman(function: str, level: str = "", per_table: bool = False) -> str:
    """pg_partman's statement for its lock (pg_partman--4.7.2.sql)."""
    table = ", hashtext('public.events')" if per_table else ""
    return f"SELECT pg_try_advisory{level}_lock(hashtext('pg_partman {function}'){table})"


def _idle_holders(scrape: Scrape, target: str, database: str) -> set[str]:
    """The applications whose idle holders of advisory locks count toward a leak."""
    return {
        labels["application_name"]
        for labels, _ in scrape.find(
            "pg_advisory_idle_holder_max_seconds", target=target, datname=database
        )
    }


def _catalog_keys(scrape: Scrape, target: str) -> dict[tuple[str, str], float]:
    return {
        (labels["key"], labels["datname"]): value
        for labels, value in scrape.find("pg_advisory_key_holders", target=target)
        if labels["key"] in NAMES
    }


def test_every_entry_is_named_when_its_library_holds_it(
    pg: EmbeddedPostgres,
    monitor_dsn: str,
    session: Session,
    start_exporter: StartExporter,
    cli: Cli,
    tmp_path: Path,
) -> None:
    db = _database(pg, "orders")
    for name, statement, autocommit in _takers(db):
        conn = session(name.replace("_", "-"), dbname=db, autocommit=autocommit)
        assert conn.execute(statement).fetchone() in {(True,), ("",), (None,)}, name
    # Rails' key for orders, taken in another database, is no Rails lock there.
    session("impostor").execute(f"SELECT pg_advisory_lock({_key('rails_migration', db)})")
    # SpiceDB's gc lock is Airflow's migration key, 1, and Airflow's scheduler lock SpiceDB's
    # heartbeat key, 2: named as such by an exporter that chooses them.
    shared = ["spicedb_gc", "airflow_scheduler"]
    opt_in = [
        e.name for e in ENTRIES if not e.default and e.name not in [*shared, "lucid_migration"]
    ]
    chosen = ["rails_migration", *opt_in]
    # Five exporters, one choice each: targets of one exporter that name one server are
    # read once, with the first one's settings.
    choices: dict[str, Config] = {
        "main": {},
        "chosen": {"catalog": chosen},
        "none": {"catalog": False},
        "shared": {"catalog": shared},
        "lucid": {"catalog": ["lucid_migration"]},
    }
    exporters = {
        name: start_exporter(
            config={
                "collection": {"min_interval": "1ms"},
                "targets": [{"name": name, "dsn": monitor_dsn, **choice}],
            }
        )
        for name, choice in choices.items()
    }
    defaults = {(e.name, db): 1.0 for e in DEFAULTS}
    scrape = exporters["main"].scrape_until(lambda s: _catalog_keys(s, "main") == defaults)
    assert scrape.find("pg_advisory_key_holders", datname="postgres") == []
    assert scrape.value("pg_advisory_key_waiters", target="main", key="flyway", datname=db) == 0
    # A holder that idles on purpose (a queue's dispatcher, a leader) is no leak, a
    # migration's neither, where the catalog's choice names its key; any other idle holder
    # is judged as any lock's (the opt-in entries' too, unnamed here).
    assert _idle_holders(scrape, "main", db) == {
        name.replace("_", "-")
        for name, _, _ in _takers(db)
        if not (e := BY_NAME[name]).default or not (e.idle_holder or e.migration)
    }
    mine = {(name, db): 1.0 for name in chosen}
    scrape = exporters["chosen"].scrape_until(lambda s: _catalog_keys(s, "chosen") == mine)
    # Chosen, Marten's leader is no leak; NetBox's mutex, held idle, is judged.
    assert {"marten-async-daemon", "netbox-job-schedules"} & _idle_holders(
        scrape, "chosen", db
    ) == {"netbox-job-schedules"}
    named = {(name, db): 1.0 for name in shared}
    exporters["shared"].scrape_until(lambda s: _catalog_keys(s, "shared") == named)
    # Lucid's key is Airflow's and SpiceDB's gc's: chosen alone, Lucid's names the lock.
    lucid = {("lucid_migration", db): 1.0}
    exporters["lucid"].scrape_until(lambda s: _catalog_keys(s, "lucid") == lucid)
    none = exporters["none"].scrape_until(lambda s: bool(s.find("pg_advisory_up", target="none")))
    assert _catalog_keys(none, "none") == {}

    path = write_config(tmp_path, {"targets": [{"name": "main", "dsn": monitor_dsn}]}, "check.yaml")
    report = cli("check", "--config.file", str(path), check=True).stdout
    assert f"Well-known keys in use ({len(DEFAULTS)})" in report
    rows = {
        line.split()[0]: line.split()[1:4] for line in report.splitlines() if " orders " in line
    }
    for entry in DEFAULTS:
        assert rows.get(entry.name) == [db, "1", "0"], entry.name
    # The holders' own rows name the key too.
    assert re.search(r"'rails-migration'.*\brails_migration\b", report)


def test_a_new_database_is_named_at_the_first_collection_on_the_same_connection(
    pg: EmbeddedPostgres, exporter: RunningExporter
) -> None:
    assert exporter.scrape().value("pg_advisory_up", target="main") == 1
    lists, collections = LoggedReads(pg, DATABASES_SQL), LoggedReads(pg)
    name = f"shop_{uuid.uuid4().hex[:8]}"
    _database(pg, name)
    scrapes = 0
    try:
        with psycopg.connect(pg.dsn(name), autocommit=True) as conn:
            conn.execute(f"SELECT pg_try_advisory_lock({_key('rails_migration', name)})")
            labels = {"target": "main", "key": "rails_migration", "datname": name}
            for _ in range(50):
                scrapes += 1
                if exporter.scrape().find("pg_advisory_key_holders", **labels):
                    break
            else:
                pytest.fail(f"rails_migration never named in {name}:\n{exporter.log()}")
    finally:
        with pg.connect() as conn:
            conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    # The first collection since: the list of databases is read before pg_locks, once per
    # collection, on the connection the exporter had.
    assert scrapes == 1
    assert lists.count() == collections.count() == scrapes
    assert exporter.log().count("msg=connected") == 1


def test_the_users_name_wins_and_the_log_says_so_once(
    pg: EmbeddedPostgres,
    start_exporter: StartExporter,
    one_target: OneTarget,
    monitor_dsn: str,
    session: Session,
) -> None:
    db = _database(pg, "orders")
    keys = [{"name": "deploy_lock", "key": _key("rails_migration", db)}]
    exporter = start_exporter(config={**one_target(monitor_dsn), "keys": keys})
    session("rails", dbname=db).execute(
        f"SELECT pg_try_advisory_lock({_key('rails_migration', db)})"
    )
    labels = {"target": "main", "datname": db}
    scrape = exporter.scrape_until(
        lambda s: bool(s.find("pg_advisory_key_holders", key="deploy_lock", **labels))
    )
    assert scrape.find("pg_advisory_key_holders", key="rails_migration", **labels) == []
    # A new connection resolves the registry again: the log does not repeat itself.
    with pg.connect() as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE usename = 'monitor' AND application_name = 'pg-advisory-exporter'"
        )
    exporter.scrape_until(lambda s: exporter.log().count("msg=connected") == 2)
    for _ in range(3):
        assert exporter.scrape().value("pg_advisory_key_holders", key="deploy_lock", **labels) == 1
    assert exporter.log().count("of the catalog's 'rails_migration' in database 'orders'") == 1


def _readme_row(entry: dict[str, str]) -> str:
    name = f"`{entry['name']}`" + ("" if entry["default"] == "on" else " (opt-in)")
    cells = [name, entry["library"], entry["versions"], entry["key"], entry["per_database"]]
    return "| " + " | ".join([*cells, entry["level"], entry["kind"]]) + " |"


def test_the_docs_table_is_the_catalog() -> None:
    """The Well-known keys table of docs/configuration.md says what catalog.py holds, row for
    row."""
    doc = (Path(__file__).parent.parent / "docs" / "configuration.md").read_text()
    section = doc[doc.index("## Well-known keys") :]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    expected = [_readme_row(entry.describe()) for entry in ENTRIES]
    assert rows[: len(expected)] == expected, "\n".join(expected)


def test_the_readme_names_every_project_of_the_catalog() -> None:
    """The README's question "Which tool holds a key?" lists the catalog's projects, each
    once, in the catalog's order: no more, no fewer."""
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    [row] = [line for line in readme.splitlines() if line.startswith("| Which tool holds a key?")]
    listed = row.split("):", 1)[1].split(" | ", 1)[0].strip().split(", ")
    assert listed == list(dict.fromkeys(entry.project for entry in ENTRIES))
    assert len(listed) >= 38  # twice the 19 projects named before issue 40
