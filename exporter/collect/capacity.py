"""The nominal size of PostgreSQL's shared lock table, computed as each server version does."""

from __future__ import annotations

from dataclasses import dataclass

MIN_SERVER_VERSION = 140000  # pg_locks.waitstart, which the wait metrics read, is new in 14
# The formula below is verified up to 19 (against the source up to 18, and on real servers
# of each version: tests/test_capacity.py); a later version may size the table otherwise.
NEXT_UNVERIFIED_VERSION = 200000


@dataclass(frozen=True)
class CapacitySettings:
    """The server settings that size the lock table (all fixed at server start)."""

    server_version_num: int
    max_locks_per_transaction: int
    max_connections: int
    autovacuum_max_workers: int
    max_worker_processes: int
    max_wal_senders: int
    max_prepared_transactions: int
    autovacuum_worker_slots: int | None = None  # PostgreSQL 18 and later


def max_backends(settings: CapacitySettings) -> int:
    """MaxBackends as InitializeMaxBackends() in src/backend/utils/init/postinit.c computes it."""
    common = settings.max_connections + settings.max_worker_processes + settings.max_wal_senders
    if settings.server_version_num >= 180000:
        # 18 reserves autovacuum_worker_slots, not autovacuum_max_workers, and counts two
        # special workers (the autovacuum launcher and the slot sync worker); 19 the same.
        if settings.autovacuum_worker_slots is None:
            raise ValueError("PostgreSQL 18 needs autovacuum_worker_slots")
        return common + settings.autovacuum_worker_slots + 2
    if settings.server_version_num >= 170000:
        return common + settings.autovacuum_max_workers + 2
    # 14 to 16: one extra slot for the autovacuum launcher.
    return common + settings.autovacuum_max_workers + 1


def lock_table_capacity(settings: CapacitySettings) -> int | None:
    """NLOCKENTS() in src/backend/storage/lmgr/lock.c: the entries the lock table is sized for.

    On PostgreSQL 19 this is a hard limit: the table is allocated whole at server start, and
    the lock request after its last entry fails with "out of shared memory" (53200), whatever
    shared memory is spare. Before 19 it is not: the table can borrow spare shared memory,
    so a server fails somewhat above it, at a point that cannot be predicted. Alert well
    below it either way. None for versions whose formula is not verified.
    """
    if settings.server_version_num >= NEXT_UNVERIFIED_VERSION:
        return None
    return settings.max_locks_per_transaction * (
        max_backends(settings) + settings.max_prepared_transactions
    )
