"""Who blocks whom in one read: each waiter's blockers and queue, and the contended keys."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence

from pg_advisory_exporter.collect import vocabulary
from pg_advisory_exporter.collect.poolers import PoolerView
from pg_advisory_exporter.keys.key import AdvisoryKey

from .model import Backend, ContendedKey, Forensics, LockEntry, TableHolder, Waiter


def conflicts(held: str, wanted: str) -> bool:
    """Whether two advisory lock modes conflict: exclusive with both, share only with
    exclusive (PostgreSQL's lock conflict table for ExclusiveLock and ShareLock)."""
    return vocabulary.EXCLUSIVE in (held, wanted)


def _waiters(backends: Sequence[Backend]) -> tuple[Waiter, ...]:
    """Each waiter's blockers and the waiters ahead of it, from the rows of the one read
    (never pg_blocking_pids(), which takes every lock-manager partition lock per call)."""
    granted: dict[tuple[int, AdvisoryKey], list[tuple[int, str]]] = defaultdict(list)
    awaiting: dict[tuple[int, AdvisoryKey], list[tuple[Backend, LockEntry]]] = defaultdict(list)
    for backend in backends:
        for lock in backend.locks:
            if lock.granted:
                granted[lock.lock].append((backend.pid, lock.mode))
            else:
                awaiting[lock.lock].append((backend, lock))
    waiters = []
    for queue in awaiting.values():
        for backend, lock in queue:
            blocked_by = sorted(
                {
                    pid
                    for pid, mode in granted[lock.lock]
                    if pid != backend.pid and conflicts(mode, lock.mode)
                }
            )
            # A wait whose start is not known yet began last (it is NULL only briefly).
            ahead = sorted(
                other.pid
                for other, theirs in queue
                if other.pid != backend.pid
                and theirs.wait_start is not None
                and (lock.wait_start is None or theirs.wait_start < lock.wait_start)
                and conflicts(theirs.mode, lock.mode)
            )
            waiters.append(Waiter(backend, lock, tuple(blocked_by), tuple(ahead)))
    waiters.sort(key=lambda w: (-(w.lock.wait_seconds or 0.0), w.backend.pid))
    return tuple(waiters)


def _contended(backends: Sequence[Backend], waiters: Sequence[Waiter]) -> tuple[ContendedKey, ...]:
    queues: dict[tuple[int, AdvisoryKey], list[Waiter]] = {}
    for waiter in waiters:  # the longest waiting first
        queues.setdefault(waiter.lock.lock, []).append(waiter)
    # In one pass: looking through every held lock for each key took 0.3 s of the GIL for
    # 150 holders of 50 keys and 150 keys awaited, which /metrics and liveness waited out.
    holders: dict[tuple[int, AdvisoryKey], list[tuple[int, str]]] = defaultdict(list)
    for backend in backends:
        for held in backend.held:
            if held.lock in queues:
                holders[held.lock].append((backend.pid, held.mode))
    return tuple(
        ContendedKey(
            datname=queue[0].backend.datname,
            key=queue[0].lock.key,
            key_name=queue[0].lock.key_name,
            holders=tuple(holders[lock]),
            waiters=tuple((w.backend.pid, w.lock.mode) for w in queue),
        )
        for lock, queue in queues.items()
    )


def assemble(
    target: str,
    backends: Sequence[Backend],
    backends_total: int | None = None,
    *,
    poolers: Sequence[PoolerView] = (),
    query_text: bool = False,
    read_at: float | None = None,
    table_holders: Sequence[TableHolder] = (),
) -> Forensics:
    """The backends of one read, with each waiter's blockers and the contended keys."""
    waiters = _waiters(backends)
    return Forensics(
        target=target,
        read_at=time.time() if read_at is None else read_at,
        backends=tuple(backends),
        backends_total=len(backends) if backends_total is None else backends_total,
        waiters=waiters,
        contended=_contended(backends, waiters),
        query_text=query_text,
        poolers=tuple(poolers),
        table_holders=tuple(table_holders),
    )
