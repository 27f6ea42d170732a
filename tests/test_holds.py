"""How long a lock has been held (collect/holds.py), collection after collection: the pure
logic, with snapshots made here. tests/test_hold_time.py has the same on a real server."""

from __future__ import annotations

from dataclasses import replace

from support import IDLE, READ_AT, snapshot_of

from pg_advisory_exporter.collect.holds import MAX_TRACKED, Hold, Holder, HoldTracker, hold_of
from pg_advisory_exporter.collect.series import key_activity, leak_exempt, server_samples
from pg_advisory_exporter.collect.snapshot import BackendLocks, KeyUse, ServerSnapshot
from pg_advisory_exporter.keys.catalog import BY_NAME
from pg_advisory_exporter.keys.key_config import KeyConfig
from pg_advisory_exporter.keys.registry import Registry

STARTED = READ_AT - 86_400.0  # the backend started a day before the first look
JOB = KeyConfig(name="nightly", key=7310001)
PER_ROW = KeyConfig(name="per_row", namespace=2001, level="transaction")
REGISTRY = Registry.resolve([JOB, PER_ROW], None)
NIGHTLY, ROWS = KeyUse(0, 1, False), KeyUse(1, 1, False)


def _busy(**fields: object) -> BackendLocks:
    """A backend at work in an autocommit statement (a transaction of its own), holding the
    nightly job's key since before the statement began."""
    base = replace(
        IDLE,
        state="active",
        state_seconds=0.2,
        in_transaction=True,
        backend_start=STARTED,
        xact_start=READ_AT - 0.2,
        registered=(NIGHTLY,),
    )
    return replace(base, **fields)  # type: ignore[arg-type]


def _at(seconds: float, *backends: BackendLocks) -> ServerSnapshot:
    return replace(snapshot_of(*backends), read_at=READ_AT + seconds)


def _seconds(tracker: HoldTracker, snapshot: ServerSnapshot, name: str | None = "nightly") -> float:
    holds = tracker.update(snapshot, REGISTRY)
    [backend] = snapshot.backends
    hold = holds.get((backend.pid, backend.backend_start), name)
    assert hold is not None
    return hold.seconds(holds.now)


def test_a_hold_outlives_the_statements_and_transactions_of_its_session() -> None:
    # node-pg-migrate's migration: many short statements, each its own transaction, the lock
    # held throughout; the time in the state starts over at each one.
    tracker = HoldTracker()
    assert _seconds(tracker, _at(0, _busy())) == 0.0
    for second in range(1, 32):
        statement = _busy(xact_start=READ_AT + second - 0.1, state_seconds=0.1)
        assert _seconds(tracker, _at(second, statement)) == second
    # The holder's own hold (any advisory lock) counts alike.
    assert _seconds(tracker, _at(40, _busy(xact_start=READ_AT + 39.9)), None) == 40


def test_an_idle_holder_has_held_at_least_since_it_went_idle() -> None:
    # A Rails migration's lock connection, idle since it took the lock an hour ago: the first
    # look after a restart already knows that much.
    rails = replace(IDLE, backend_start=STARTED, registered=(NIGHTLY,), state_seconds=3600.0)
    tracker = HoldTracker()
    assert _seconds(tracker, _at(0, rails)) == 3600.0
    # It runs a statement and goes idle again: held still since an hour before the first look.
    assert _seconds(tracker, _at(15, _busy())) == 3615.0
    assert _seconds(tracker, _at(30, replace(rails, state_seconds=5.0))) == 3630.0


def test_never_longer_than_the_session() -> None:
    young = replace(IDLE, backend_start=READ_AT - 30.0, registered=(NIGHTLY,), state_seconds=600)
    assert _seconds(HoldTracker(), _at(0, young)) == 30.0  # a clock step cannot make it older


def test_a_transaction_level_key_is_new_in_each_transaction() -> None:
    # A job that holds the nightly key and a row's key taken at transaction level.
    first = _busy(registered=(NIGHTLY, ROWS), advisory_entries=2, xact_start=READ_AT - 5.0)
    tracker = HoldTracker()
    assert _seconds(tracker, _at(0, first), "per_row") == 0.0
    assert _seconds(tracker, _at(10, first), "per_row") == 10.0  # the same transaction
    # Seen again in a newer transaction: taken anew there, held at most since it began.
    again = replace(first, xact_start=READ_AT + 18.0, state_seconds=0.5)
    assert _seconds(tracker, _at(20, again), "per_row") == 0.0
    idle = replace(again, state="idle in transaction", state_seconds=1.5)
    assert _seconds(tracker, _at(21, idle), "per_row") == 1.5  # since it went idle
    longer = replace(idle, state_seconds=5.0)  # "idle" since before its transaction: a clock
    assert _seconds(tracker, _at(21, longer), "per_row") == 3.0  # never before the transaction
    # A key of no known level seen in a newer transaction is held throughout (a session lock
    # across autocommit statements, the usual case).
    assert _seconds(tracker, _at(21, idle), "nightly") == 21.0


def test_a_level_bound_applies_inside_the_transaction_only() -> None:
    holder = Holder(1, STARTED, READ_AT - 5.0, "idle in transaction", 2.0, True)
    tracked = Hold(READ_AT - 600.0, True, READ_AT - 5.0)
    # In its transaction: never before it began, whatever the collections saw.
    assert hold_of(holder, READ_AT, "transaction", tracked, True).since == READ_AT - 5.0
    assert hold_of(holder, READ_AT, "session", tracked, True).since == READ_AT - 600.0
    outside = replace(holder, in_transaction=False, xact_start=None, state="idle")
    assert hold_of(outside, READ_AT, "transaction", tracked, True).since == READ_AT - 600.0


def test_a_reused_pid_starts_over_and_an_ended_hold_is_forgotten() -> None:
    tracker = HoldTracker()
    _seconds(tracker, _at(0, _busy()))
    assert _seconds(tracker, _at(60, _busy())) == 60.0
    # The same pid, a new backend: a new hold.
    assert _seconds(tracker, _at(61, _busy(backend_start=READ_AT + 60.5))) == 0.0
    # A look without it ends the hold: taken again, it starts over.
    tracker.update(_at(70, replace(_busy(), registered=(), advisory_entries=0)), REGISTRY)
    assert _seconds(tracker, _at(80, _busy())) == 0.0


def test_whether_the_exporter_saw_the_hold_begin() -> None:
    tracker = HoldTracker()
    first = tracker.update(_at(0, _busy()), REGISTRY)
    assert not first.by_key[1, STARTED, "nightly"].seen_begin  # held when it began to watch
    later = tracker.update(_at(10, _busy(), replace(_busy(), pid=2)), REGISTRY)
    assert not later.by_key[1, STARTED, "nightly"].seen_begin
    assert later.by_key[2, STARTED, "nightly"].seen_begin


def test_the_cap_keeps_the_holds_tracked_and_counts_the_others() -> None:
    tracker = HoldTracker(cap=4)  # two backends' holds: their own and the nightly key
    two = [_busy(pid=pid) for pid in (1, 2)]
    assert tracker.update(_at(0, *two), REGISTRY).untracked == 0
    more = [_busy(pid=pid) for pid in (3, 1, 2)]
    holds = tracker.update(_at(30, *more), REGISTRY)
    assert holds.untracked == 2  # backend 3's, while 1 and 2 keep theirs
    assert holds.by_key[1, STARTED, "nightly"].seconds(holds.now) == 30.0
    assert holds.by_key[3, STARTED, "nightly"].seconds(holds.now) == 0.0
    holds = tracker.update(_at(60, *more), REGISTRY)
    assert holds.by_key[3, STARTED, "nightly"].seconds(holds.now) == 0.0  # never tracked
    assert MAX_TRACKED == 50_000


def test_the_key_series_and_report_groups_use_the_hold() -> None:
    tracker = HoldTracker()
    tracker.update(_at(0, _busy()), REGISTRY)
    snapshot = _at(900, _busy(state_seconds=0.1))
    holds = tracker.update(snapshot, REGISTRY)
    assert key_activity(snapshot, REGISTRY, holds)["app", "nightly"].hold_max == 900.0
    samples = server_samples("main", snapshot, [], 100, REGISTRY, holds=holds).samples
    held = {s.labels: s.value for s in samples if s.name == "pg_advisory_key_hold_seconds"}
    assert held == {("main", "app", "nightly"): 900.0}
    untracked = [s.value for s in samples if s.name == "pg_advisory_exporter_untracked_holds"]
    assert untracked == [0]


def test_a_holder_of_long_lived_keys_only_is_no_leak() -> None:
    rails = BY_NAME["rails_migration"].config(key=42, databases=("app",))
    leader = KeyConfig(name="leader", key=43, long_lived=True)
    registry = Registry.resolve([leader, JOB], None, [rails])
    rails_use, leader_use, job_use = (KeyUse(i, 1, False) for i in (2, 0, 1))
    idle = replace(IDLE, advisory_entries=1, registered=(rails_use,))
    assert leak_exempt(idle, registry)
    both = replace(IDLE, advisory_entries=2, registered=(rails_use, leader_use))
    assert leak_exempt(both, registry)
    # A job's lock beside them is judged as always; so is a lock no entry names.
    assert not leak_exempt(replace(both, advisory_entries=3), registry)
    assert not leak_exempt(
        replace(IDLE, advisory_entries=2, registered=(rails_use, job_use)), registry
    )
    assert not leak_exempt(IDLE, registry)
    samples = server_samples("main", snapshot_of(idle, replace(IDLE, pid=2)), [], 100, registry)
    leaks = [s for s in samples.samples if s.name == "pg_advisory_idle_holder_max_seconds"]
    assert [s.value for s in leaks] == [600.0]  # the unnamed holder's, not the migration's
    idle_holders = [s for s in samples.samples if s.name == "pg_advisory_holders"]
    assert [s.value for s in idle_holders] == [2]  # both are holders all the same
