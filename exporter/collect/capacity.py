"""The nominal size of PostgreSQL's shared lock table, computed as each server version does."""

from __future__ import annotations

import re
from dataclasses import dataclass

import psycopg

# The formula below is verified up to 19 (against the source up to 18, and on real servers
# of each version: tests/test_capacity.py); a later version may size the table otherwise.
NEXT_UNVERIFIED_VERSION = 200000


@dataclass(frozen=True)
class CapacitySettings:
    """The server settings that size the lock table (all fixed at server start); the server's
    version, which the formula also depends on, is the snapshot's (reads.server_version)."""

    max_locks_per_transaction: int
    max_connections: int
    autovacuum_max_workers: int
    max_worker_processes: int
    max_wal_senders: int
    max_prepared_transactions: int
    autovacuum_worker_slots: int | None = None  # PostgreSQL 18 and later


def max_backends(settings: CapacitySettings, version: int) -> int:
    """MaxBackends as InitializeMaxBackends() in src/backend/utils/init/postinit.c computes it,
    on a server of this version (server_version_num)."""
    common = settings.max_connections + settings.max_worker_processes + settings.max_wal_senders
    if version >= 180000:
        # 18 reserves autovacuum_worker_slots, not autovacuum_max_workers, and counts two
        # special workers (the autovacuum launcher and the slot sync worker); 19 the same.
        if settings.autovacuum_worker_slots is None:
            raise ValueError("PostgreSQL 18 needs autovacuum_worker_slots")
        return common + settings.autovacuum_worker_slots + 2
    if version >= 170000:
        return common + settings.autovacuum_max_workers + 2
    # 14 to 16: one extra slot for the autovacuum launcher.
    return common + settings.autovacuum_max_workers + 1


def lock_table_capacity(settings: CapacitySettings, version: int) -> int | None:
    """NLOCKENTS() in src/backend/storage/lmgr/lock.c: the entries the lock table is sized for.

    On PostgreSQL 19 this is a hard limit: the table is allocated whole at server start, and
    the lock request after its last entry fails with "out of shared memory" (53200), whatever
    shared memory is spare. Before 19 it is not: the table can borrow spare shared memory,
    so a server fails somewhat above it, at a point that cannot be predicted. Alert well
    below it either way. None for versions whose formula is not verified.
    """
    if version >= NEXT_UNVERIFIED_VERSION:
        return None
    return settings.max_locks_per_transaction * (
        max_backends(settings, version) + settings.max_prepared_transactions
    )


# A lock request that finds the table full fails with "out of shared memory" (SQLSTATE 53200)
# and a hint that names this setting, in every language the server speaks: a setting's name
# is never translated (quoted from PostgreSQL 18 on). A new connection refused at full (its
# start locks its database, which needs an entry) reaches libpq as text alone, without its
# SQLSTATE, and other shared memory runs out with other hints (max_pred_locks_per_transaction).
_FULL_TABLE_HINT = re.compile(r"(?<![a-z_])max_locks_per_transaction(?![a-z_])")


def refused_for_full_table(exc: BaseException) -> bool:
    """Whether the server refused a statement or a new connection because its lock table is
    full."""
    if not isinstance(exc, psycopg.Error):
        return False
    hint = exc.diag.message_hint if exc.sqlstate == "53200" else None
    return _FULL_TABLE_HINT.search(hint or str(exc)) is not None


# How a read refused for the full table is reported (the server's words follow): on the
# connection the exporter keeps, and on a new one (check's, pg_stat_statements').
FULL_TABLE_REFUSAL = "the server's lock table is full, so it refused the read: "
FULL_TABLE_NO_SESSION = (
    "the server's lock table is full: no new session can start (each takes an entry in it), "
    "so this read cannot connect; a running exporter still reads the server through the "
    "connection it keeps, and its /locks page names who holds the entries: "
)
