"""The series of one target, mapped from its server's snapshot (what metrics.SPECS defines)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from pg_advisory_exporter.keys.appnames import RewriteRule, fold, rewrite
from pg_advisory_exporter.keys.idle_by_design import (
    BY_DESIGN_STATE,
    NOT_IDLE_BY_DESIGN,
    IdleByDesign,
)
from pg_advisory_exporter.keys.registry import NO_KEYS, Registry
from pg_advisory_exporter.metrics import Sample

from .holds import Holds, HoldTracker
from .poolers import PoolerView, owner
from .reads import LOCK_WAITS
from .snapshot import BackendLocks, KeyUse, ServerSnapshot, counted_uses
from .vocabulary import (
    EXCLUSIVE,
    IDLE_STATES,
    SHARE,
    mode_word,
    stranded,
)


def target_series(
    target: str,
    server: Sequence[Sample],
    *,
    duration: float,
    errors_total: int,
    last_success_unix: float | None,
    insufficient_privilege: bool | None,
    folded_application_names: int,
    server_wide: bool = True,
    refused_for_full_table: bool = False,
) -> list[Sample]:
    """A target's series for one scrape: its server series (`pg_advisory_up 0` when the
    collection failed and there are none, with `pg_advisory_lock_table_full 1` on the
    server's target where the server refused it for its full lock table), then the
    exporter's own: about the collection (on the server's target only, see Target), and
    about the target's own answer."""
    name = (target,)
    samples = list(server) or [Sample("pg_advisory_up", name, 0)]
    if server_wide and not server and refused_for_full_table:
        samples.append(Sample("pg_advisory_lock_table_full", name, 1))
    if server_wide:
        samples += [
            Sample("pg_advisory_exporter_collect_duration_seconds", name, duration),
            Sample("pg_advisory_exporter_collect_errors_total", name, errors_total),
        ]
        if last_success_unix is not None:
            samples.append(
                Sample(
                    "pg_advisory_exporter_last_success_timestamp_seconds", name, last_success_unix
                )
            )
        if insufficient_privilege is not None:  # known once a collection succeeded
            samples.append(
                Sample("pg_advisory_exporter_insufficient_privilege", name, insufficient_privilege)
            )
    if insufficient_privilege is not None:
        samples.append(
            Sample("pg_advisory_exporter_folded_application_names", name, folded_application_names)
        )
    return samples


@dataclass
class _Group:
    """Accumulates the backends of one (datname, application_name) label set."""

    locks: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    holders: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    idle_max: dict[str, float] = field(default_factory=dict)
    waiters: int = 0
    wait_max: float = 0.0
    backend_locks_max: int = 0
    # The longest idle hold of the holders idle by design, by the entry that names them.
    by_design_max: dict[str, float] = field(default_factory=dict)

    def add(self, backend: BackendLocks, exempt: bool, by_design: str | None = None) -> None:
        exclusive, share = backend.held_exclusive, backend.held_share
        if exclusive:
            self.locks[EXCLUSIVE, "true"] += exclusive
        if share:
            self.locks[SHARE, "true"] += share
        if backend.awaited_mode is not None:
            self.locks[mode_word(backend.awaited_mode), "false"] += 1
            self.waiters += 1
            self.wait_max = max(self.wait_max, backend.wait_seconds or 0.0)
        if held := exclusive + share:
            state = backend.state_word
            self.holders[state] += 1
            self.backend_locks_max = max(self.backend_locks_max, held)
            seconds = backend.state_seconds
            if seconds is None or state not in IDLE_STATES:
                return
            if by_design is not None and state == BY_DESIGN_STATE:
                self.by_design_max[by_design] = max(self.by_design_max.get(by_design, 0.0), seconds)
            elif not exempt:
                self.idle_max[state] = max(self.idle_max.get(state, 0.0), seconds)


def leak_exempt(backend: BackendLocks, registry: Registry) -> bool:
    """Whether every advisory lock the backend holds is a long-lived key's: a leader's, or a
    migration tool's (the catalog's), which Rails holds on a connection of its own that sits
    idle while the migration runs on another. Such a holder is idle on purpose and never a
    leak; a lock of any other key beside it is judged as always."""
    long_lived = sum(
        use.held for key, use in counted_uses(backend, registry) if key.config.long_lived
    )
    return long_lived > 0 and long_lived >= backend.held


@dataclass
class KeyActivity:
    """One registered key's holders, waiters and longest hold in one database, accumulated."""

    holders: int = 0
    waiters: int = 0
    hold_max: float | None = None  # the longest a holder has held it (holds.py)
    expected: bool = False  # an expect_held key: 0 holders is a finding, not an absence

    def add(self, use: KeyUse, held_for: float | None) -> None:
        if use.awaited:
            self.waiters += 1
        if use.held:
            self.holders += 1
            if held_for is not None:
                self.hold_max = max(self.hold_max or 0.0, held_for)


def key_activity(
    snapshot: ServerSnapshot, registry: Registry, holds: Holds, database: str | None = None
) -> dict[tuple[str, str], KeyActivity]:
    """Holders and waiters of each registered key, and the longest it has been held, by
    (database, key name), in `database` only if one is given.

    A key that is expected to be held gets an empty group in each of its databases (if it
    names none: `database`, else the connection's), so that nobody holding it shows as 0.
    """
    groups: dict[tuple[str, str], KeyActivity] = defaultdict(KeyActivity)
    for backend in snapshot.backends:
        if database is None or backend.datname == database:
            identity = (backend.pid, backend.backend_start)
            for key, use in counted_uses(backend, registry):
                hold = holds.get(identity, key.name)
                held_for = None if hold is None else hold.seconds(holds.now)
                groups[backend.datname, key.name].add(use, held_for)
    for key in registry.keys:
        if key.config.expect_held:
            for datname in key.config.databases or (database or snapshot.current_database,):
                if database is None or datname == database:
                    groups[datname, key.name].expected = True
    return dict(sorted(groups.items()))


def _key_samples(
    target: str, snapshot: ServerSnapshot, registry: Registry, holds: Holds, database: str | None
) -> list[Sample]:
    samples: list[Sample] = []
    for (datname, name), group in key_activity(snapshot, registry, holds, database).items():
        labels = (target, datname, name)
        if group.holders or group.expected:
            samples.append(Sample("pg_advisory_key_holders", labels, group.holders))
        samples.append(Sample("pg_advisory_key_waiters", labels, group.waiters))
        if group.hold_max is not None:
            samples.append(Sample("pg_advisory_key_hold_seconds", labels, group.hold_max))
    samples += [
        Sample("pg_advisory_key_max_hold_seconds", (target, key.name), key.config.max_hold)
        for key in registry.entries
        if key.config.max_hold is not None
    ]
    return samples


def _pooler_samples(
    target: str,
    backends: Sequence[BackendLocks],
    labels: Sequence[str],
    poolers: Sequence[PoolerView],
    server_wide: bool,
) -> list[Sample]:
    """Stranded session locks per pool, and whether each pooler could be read.

    A pooler that was read gets a 0 when nothing is stranded behind it, so that the series'
    absence means "not watched"; one that could not be read gets neither. Whether it was
    read is the server's: on its server target only.
    """
    if not poolers:
        return []
    entries: dict[tuple[str, str, str, str], int] = defaultdict(int)
    for backend, label in zip(backends, labels, strict=True):
        if not backend.held or not backend.session_level:
            continue  # never stranded: no pooler lookup for it
        pooled = owner(poolers, backend.pid, backend.client_addr, backend.client_port)
        if pooled is not None and stranded(backend.held, backend.session_level, pooled.shared):
            entries[backend.datname, label, pooled.pooler, pooled.pool] += backend.held
    samples = []
    if server_wide:
        samples += [Sample("pg_advisory_pooler_up", (target, p.name), p.up) for p in poolers]
        found = {pooler for _, _, pooler, _ in entries}
        samples += [
            Sample("pg_advisory_pooled_session_locks", (target, "", "", p.name, ""), 0)
            for p in poolers
            if p.up and p.name not in found
        ]
    samples += [
        Sample("pg_advisory_pooled_session_locks", (target, *group), count)
        for group, count in sorted(entries.items())
    ]
    return samples


@dataclass(frozen=True)
class ServerSamples:
    samples: list[Sample]
    folded_application_names: int


def server_samples(
    target: str,
    snapshot: ServerSnapshot,
    rules: Sequence[RewriteRule],
    application_name_limit: int,
    registry: Registry = NO_KEYS,
    *,
    holds: Holds | None = None,
    poolers: Sequence[PoolerView] = (),
    database: str | None = None,
    server_wide: bool = True,
    idle_by_design: IdleByDesign = NOT_IDLE_BY_DESIGN,
) -> ServerSamples:
    """Map one snapshot (and what its target's poolers said) to the server series.

    With a `database`, the series of that database only: its locks, holders, waiters,
    keys and deadlocks. With `server_wide`, the series that describe the whole server too
    (its lock table and version, whether its poolers could be read): the server's target
    carries them, once for all the targets that read the server (see Target). `holds` are
    the server's (holds.py); without them, what this snapshot alone tells.
    """
    if holds is None:
        holds = HoldTracker().update(snapshot, registry)
    backends = [b for b in snapshot.backends if database is None or b.datname == database]
    names = [rewrite(backend.application_name, rules) for backend in backends]
    entries_by_name: dict[str, int] = defaultdict(int)
    for backend, name in zip(backends, names, strict=True):
        entries_by_name[name] += backend.advisory_entries
    folding = fold(entries_by_name, application_name_limit)

    labels = [folding.label(name) for name in names]
    groups = _groups(backends, labels, registry, idle_by_design)
    samples = [
        Sample("pg_advisory_up", (target,), 1),
        # A setting, not a count: every target has it, for the budget alert's join.
        Sample(
            "pg_advisory_max_locks_per_transaction",
            (target,),
            snapshot.capacity_settings.max_locks_per_transaction,
        ),
    ]
    if server_wide:
        samples += _server_wide_samples(target, snapshot)
        samples += _top_application(target, snapshot, rules)
        samples.append(Sample("pg_advisory_exporter_untracked_holds", (target,), holds.untracked))
    samples += [
        Sample("pg_advisory_deadlocks_total", (target, datname), deadlocks)
        for datname, deadlocks in sorted(snapshot.deadlocks.items())
        if database is None or datname == database
    ]
    for (datname, application), group in sorted(groups.items()):
        samples += _group_samples((target, datname, application), group)
    samples += [
        Sample("pg_advisory_idle_by_design_max_hold_seconds", (target, entry.name), entry.max_hold)
        for entry in idle_by_design.entries
    ]
    samples += _extension_samples(target, snapshot, database)
    samples += _key_samples(target, snapshot, registry, holds, database)
    samples += _pooler_samples(target, backends, labels, poolers, server_wide)
    return ServerSamples(samples, folding.folded)


def _groups(
    backends: Sequence[BackendLocks],
    labels: Sequence[str],
    registry: Registry,
    idle_by_design: IdleByDesign,
) -> dict[tuple[str, str], _Group]:
    """The backends by database and application_name label (`labels`, one per backend), each
    holder judged as a leak's candidate or by the entry idle by design that names it."""
    groups: dict[tuple[str, str], _Group] = defaultdict(_Group)
    for backend, label in zip(backends, labels, strict=True):
        entry = idle_by_design.match(backend.application_name) if backend.held else None
        groups[backend.datname, label].add(
            backend, leak_exempt(backend, registry), None if entry is None else entry.name
        )
    return groups


def _group_samples(labels: tuple[str, str, str], group: _Group) -> list[Sample]:
    """The series of one database's and application's backends (`labels`)."""
    return [
        *(
            Sample("pg_advisory_locks", (*labels, mode, granted), count)
            for (mode, granted), count in sorted(group.locks.items())
        ),
        *(
            Sample("pg_advisory_holders", (*labels, state), count)
            for state, count in sorted(group.holders.items())
        ),
        *(
            Sample("pg_advisory_idle_holder_max_seconds", (*labels, state), seconds)
            for state, seconds in sorted(group.idle_max.items())
        ),
        *(
            Sample("pg_advisory_idle_by_design_seconds", (*labels, entry), seconds)
            for entry, seconds in sorted(group.by_design_max.items())
        ),
        Sample("pg_advisory_waiters", labels, group.waiters),
        Sample("pg_advisory_wait_max_seconds", labels, group.wait_max),
        Sample("pg_advisory_backend_locks_max", labels, group.backend_locks_max),
    ]


def _extension_samples(target: str, snapshot: ServerSnapshot, database: str | None) -> list[Sample]:
    """Extensions' own advisory-tag locks, by database, extension and whether granted."""
    counts: dict[tuple[str, str, str], int] = defaultdict(int)
    for locks in snapshot.extension_locks:
        if database is None or locks.datname == database:
            for granted, entries in (("true", locks.held), ("false", locks.awaited)):
                if entries:
                    counts[locks.datname, locks.extension, granted] += entries
    return [
        Sample("pg_advisory_extension_locks", (target, *labels), entries)
        for labels, entries in sorted(counts.items())
    ]


def _server_wide_samples(target: str, snapshot: ServerSnapshot) -> list[Sample]:
    """The series that describe the whole server: its version, its lock table, how long it
    lets a dead client's session keep its locks."""
    samples = [
        Sample("pg_advisory_server_info", (target, snapshot.server_version), 1),
        Sample("pg_advisory_lock_table_entries", (target,), snapshot.lock_table_entries),
        Sample("pg_advisory_lock_table_full", (target,), snapshot.lock_table_full),
        Sample(
            "pg_advisory_lock_table_backend_entries_max",
            (target,),
            snapshot.backend_table_entries_max,
        ),
    ]
    capacity = snapshot.lock_table_capacity
    if capacity is not None:
        samples.append(Sample("pg_advisory_lock_table_capacity", (target,), capacity))
    waits = snapshot.lock_waits
    if waits is not None:  # PostgreSQL 19 and later
        counted, waited = LOCK_WAITS.series
        samples += [
            Sample(counted, (target,), waits.waits),
            Sample(waited, (target,), waits.wait_seconds),
        ]
    return samples + _release_samples(target, snapshot)


def _top_application(
    target: str, snapshot: ServerSnapshot, rules: Sequence[RewriteRule]
) -> list[Sample]:
    """The application (as the target's rewrites name it) and database whose backends hold
    the most lock table entries, whatever they lock."""
    entries: dict[tuple[str, str], int] = defaultdict(int)
    for held in snapshot.table_entries_by_application:
        entries[held.datname, rewrite(held.application_name, rules)] += held.entries
    if not entries:
        return []
    # The most entries; of equals, the first by name, so that the label stays put.
    (datname, application), most = min(entries.items(), key=lambda item: (-item[1], item[0]))
    return [
        Sample(
            "pg_advisory_lock_table_top_application_entries", (target, datname, application), most
        )
    ]


def _release_samples(target: str, snapshot: ServerSnapshot) -> list[Sample]:
    """How long a dead or stuck client's session keeps its locks, and who would be hit now:
    the backends of the whole server holding locks outside any transaction."""
    samples = [
        Sample("pg_advisory_idle_session_holders", (target,), snapshot.idle_session_holders),
        Sample(
            "pg_advisory_idle_in_transaction_release_seconds",
            (target,),
            snapshot.idle_in_transaction_release_seconds,
        ),
    ]
    dead_client = snapshot.dead_client_release_seconds
    if dead_client is not None:
        samples.append(Sample("pg_advisory_dead_client_release_seconds", (target,), dead_client))
    return samples
