"""What /locks shows at a glance: keys held per group, the awaited ones, who blocks whom."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pg_advisory_exporter.keys.key import BIGINT_KEY, AdvisoryKey

from .model import Backend, Forensics, LockEntry, Waiter


def key_group(lock: LockEntry) -> str:
    """The group a key is counted in: its registry or catalog name, else its namespace (the
    first int of a pair), else "unnamed bigint"."""
    if lock.key_name is not None:
        return lock.key_name
    if lock.key.objsubid == BIGINT_KEY:
        return "unnamed bigint"
    return f"namespace {lock.key.parts[0]}"


def held_per_group(backend: Backend) -> list[tuple[str, int]]:
    """The listed keys it holds, counted per group, the largest group first: a holder's
    `key_groups` on the page (collect/series.py's key_activity is each registered key's
    holders and waiters)."""
    counts = Counter(key_group(lock) for lock in backend.held)
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))


Awaited = set[tuple[int, AdvisoryKey]]  # (database oid, key) of every awaited lock


def awaited_locks(forensics: Forensics) -> Awaited:
    """The locks that somebody awaits."""
    return {waiter.lock.lock for waiter in forensics.waiters}


def split_held(backend: Backend, awaited: Awaited) -> tuple[list[LockEntry], list[LockEntry]]:
    """Its listed held locks: the contended ones (somebody awaits them), and the others."""
    hot: list[LockEntry] = []
    rest: list[LockEntry] = []
    for lock in backend.held:
        (hot if lock.lock in awaited else rest).append(lock)
    return hot, rest


@dataclass(frozen=True)
class ChainNode:
    """One backend in the "who blocks whom" forest: a head blocker (it awaits nothing) at a
    root, a waiter under each backend that holds it back. A backend is shown in full once:
    met again, it is marked `cycle` (it is on the way up: a deadlock in progress) or `seen`
    (shown in full elsewhere), without its waiters."""

    pid: int
    waiter: Waiter | None  # None: it awaits nothing
    queued: bool  # held back by earlier waiters only (nobody holding a conflicting mode)
    repeat: str | None  # None, "cycle", "seen" or "continued" (at a root further down)
    waiters: tuple[ChainNode, ...]


# The deepest a chain nests: a longer one goes on at a root of its own (its nesting, and
# json's, stay far from Python's recursion limit, and the page stays readable).
CHAIN_DEPTH = 16


def blocking_chains(waiters: Sequence[Waiter]) -> tuple[ChainNode, ...]:
    """The forest of who blocks whom: roots are the head blockers, the longest wait first;
    then any waiter not under one (a cycle: every backend in it waits), then the rest of
    chains deeper than CHAIN_DEPTH."""
    by_pid = {w.backend.pid: w for w in waiters}
    under: dict[int, list[Waiter]] = {}
    for waiter in waiters:  # the longest waiting first
        for pid in waiter.blocked_by or waiter.queued_behind:
            under.setdefault(pid, []).append(waiter)
    shown: set[int] = set()
    deeper: list[int] = []  # continued at a root

    def node(pid: int, path: tuple[int, ...]) -> ChainNode:
        waiter = by_pid.get(pid)
        queued = waiter is not None and not waiter.blocked_by and bool(waiter.queued_behind)
        if pid in path or pid in shown:
            return ChainNode(pid, waiter, queued, "cycle" if pid in path else "seen", ())
        if len(path) >= CHAIN_DEPTH and pid in under:
            deeper.append(pid)
            shown.add(pid)
            return ChainNode(pid, waiter, queued, "continued", ())
        shown.add(pid)
        children = tuple(node(w.backend.pid, (*path, pid)) for w in under.get(pid, ()))
        return ChainNode(pid, waiter, queued, None, children)

    def with_the_rest(root: ChainNode) -> list[ChainNode]:
        """The root, and the chains deeper than CHAIN_DEPTH under it, each from where it
        was cut (shown as a whole from there)."""
        found = [root]
        while deeper:
            pid = deeper.pop(0)
            shown.discard(pid)
            found.append(node(pid, ()))
        return found

    roots = [n for pid in under if pid not in by_pid for n in with_the_rest(node(pid, ()))]
    for waiter in waiters:  # those left wait on a cycle, or for nobody any more
        if waiter.backend.pid not in shown:
            roots += with_the_rest(node(_on_its_cycle(waiter, by_pid), ()))
    return tuple(roots)


def _on_its_cycle(waiter: Waiter, by_pid: Mapping[int, Waiter]) -> int:
    """Up from a waiter that no head blocker holds back, the first backend met twice (one
    on its cycle, so that the whole cycle is shown under it), or the last one up."""
    met: set[int] = set()
    pid = waiter.backend.pid
    while pid not in met and pid in by_pid:
        met.add(pid)
        up = by_pid[pid].blocked_by or by_pid[pid].queued_behind
        if not up:
            return pid
        pid = up[0]
    return pid
