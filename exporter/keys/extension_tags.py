"""Advisory-tag locks that extensions take for their own bookkeeping, not the application's.

pg_advisory_lock() and its kin always set pg_locks.objsubid to 1 (a bigint key) or 2 (two
int4 keys). An extension written in C can build an advisory lock tag of its own
(SET_LOCKTAG_ADVISORY) with any fourth field, and some do, to guard their own metadata and
background work. Such a lock is none of the application's keys: it is counted apart
(pg_advisory_extension_locks, pg_advisory_log_extension_lock_waits_total), never as an
application's advisory lock and never as a leak. The extensions below were read in their
source; a code no extension here is known for is "unknown".
"""

from __future__ import annotations

from .key import BIGINT_KEY, INT_PAIR_KEY

# Citus (src/include/distributed/resource_lock.h, AdvisoryLocktagClass): 4 to 16, its shard
# metadata, shards, colocated shards, operations, cleanup and background tasks' locks.
CITUS = range(4, 17)
# TimescaleDB before 2.26 (src/bgw/job.c): (database, job id, 0, 29749), a job worker's
# session RowShareLock on its job, AccessExclusiveLock while a job is deleted.
TIMESCALEDB = 29749
UNKNOWN = "unknown"


def is_application_key(objsubid: int) -> bool:
    """Whether an advisory-tag lock is one that pg_advisory_*() took: an application's key."""
    return objsubid in (BIGINT_KEY, INT_PAIR_KEY)


def extension_of(objsubid: int) -> str:
    """The extension that takes advisory-tag locks with this objsubid, as the `extension`
    label names it."""
    if objsubid in CITUS:
        return "citus"
    if objsubid == TIMESCALEDB:
        return "timescaledb"
    return UNKNOWN
