"""The well-known keys of more schema migration tools, across ecosystems (issue 40).

As in well_known_keys.py, which lists these after its own: every key below was read in the
tool's own source (the repository or package, file, function and version are in the comment
above each entry) and is pinned by tests/test_catalog.py; none of that code is copied here.
Unleash's migration lock (479341, on an idle connection of its own while db-migrate runs on
others: read at Unleash/unleash ceeb5a9ca6, 8.1.0) is well_known_queues.py's entry.
Not catalogued, for want of a key that can be computed: Ecto's migration lock
(`:erlang.phash2`, docs/configuration.md says so). Read and left out: HashiCorp Boundary
(3865661975), whose every running server holds the key in share mode for its whole life, so
that a migration's judgement (stuck after a while) would page on every server.
"""

from __future__ import annotations

import hashlib

from .catalog_entry import CatalogEntry, crc32, java_string_hash
from .key_config import KeyConfig

# @slonik/migrator's key names the migrations table the application gives it: 'migration', the
# one its README gives and its older versions' default (0.12 asks for it by name).
_SLONIK_TABLE = '"migration"'  # JSON.stringify of the name


def _md5_uint32(text: str) -> int:
    """The first 8 hex digits of the MD5 of the text, as an unsigned int (parseInt(hex, 16))."""
    return int(hashlib.md5(text.encode()).hexdigest()[:8], 16)


def _sha256_int32(text: str) -> int:
    """The first 4 bytes of the SHA-256 of the text, big-endian signed (Node's readInt32BE)."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big", signed=True)


MIGRATORS: tuple[CatalogEntry, ...] = (
    # Sequel's Migrator, >= 5.78 (read at jeremyevans/sequel 868c4616, 5.106; added in
    # 9a556708c, first in 5.78.0): lib/sequel/extensions/migration.rb, Migrator.run with
    # use_advisory_lock: true wraps the run in db.with_advisory_lock(MIGRATION_ADVISORY_LOCK_ID
    # = 4966325471869609408); adapters/shared/postgres.rb, with_advisory_lock runs
    # pg_try_advisory_lock(id) within synchronize, so the migrations run on the connection that
    # holds it. Off unless use_advisory_lock is given (Debian 12's ruby-sequel 5.63 predates it;
    # the tests run Debian sid's 5.109).
    CatalogEntry(
        name="sequel_migration",
        library="Sequel's Migrator (Ruby), with use_advisory_lock",
        project_name="Sequel",
        versions=">= 5.78",
        key_text="4966325471869609408",
        level="session (pg_try_advisory_lock)",
        kind="migration",
        lock_level="session",
        key=4966325471869609408,
    ),
    # Pact Broker (read at pact-foundation/pact_broker fd6e5b63, 2.120.0): lib/pact_broker/
    # app.rb, prepare_database takes AdvisoryLock.new(connection, :migrate, :pg_advisory_lock)
    # around the schema and data migrations; db/advisory_lock.rb registers it with the
    # sequel-pg_advisory_lock gem (read at yuryroot/sequel-pg_advisory_lock 16c990f),
    # whose advisory_lock_key_for is Zlib.crc32(name) % 2 ** 31 and whose with_advisory_lock
    # runs pg_advisory_lock(key) within synchronize. Any application that registers a lock
    # named :migrate with that gem takes the same key.
    CatalogEntry(
        name="pact_broker_migration",
        library="Pact Broker (sequel-pg_advisory_lock's :migrate)",
        versions="2.120 (read)",
        key_text='crc32("migrate") mod 2^31 = 223143857',
        level="session (pg_advisory_lock)",
        kind="migration",
        lock_level="session",
        key=crc32("migrate") % 2**31,
    ),
    # @slonik/migrator 0.12.0 (read in the npm tarball): dist/index.js, advisoryLockId is
    # parseInt of the first 8 hex digits of the MD5 of '@slonik/migrator advisory lock:' +
    # JSON.stringify(migrationTableName); runCommand, for up and down, takes select
    # pg_advisory_lock(id) on a pool connection of its own (parent.connect), which sits idle
    # while the migrations run on another (parent.connect, or parent.transaction).
    CatalogEntry(
        name="slonik_migrator",
        library="@slonik/migrator (migrationTableName 'migration')",
        versions="0.12",
        key_text="md5('@slonik/migrator advisory lock:\"migration\"'), first 4 bytes unsigned"
        " = 1230759186",
        level="session (pg_advisory_lock), on an idle connection of its own",
        kind="migration",
        lock_level="session",
        key=_md5_uint32("@slonik/migrator advisory lock:" + _SLONIK_TABLE),
    ),
    # pgroll (read at xataio/pgroll cdbe9b0f, v0.16.2): pkg/state/state.go, State.Init runs
    # SELECT pg_advisory_xact_lock($1) with the key 0x2c03057fb9525b in the transaction that
    # installs or upgrades its state schema (pgroll init, and a pgroll newer than the schema).
    CatalogEntry(
        name="pgroll_init",
        library="pgroll (its state schema: init, upgrade)",
        versions="0.16 (read)",
        key_text="12388221127840347 (0x2c03057fb9525b)",
        level="transaction (pg_advisory_xact_lock)",
        kind="migration",
        lock_level="transaction",
        key=0x2C03057FB9525B,
    ),
    # liquibase-sessionlock (read at blagerweij/liquibase-sessionlock 135aa45, 1.6.9):
    # src/main/java/.../PGLockService.java, getChangeLogLockId is the pair (Java hashCode of
    # the change log lock table's name, hashCode of the default schema), taken with
    # SELECT pg_try_advisory_lock(?,?) on Liquibase's connection, which runs the changes.
    # Liquibase's PostgresDatabase.getDatabaseChangeLogLockTableName lower-cases the name
    # (liquibase/liquibase, liquibase-standard): "databasechangeloglock" in schema "public".
    CatalogEntry(
        name="liquibase_sessionlock",
        library="Liquibase with liquibase-sessionlock (databasechangeloglock, public)",
        project_name="Liquibase",
        versions="1.6 (read)",
        key_text='(hashCode("databasechangeloglock"), hashCode("public")) = '
        "(-1497367772, -977423767)",
        level="session (pg_try_advisory_lock)",
        kind="migration",
        lock_level="session",
        form=KeyConfig.model_construct(
            name="_", pair=(java_string_hash("databasechangeloglock"), java_string_hash("public"))
        ),
    ),
    # pgmigrate (Go; read at peterldowns/pgmigrate 54dbdfe, v0.4.0; the lock since dcdfba3,
    # 2023): migrator.go, Migrate locks the name "pgmigrate-" + "-" + TableName (by default
    # public.pgmigrate_migrations) through internal/sessionlock/sessionlock.go, With: ID is
    # crc32.ChecksumIEEE("sessionlock-" + name), taken with SELECT pg_try_advisory_lock(id)
    # every 100 ms on the connection that then applies the migrations.
    CatalogEntry(
        name="pgmigrate",
        library="pgmigrate (Go; table public.pgmigrate_migrations)",
        versions="0.4 (read)",
        key_text='crc32("sessionlock-pgmigrate--public.pgmigrate_migrations") = 3175788019',
        level="session (pg_try_advisory_lock, retried)",
        kind="migration",
        lock_level="session",
        key=crc32("sessionlock-pgmigrate--public.pgmigrate_migrations"),
    ),
    # n8n, >= 2.33 (read in the npm tarballs of @n8n/db 1.32.0, without it, 1.33.0 and 1.41.2,
    # n8n 2.41.3's): dist/connection/db-connection.js, migrateWithAdvisoryLock takes
    # DbLockService.withLock(1005, ...) (DbLock.MIGRATIONS) with subKey = the first 4 bytes,
    # big-endian signed (readInt32BE), of the SHA-256 of `${schema}:${entityPrefix}`, by
    # default "public:"; services/db-lock.service.js runs SELECT pg_advisory_xact_lock($1, $2)
    # in the transaction that then runs the pending migrations.
    CatalogEntry(
        name="n8n_migration",
        library="n8n (its migrations; schema public, no table prefix)",
        versions=">= 2.33",
        key_text='(1005, sha256("public:"), first 4 bytes) = (1005, 349025233)',
        level="transaction (pg_advisory_xact_lock)",
        kind="migration",
        lock_level="transaction",
        form=KeyConfig.model_construct(name="_", pair=(1005, _sha256_int32("public:"))),
    ),
    # Opt-in: small or round keys that other software may well use for something else.
    # DBOS Transact (Python), >= 2.14 (read in the PyPI wheels of 2.13.0, without it, 2.14.0 and
    # 3.4.0): dbos/_sys_db_postgres.py, run_migrations takes MIGRATION_LOCK_ID = 1234567890 on a
    # connection of its own (pg_advisory_lock in 2.14; in 3.4 pg_try_advisory_lock every second
    # for up to 30 s, in autocommit), which sits idle while ensure_dbos_schema and
    # run_dbos_migrations migrate the system database on others (engine.begin()).
    CatalogEntry(
        name="dbos_migration",
        library="DBOS Transact (Python; its system database's migrations)",
        project_name="DBOS",
        versions=">= 2.14",
        key_text="1234567890",
        level="session (pg_try_advisory_lock, retried for 30 s; pg_advisory_lock in 2.14), "
        "on an idle connection of its own",
        kind="migration",
        lock_level="session",
        key=1234567890,
        default=False,
    ),
    # Evolve (.NET; read at lecaillon/Evolve 82c4ddf, 3.2.0+; the key since 7df3ca0, 2017):
    # src/Evolve/Dialect/PostgreSQL/PostgreSQLDatabase.cs, LOCK_ID = 12345;
    # TryAcquireApplicationLock runs SELECT pg_try_advisory_lock(12345).
    CatalogEntry(
        name="evolve_migration",
        library="Evolve (.NET)",
        versions="3.2 (read; the key since 2017)",
        key_text="12345",
        level="session (pg_try_advisory_lock)",
        kind="migration",
        lock_level="session",
        key=12345,
        default=False,
    ),
    # Marten (.NET; read at JasperFx/marten c921fa5df, 9.29.0, with JasperFx/weasel V9.26.0):
    # src/Marten/StoreOptions.cs, ApplyChangesLockId = 4004 unless configured;
    # Services/MartenActivator.cs, TryAttainLock runs Weasel's TryGetGlobalLock (Weasel.Postgresql
    # AdvisoryLockExtensions.cs: SELECT pg_try_advisory_lock(:id)), tried four times, for
    # ApplyAllConfiguredChangesToDatabaseAsync, which it is handed to as the IGlobalLock that
    # guards the schema changes at start-up (ApplyChangesOnStartup).
    CatalogEntry(
        name="marten_apply_changes",
        library="Marten (.NET; ApplyChangesOnStartup)",
        versions="9.29 (read)",
        key_text="4004 (ApplyChangesLockId)",
        level="session (pg_try_advisory_lock, tried four times)",
        kind="migration",
        lock_level="session",
        key=4004,
        default=False,
    ),
    # AdonisJS Lucid (read in the npm tarball of @adonisjs/lucid 21.8.2): build/src/migration/
    # runner.js, acquireLock calls dialect.getAdvisoryLock(1) outside the migrations'
    # transactions unless disableLocks; dialects/pg.js runs SELECT PG_TRY_ADVISORY_LOCK('1').
    # The same key as Airflow's: with both chosen, the first in catalog order names it.
    CatalogEntry(
        name="lucid_migration",
        library="AdonisJS Lucid migrations",
        project_name="AdonisJS Lucid",
        versions="21.8 (read)",
        key_text="1",
        level="session (pg_try_advisory_lock)",
        kind="migration",
        lock_level="session",
        key=1,
        default=False,
    ),
)
