"""The well-known keys: the locks that common libraries and tools take, migration tools' first.

Each entry names the key one library computes, so that `pg_advisory_key_holders` says
`key="rails_migration"` where it would otherwise show a bare number. Every key below was
read in the library's own source (the repository or package, file, function and version are
in the comment above each entry) and is pinned by tests/test_catalog.py; none of that code is
copied here. A key that depends on the database name is computed for each database the
target's server has, and counts only in that database.
"""

from __future__ import annotations

from typing import Literal

from .catalog_entry import (
    CatalogEntry,
    crc32,
    fnv1_32,
    golang_migrate_key,
    java_string_hash,
)
from .key_config import KeyConfig, Level
from .well_known_migrators import MIGRATORS
from .well_known_queues import QUEUES

# Flyway: "Flyway" in ASCII, one byte per position from bit 40 down.
_FLYWAY_BASE = (0x46 << 40) + (0x6C << 32) + (0x79 << 24) + (0x77 << 16) + (0x61 << 8) + 0x79


def _hashtext(text: str, form: Literal["bigint", "namespace"] = "bigint") -> KeyConfig:
    """A key that the library computes with PostgreSQL's hashtext() (the server computes it)."""
    return KeyConfig.model_construct(name="_", text=text, hash="hashtext", form=form)


def _partman(
    name: str, function: str, level: Level, *, text: str | None = None, per_table: bool = False
) -> CatalogEntry:
    """A pg_partman lock: hashtext('pg_partman <function>'), with the parent table's hashtext
    as a pair's second int where it locks per table."""
    text = f"pg_partman {text or function}"
    key_text = f"hashtext('{text}')"
    return CatalogEntry(
        name=f"pg_partman_{name}",
        library=f"pg_partman ({function})",
        versions="4.7",
        key_text=f"({key_text}, hashtext(parent table))" if per_table else key_text,
        level=f"{level} (pg_try_advisory{'_xact' if level == 'transaction' else ''}_lock)",
        kind="maintenance",
        lock_level=level,
        form=_hashtext(text, "namespace" if per_table else "bigint"),
    )


ENTRIES: tuple[CatalogEntry, ...] = (
    # Rails / ActiveRecord, >= 5.0 (read at tags v5.0.0, v6.1.7 and rails/rails 2a2db1e8d6d,
    # v8.1 development): activerecord/lib/active_record/migration.rb, Migrator
    # #generate_migrator_advisory_lock_id: MIGRATOR_SALT (2053462845) * Zlib.crc32 of
    # current_database; #with_advisory_lock takes it with get_advisory_lock, which
    # connection_adapters/postgresql_adapter.rb runs as SELECT pg_try_advisory_lock(id).
    # From 6.1 to 7.x the lock has a connection of its own (with_advisory_lock_connection),
    # idle while the migrations run on another. Off with `advisory_locks: false`.
    CatalogEntry(
        name="rails_migration",
        library="Rails (ActiveRecord) migrations",
        versions=">= 5.0",
        key_text="2053462845 * crc32(database)",
        level="session (pg_try_advisory_lock)",
        kind="migration",
        lock_level="session",
        per_database=lambda database: 2053462845 * crc32(database),
    ),
    # SQLx, >= 0.4 (read at launchbadge/sqlx 9d6bf662, v0.8.6+; added in 61e4a4f5, first
    # released in v0.4.0): sqlx-postgres/src/migrate.rs, generate_lock_id: 0x3d32ad9e *
    # CRC_32_ISO_HDLC of current_database() as i64; Migrate::lock for PgConnection runs
    # SELECT pg_advisory_lock($1), which waits.
    CatalogEntry(
        name="sqlx_migration",
        library="SQLx migrations (Rust)",
        project_name="SQLx",
        versions=">= 0.4",
        key_text="1026731422 * crc32(database)",
        level="session (pg_advisory_lock)",
        kind="migration",
        lock_level="session",
        per_database=lambda database: 0x3D32AD9E * crc32(database),
    ),
    # golang-migrate, >= 4.15.0 (read at golang-migrate/migrate 18966c75, v4.19.1+; the
    # schema and table joined the key in d0af5824, first in v4.15.0):
    # database/util.go, GenerateAdvisoryLockId (salt 1486364155, names joined with NUL,
    # additional names first); database/postgres/postgres.go, Postgres.Lock passes
    # (DatabaseName, migrationsSchemaName, migrationsTableName) and runs
    # SELECT pg_advisory_lock($1). Opened from a URL (the CLI, migrate.New), DatabaseName
    # is the URL's path with its slash ("/orders"); schema and table are the defaults here
    # (CURRENT_SCHEMA() = public, schema_migrations). Versions 4.7-4.14 keyed schema and
    # path only, <= 4.0 the name alone (see grafana_migration).
    CatalogEntry(
        name="golang_migrate",
        library="golang-migrate (CLI, or opened from a URL)",
        versions=">= 4.15",
        key_text='crc32("public\\0schema_migrations\\0/" + database) * 1486364155 mod 2^32',
        level="session (pg_advisory_lock)",
        kind="migration",
        lock_level="session",
        per_database=lambda database: golang_migrate_key(
            "/" + database, "public", "schema_migrations"
        ),
    ),
    # golang-migrate opened with WithInstance or WithConnection: the same as above, with
    # DatabaseName from SELECT CURRENT_DATABASE() (postgres.go, WithConnection), no slash.
    CatalogEntry(
        name="golang_migrate_instance",
        library="golang-migrate (WithInstance, as a library)",
        versions=">= 4.15",
        key_text='crc32("public\\0schema_migrations\\0" + database) * 1486364155 mod 2^32',
        level="session (pg_advisory_lock)",
        kind="migration",
        lock_level="session",
        per_database=lambda database: golang_migrate_key(database, "public", "schema_migrations"),
    ),
    # Grafana's own migrator (read at grafana/grafana 016e76c8, advisory_lock_id.go at
    # ee69e699): pkg/services/sqlstore/migrator/migrator.go, Migrator.RunMigrations keys
    # the lock with GenerateAdvisoryLockID(dbName) (advisory_lock_id.go, golang-migrate's
    # function: no additional names) of the DSN's database (postgres_dialect.go,
    # GetDBName), and PostgresDialect.Lock runs SELECT pg_try_advisory_lock(?), inside a
    # transaction, session-level all the same. With [database] migration_locking, the
    # default. golang-migrate <= 4.0 computed the same key.
    CatalogEntry(
        name="grafana_migration",
        library="Grafana's database migrations (also golang-migrate <= 4.0)",
        project_name="Grafana",
        versions="Grafana with migration_locking (the default)",
        key_text="crc32(database) * 1486364155 mod 2^32",
        level="session (pg_try_advisory_lock)",
        kind="migration",
        lock_level="session",
        per_database=golang_migrate_key,
    ),
    # Prisma Migrate (read at prisma/prisma-engines 04251199): schema-engine/connectors/
    # sql-schema-connector/src/flavour/postgres.rs, PostgresFlavour::acquire_lock runs
    # SELECT pg_advisory_lock(72707369) under a 10 s timeout (ADVISORY_LOCK_TIMEOUT).
    # Older engines were not checked.
    CatalogEntry(
        name="prisma_migrate",
        library="Prisma Migrate (migrate dev, migrate deploy)",
        versions="current engines (older not checked)",
        key_text="72707369",
        level="session (pg_advisory_lock, 10 s timeout)",
        kind="migration",
        lock_level="session",
        key=72707369,
    ),
    # Sqitch, >= 1.2.0 (read at sqitchers/sqitch 0ab857e3, v1.6.1+): lib/App/Sqitch/
    # Engine/pg.pm, try_lock runs SELECT pg_try_advisory_lock(75474063), and wait_lock
    # SELECT pg_advisory_lock(75474063) until lock_timeout (60 s, Engine.pm).
    CatalogEntry(
        name="sqitch",
        library="Sqitch (deploy, revert, rework)",
        versions=">= 1.2",
        key_text="75474063",
        level="session (pg_try_advisory_lock, then pg_advisory_lock for up to 60 s)",
        kind="migration",
        lock_level="session",
        key=75474063,
    ),
    # goose, >= 3.26.0 (read at pressly/goose 520411a1, v3.27.3; changed in 57d20f1, first in
    # v3.26.0): lock/session_locker_options.go, DefaultLockID = 4097083626, the IEEE CRC-32
    # of "goose" (its comment still says crc64); lock/postgres.go, postgresSessionLocker
    # .SessionLock runs SELECT pg_try_advisory_lock($1) until it succeeds. Only when the
    # session locker is configured (goose.WithSessionLocker).
    CatalogEntry(
        name="goose",
        library="goose, with its session locker",
        project_name="goose",
        versions=">= 3.26",
        key_text='4097083626 (crc32 of "goose")',
        level="session (pg_try_advisory_lock, retried)",
        kind="migration",
        lock_level="session",
        key=4097083626,
    ),
    # goose 3.15.1 to 3.25.x (read at tag v3.25.0): the same file's DefaultLockID was
    # 5887940537704921958, Go's crc64.ECMA of "goose".
    CatalogEntry(
        name="goose_legacy",
        library="goose, with its session locker",
        project_name="goose",
        versions="3.15.1 - 3.25",
        key_text='5887940537704921958 (crc64 ECMA of "goose")',
        level="session (pg_try_advisory_lock, retried)",
        kind="migration",
        lock_level="session",
        key=5887940537704921958,
    ),
    # Flyway (read at flyway/flyway c5e20fc7, flyway-13.0.0): flyway-database/
    # flyway-database-postgresql/.../PostgreSQLAdvisoryLockTemplate.java: LOCK_MAGIC_NUM
    # ("Flyway" in ASCII, 77431708279161) + a discriminator that PostgreSQLConnection.lock
    # sets to table.toString().hashCode(): Java's hash of "public"."flyway_schema_history"
    # (quoted), the default schema and table. tryLockTransactional runs
    # SELECT pg_try_advisory_xact_lock(n), retried, when postgresql.transactional.lock is on
    # (the default since 9.1.2), tryLock SELECT pg_try_advisory_lock(n) otherwise.
    CatalogEntry(
        name="flyway",
        library='Flyway ("public"."flyway_schema_history")',
        versions=">= 5.0 (the table's default name)",
        key_text='77431708279161 + Java hashCode of "public"."flyway_schema_history"'
        " = 77433833903597",
        level="transaction (pg_try_advisory_xact_lock, retried); session with "
        "postgresql.transactional.lock=false",
        kind="migration",
        lock_level=None,
        key=_FLYWAY_BASE + java_string_hash('"public"."flyway_schema_history"'),
    ),
    # node-pg-migrate, >= 3.0 (read at salsita/node-pg-migrate 55b10c22, v10.0.0-alpha.2, and
    # tags v3.0.0, v7.0.0): src/runner.ts, PG_MIGRATE_LOCK_ID = 7241865325823964; lock()
    # runs SELECT pg_try_advisory_lock(id), or pg_advisory_lock(id) in the "wait" lock mode
    # (>= 9.0). On unless --no-lock.
    CatalogEntry(
        name="node_pg_migrate",
        library="node-pg-migrate",
        versions=">= 3.0",
        key_text="7241865325823964",
        level="session (pg_try_advisory_lock; pg_advisory_lock in wait mode)",
        kind="migration",
        lock_level="session",
        key=7241865325823964,
    ),
    # Kysely's Migrator (read at kysely-org/kysely 478ec67b, v0.29.5+, and in the npm tarballs
    # of 0.27.6, 0.28.0, 0.28.17-0.28.19 and 0.29.0-0.29.9): dist/.../postgres-adapter.js,
    # LOCK_ID = 3853314791062309107. PostgresAdapter.acquireMigrationLock runs
    # pg_advisory_xact_lock(LOCK_ID) in the migration's transaction up to 0.28.17 and in 0.29.0
    # to 0.29.2, and a session pg_advisory_lock(LOCK_ID) (with a one-hour lock_timeout, and an
    # unlock at the end) in 0.28.18, 0.28.19 and from 0.29.3.
    CatalogEntry(
        name="kysely_migration",
        library="Kysely's Migrator",
        project_name="Kysely",
        versions=">= 0.7.8",
        key_text="3853314791062309107",
        level="session (pg_advisory_lock) in 0.28.18-0.28.19 and from 0.29.3; transaction "
        "(pg_advisory_xact_lock) up to 0.28.17 and in 0.29.0-0.29.2",
        kind="migration",
        lock_level=None,
        key=3853314791062309107,
    ),
    # Graphile Migrate, >= 0.1.0 (read at graphile/migrate 54ea390, v2.0.0-rc.3):
    # src/pgReal.ts, withAdvisoryLock runs select pg_try_advisory_lock($1) with
    # ADVISORY_LOCK_MIGRATE = 4727445306447283 ("GRAPHILE MIGRATE" on a phone keypad).
    CatalogEntry(
        name="graphile_migrate",
        library="Graphile Migrate",
        versions=">= 0.1",
        key_text="4727445306447283",
        level="session (pg_try_advisory_lock)",
        kind="migration",
        lock_level="session",
        key=4727445306447283,
    ),
    # tern, >= 1.0 (read at jackc/tern e73daa1, v2.4.2): migrate/migrate.go, lockNum =
    # 9628173550095224; acquireAdvisoryLock runs select pg_advisory_lock($1).
    CatalogEntry(
        name="tern",
        library="tern (Go)",
        versions=">= 1.0",
        key_text="9628173550095224",
        level="session (pg_advisory_lock)",
        kind="migration",
        lock_level="session",
        key=9628173550095224,
    ),
    # Atlas, >= 0.6 (read at ariga/atlas a5e0aecc, v1.2.3): cmd/atlas/internal/cmdapi/
    # migrate.go locks applyLockValue = "atlas_migrate_execute" for migrate apply;
    # sql/postgres/driver.go, Driver.Lock keys it with fnv.New32 (FNV-1) of the name and
    # acquire runs SELECT pg_try_advisory_lock($1), retried until the lock timeout.
    CatalogEntry(
        name="atlas_migrate",
        library="Atlas (migrate apply)",
        versions=">= 0.6",
        key_text='2686470616 (FNV-1 32 of "atlas_migrate_execute")',
        level="session (pg_try_advisory_lock, retried)",
        kind="migration",
        lock_level="session",
        key=fnv1_32("atlas_migrate_execute"),
    ),
    # pg-boss 10 to 12 (read in the npm tarballs of 10.1.6, 11.1.1 and 12.38.0): plans.js,
    # advisoryLock(schema, key) / advisoryLockKey: ('x' || encode(sha224((current_database()
    # || '.pgboss.' || schema || key)::bytea), 'hex'))::bit(64)::bigint, taken with
    # pg_advisory_xact_lock in the transaction of locked(). Migrations and installs lock the
    # empty key (migrationStore.js, plans.create); in 10.x its maintenance (expiring,
    # archiving, dropping jobs: boss.js) does too. The schema is `pgboss` unless configured;
    # another schema's key is the registry's per-database sha224 form.
    CatalogEntry(
        name="pgboss_migration",
        library="pg-boss (its schema lock: migrations and installs; maintenance too in 10.x)",
        versions="10 - 12, schema pgboss",
        key_text='sha224(database + ".pgboss.pgboss"), first 8 bytes',
        level="transaction (pg_advisory_xact_lock)",
        kind="migration",
        lock_level="transaction",
        form=KeyConfig.model_construct(
            name="_", text="{database}.pgboss.pgboss", hash="sha224", per_database=True
        ),
    ),
    # pg-boss 11 and 12 (the same plans.js): createQueue and deleteQueue lock the keys
    # 'create-queue' and 'delete-queue', and the queue statistics 'queue-stats' (12.x takes
    # it with pg_try_advisory_xact_lock).
    *(
        CatalogEntry(
            name=f"pgboss_{key.replace('-', '_')}",
            library=f"pg-boss ({what})",
            versions="11 - 12, schema pgboss",
            key_text=f'sha224(database + ".pgboss.pgboss{key}"), first 8 bytes',
            level="transaction (pg_advisory_xact_lock)",
            kind="queue",
            lock_level="transaction",
            form=KeyConfig.model_construct(
                name="_", text=f"{{database}}.pgboss.pgboss{key}", hash="sha224", per_database=True
            ),
        )
        for key, what in (
            ("create-queue", "createQueue"),
            ("delete-queue", "deleteQueue"),
            ("queue-stats", "queue statistics"),
        )
    ),
    # pg_repack 1.4 (read in Debian 12's postgresql-15-repack 1.4.8, bin/pg_repack): while it
    # repacks one table, its connection holds SELECT pg_try_advisory_lock($1, CAST(-2147483648
    # + $2::bigint AS integer)) with REPACK_LOCK_PREFIX 16185446 and the table's oid, so that
    # two runs never repack one table; released when the table is done. With --jobs, workers
    # build the indexes on connections of their own while that connection sits idle, for as
    # long as the builds take (tests/test_catalog_extensions.py).
    CatalogEntry(
        name="pg_repack",
        library="pg_repack (one lock per table being repacked)",
        versions="1.4",
        key_text="(16185446, table oid - 2147483648)",
        level="session (pg_try_advisory_lock)",
        kind="maintenance",
        lock_level="session",
        form=KeyConfig.model_construct(name="_", namespace=16185446),
        idle_holder=True,
    ),
    # pg_partman 4.7 (read in Debian 12's postgresql-15-partman 4.7.2, pg_partman--4.7.2.sql):
    # each function or procedure keys a try-lock with hashtext() of a fixed text, which the
    # server computes. run_maintenance() takes it in its transaction, run_maintenance_proc()
    # as a session lock; partition_data_proc and undo_partition_proc add the parent table's
    # hashtext as the pair's second int.
    CatalogEntry(
        name="pg_partman_maintenance",
        library="pg_partman (run_maintenance, run_maintenance_proc)",
        versions="4.7",
        key_text="hashtext('pg_partman run_maintenance')",
        level="transaction (pg_try_advisory_xact_lock) in run_maintenance(); session "
        "(pg_try_advisory_lock) in run_maintenance_proc()",
        kind="maintenance",
        lock_level=None,
        form=_hashtext("pg_partman run_maintenance"),
    ),
    _partman("partition_data", "partition_data_proc", "transaction", per_table=True),
    _partman("undo_partition", "undo_partition", "transaction", text="undo_partition_native"),
    _partman("undo_partition_proc", "undo_partition_proc", "transaction", per_table=True),
    _partman("drop_partition_id", "drop_partition_id", "transaction"),
    _partman("drop_partition_time", "drop_partition_time", "transaction"),
    _partman(
        "reapply_constraints", "reapply_constraints_proc", "session", text="reapply_constraints"
    ),
    _partman("run_analyze", "run_analyze", "session"),
    # PgQueuer 1.6 (read in the PyPI wheel of 1.6.0): adapters/persistence/schema_plan.py,
    # advisory_key is zlib.crc32 of the queue table's qualified name ("pgqueuer" by default);
    # queries.py, schema_lock holds SELECT pg_advisory_lock($1) with it while `pgq upgrade`
    # applies the schema, then unlocks.
    CatalogEntry(
        name="pgqueuer_upgrade",
        library="PgQueuer (pgq upgrade; queue table pgqueuer)",
        versions="1.6",
        key_text='crc32("pgqueuer") = 2389487409',
        level="session (pg_advisory_lock)",
        kind="migration",
        lock_level="session",
        form=KeyConfig.model_construct(name="_", text="pgqueuer", hash="crc32"),
    ),
    # PgQueuer 1.6: qb.py, build_aggregate_log_data_to_statistics_query gates the periodic
    # fold of its log into statistics on pg_try_advisory_xact_lock(hashtext(
    # 'pgqueuer_statistics')), the statistics table's qualified name.
    CatalogEntry(
        name="pgqueuer_statistics",
        library="PgQueuer (statistics; table pgqueuer_statistics)",
        versions="1.6",
        key_text="hashtext('pgqueuer_statistics')",
        level="transaction (pg_try_advisory_xact_lock)",
        kind="queue",
        lock_level="transaction",
        form=_hashtext("pgqueuer_statistics"),
    ),
    # Opt-in: small keys that other software may well use for something else.
    # Apache Airflow 2.x and 3.x (read in several versions of apache/airflow's
    # airflow/utils/db.py): DBLocks.MIGRATIONS = enum.auto() = 1; create_global_lock runs
    # SELECT pg_advisory_lock(:id) around the migrations (airflow db migrate).
    CatalogEntry(
        name="airflow_migration",
        library="Apache Airflow (airflow db migrate)",
        versions="2.x, 3.x",
        key_text="1",
        level="session (pg_advisory_lock)",
        kind="migration",
        lock_level="session",
        key=1,
        default=False,
    ),
    # authentik (read in several versions of goauthentik/authentik's lifecycle/migrate.py):
    # ADV_LOCK_UID = 1000; wait_for_lock runs SELECT pg_advisory_lock(%s) before the
    # migrations.
    CatalogEntry(
        name="authentik_migration",
        library="authentik (lifecycle/migrate.py)",
        versions="every version read",
        key_text="1000",
        level="session (pg_advisory_lock)",
        kind="migration",
        lock_level="session",
        key=1000,
        default=False,
    ),
    *QUEUES,
    *MIGRATORS,
)
