"""The well-known keys of job queues, leader elections, distributed mutexes and schedulers.

Each entry's key was read in the library's own source (repository or package, file, function
and version in the comment above it) and is pinned by tests/test_catalog.py; none of that code
is copied here. Keys small enough that other software may well use them too (a hand-picked
1, 4444 or 100100) are opt-in, as Airflow's is.

Left out, the key being no constant a catalog can name: Que and good_job 4 lock a key per job
(its id; an md5 of the table's name and the id), Oban and Ecto's migration lock Erlang's
phash2 (docs/configuration.md says so); tooz's PostgreSQL driver (read at openstack/tooz 04866ab9,
tooz/drivers/pgsql.py) pairs the first two bytes of the md5 of the name the application gives.
"""

from __future__ import annotations

from .catalog_entry import CatalogEntry
from .key_config import KeyConfig

# NetBox (read at netbox-community/netbox 18f11ace, v4.x): netbox/netbox/constants.py,
# ADVISORY_LOCK_KEYS, taken with django-pglocks' advisory_lock (SELECT pg_advisory_lock(%s),
# waiting) around the API's available-objects views (ipam/api/views.py) and around
# JobRunner.enqueue_once (netbox/jobs.py), which keeps one schedule per job.
_NETBOX = (
    ("available_prefixes", "available-prefixes", 100100),
    ("available_ips", "available-ips", 100200),
    ("available_vlans", "available-vlans", 100300),
    ("available_asns", "available-asns", 100400),
    ("job_schedules", "job-schedules", 110100),
)

QUEUES: tuple[CatalogEntry, ...] = (
    # Rihanna (Elixir; read at samsondav/rihanna 050a53ff, config.ex at 1515fd73, 2.x):
    # lib/rihanna/job.ex, lock/3 takes pg_try_advisory_lock($1::integer, (j).id) per job with
    # the classid of lib/rihanna/config.ex, pg_advisory_lock_class_id (1_759_441_536 unless
    # configured), on the dispatcher's connection, which sits idle while the job's process
    # runs it; mark_successful / mark_failed unlock it.
    CatalogEntry(
        name="rihanna_jobs",
        library="Rihanna (Elixir; one lock per running job)",
        versions="2.x as read, classid not configured",
        key_text="(1759441536, job id)",
        level="session (pg_try_advisory_lock)",
        kind="queue",
        lock_level="session",
        form=KeyConfig.model_construct(name="_", namespace=1759441536),
        idle_holder=True,
    ),
    # ElectricSQL's sync service (read at electric-sql/electric 06c14429, packages/
    # sync-service): lib/electric/postgres/lock_connection.ex, lock_query runs SELECT
    # pg_advisory_lock(hashtext('<lock name>')) on a replication-mode connection of its own,
    # held for as long as the service owns the replication slot; the connection manager
    # passes the slot's name as the lock's, electric_slot_<replication stream id>, the id
    # "default" unless configured (ELECTRIC_REPLICATION_STREAM_ID).
    CatalogEntry(
        name="electric_replication",
        library="ElectricSQL sync service (owner of its replication slot)",
        project_name="ElectricSQL",
        versions="main, as read in 2026; slot electric_slot_default",
        key_text="hashtext('electric_slot_default')",
        level="session (pg_advisory_lock), for the service's lifetime",
        kind="leader",
        lock_level="session",
        form=KeyConfig.model_construct(
            name="_", text="electric_slot_default", hash="hashtext", form="bigint"
        ),
        idle_holder=True,
    ),
    # Unleash (read at Unleash/unleash 21a4a472, and server-impl.ts at 02b3805c):
    # src/lib/util/db-lock.ts, withDbLock runs SELECT pg_advisory_lock($1) with
    # defaultLockKey 479341 on a pg Client of its own and holds it while the wrapped work
    # runs (30 minutes at most); src/lib/server-impl.ts wraps the migrations in it (the
    # migrationLock flag).
    CatalogEntry(
        name="unleash_migration",
        library="Unleash (its migrations)",
        versions="main, as read in 2026",
        key_text="479341",
        level="session (pg_advisory_lock)",
        kind="migration",
        lock_level="session",
        key=479341,
    ),
    # LangChain's PGVector: langchain-postgres 0.0.19 (PyPI wheel), langchain_postgres/
    # vectorstores.py, _create_vector_extension runs SELECT pg_advisory_xact_lock(
    # 1573678846307946496); CREATE EXTENSION IF NOT EXISTS vector in one transaction
    # (PGVector.__post_init__, create_extension=True); the same key in langchain_community's
    # PGVector.create_vector_extension, LangChain.js's PGVectorStore and langchaingo's
    # pgLockIDExtension.
    CatalogEntry(
        name="langchain_pgvector_extension",
        library="LangChain PGVector (CREATE EXTENSION vector; Python, JS and Go)",
        project_name="LangChain",
        versions="langchain-postgres 0.0.19; langchain_community, LangChain.js, langchaingo",
        key_text="1573678846307946496",
        level="transaction (pg_advisory_xact_lock)",
        kind="migration",
        lock_level="transaction",
        key=1573678846307946496,
    ),
    # langchaingo (read at tmc/langchaingo 02344647): vectorstores/pgvector/pgvector.go,
    # Store.init creates its tables in one transaction, each after SELECT
    # pg_advisory_xact_lock($1): pgLockIDCollectionTable 1573678846307946495 and
    # pgLockIDEmbeddingTable 1573678846307946494.
    *(
        CatalogEntry(
            name=f"langchaingo_pgvector_{table}",
            library=f"langchaingo PGVector (CREATE TABLE of its {table}s)",
            project_name="langchaingo",
            versions="main, as read in 2026",
            key_text=str(key),
            level="transaction (pg_advisory_xact_lock)",
            kind="migration",
            lock_level="transaction",
            key=key,
        )
        for table, key in (
            ("collection", 1573678846307946495),
            ("embedding", 1573678846307946494),
        )
    ),
    # Opt-in: small keys that other software may well use for something else.
    # Apache Airflow's scheduler (read in airflow/jobs/scheduler_job_runner.py of 2.x and
    # airflow-core/src/airflow/jobs/scheduler_job_runner.py of 3.x): _executable_task_
    # instances_to_queued runs SELECT pg_try_advisory_xact_lock(:id) with DBLocks
    # .SCHEDULER_CRITICAL_SECTION (airflow/utils/db.py, enum.auto() = 2) before it locks the
    # pool rows, in each scheduler loop's transaction.
    CatalogEntry(
        name="airflow_scheduler",
        library="Apache Airflow scheduler (its critical section)",
        project_name="Apache Airflow",
        versions="2.x, 3.x",
        key_text="2",
        level="transaction (pg_try_advisory_xact_lock)",
        kind="mutex",
        lock_level="transaction",
        key=2,
        default=False,
    ),
    # Marten's async projection daemon (read at JasperFx/marten: DaemonSettings.cs and, in
    # 7.x-8.x, ProjectionOptions; Events/Daemon/Coordination/AdvisoryLock.cs): DaemonLockId
    # = 4444 unless configured; the leader's AdvisoryLock takes it with Weasel's
    # TryGetGlobalLock (SELECT pg_try_advisory_lock(:id)) on a connection of its own and
    # holds it, idle, for as long as it leads while the projections run on others.
    CatalogEntry(
        name="marten_async_daemon",
        library="Marten async projection daemon (.NET; its leader)",
        project_name="Marten",
        versions="4.x - 8.x, DaemonLockId not configured",
        key_text="4444",
        level="session (pg_try_advisory_lock), for as long as it leads",
        kind="leader",
        lock_level="session",
        key=4444,
        default=False,
        idle_holder=True,
    ),
    # Wolverine (read at JasperFx/wolverine 0225d0fb): src/Persistence/
    # Wolverine.Postgresql/PostgresqlNodePersistence.cs, LeaderLockId = 9999999;
    # MarkNodeAsLeaderAsync takes it with TryGetGlobalLock (pg_try_advisory_lock) while it
    # writes the leader's assignment, then releases it.
    CatalogEntry(
        name="wolverine_leader_election",
        library="Wolverine (.NET; marking its leader node)",
        versions="main, as read in 2026",
        key_text="9999999",
        level="session (pg_try_advisory_lock)",
        kind="leader",
        lock_level="session",
        key=9999999,
        default=False,
    ),
    # SpiceDB (read at authzed/spicedb 478c1f29): internal/datastore/postgres/locks.go,
    # gcRunLock = 1 and revisionHeartbeatLock = 2; tryAcquireLock runs SELECT
    # pg_try_advisory_lock($1) on a connection of its write pool: the garbage collection
    # run's, and the revision heartbeat leader's (the datastore's startRevisionHeartbeat
    # retries it until elected, then holds it for as long as it runs), the pooled
    # connection idle between beats.
    CatalogEntry(
        name="spicedb_gc",
        library="SpiceDB (PostgreSQL datastore: garbage collection run)",
        versions="main, as read in 2026",
        key_text="1",
        level="session (pg_try_advisory_lock)",
        kind="mutex",
        lock_level="session",
        key=1,
        default=False,
    ),
    CatalogEntry(
        name="spicedb_revision_heartbeat",
        library="SpiceDB (PostgreSQL datastore: revision heartbeat leader)",
        versions="main, as read in 2026",
        key_text="2",
        level="session (pg_try_advisory_lock), for as long as it leads",
        kind="leader",
        lock_level="session",
        key=2,
        default=False,
        idle_holder=True,
    ),
    # n8n (read at n8n-io/n8n e492c35a): packages/@n8n/db/src/services/db-lock.service.ts,
    # DbLock.AUTH_ROLES_SYNC = 1001 and TRUSTED_KEY_REFRESH = 1002; withLock runs the work in a
    # transaction after SELECT pg_advisory_xact_lock, tryWithLock after
    # pg_try_advisory_xact_lock.
    *(
        CatalogEntry(
            name=f"n8n_{name}",
            library=f"n8n ({what})",
            versions="main, as read in 2026 (DbLockService)",
            key_text=str(key),
            level="transaction (pg_advisory_xact_lock or pg_try_advisory_xact_lock)",
            kind="mutex",
            lock_level="transaction",
            key=key,
            default=False,
        )
        for name, what, key in (
            ("auth_roles_sync", "syncing its roles", 1001),
            ("trusted_key_refresh", "refreshing its trusted keys", 1002),
        )
    ),
    *(
        CatalogEntry(
            name=f"netbox_{name}",
            library=f"NetBox (its {text} lock)",
            versions="4.x",
            key_text=str(key),
            level="session (pg_advisory_lock)",
            kind="mutex",
            lock_level="session",
            key=key,
            default=False,
        )
        for name, text, key in _NETBOX
    ),
    # Terraform's pg backend (read at hashicorp/terraform 11f95d20; OpenTofu 1.10 changed its
    # workspace creation lock, not read):
    # internal/backend/remote-state/pg/client.go, RemoteClient.Lock takes SELECT
    # pg_try_advisory_lock(-1), the workspace creation lock, while a workspace is created
    # (and for a moment beside an existing workspace's own lock, its row id).
    CatalogEntry(
        name="terraform_pg_backend_create",
        library="Terraform pg backend (workspace creation)",
        versions="main, as read in 2026",
        key_text="-1",
        level="session (pg_try_advisory_lock)",
        kind="mutex",
        lock_level="session",
        key=-1,
        default=False,
    ),
)
