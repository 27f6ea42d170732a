"""The collection pool's order and limits, and the watchdog's deadlines (no server needed)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from functools import partial
from typing import TypeVar

from support import Clock

from pg_advisory_exporter.collect.scheduling import CollectionPool, Priority, Task, Watchdog

WAIT = 5.0  # seconds any test waits for a thread at most

T = TypeVar("T")


def _submit(pool: CollectionPool, run: Callable[[], T], priority: Priority) -> Task[T]:
    task = Task(run)
    pool.enqueue([(task, priority)])
    return task


def _blocked(pool: CollectionPool, priority: Priority, count: int) -> threading.Event:
    """Occupy `count` workers until the returned event is set."""
    release = threading.Event()
    started = threading.Semaphore(0)

    def block() -> None:
        started.release()
        release.wait(WAIT)

    for _ in range(count):
        _submit(pool, block, priority)
    for _ in range(count):
        assert started.acquire(timeout=WAIT)
    return release


def test_urgent_work_gets_a_worker_even_when_all_are_busy() -> None:
    pool = CollectionPool(workers=2)
    release = _blocked(pool, Priority.ROUTINE, 2)
    routine = _submit(pool, lambda: "routine", Priority.ROUTINE)
    urgent = _submit(pool, lambda: "urgent", Priority.URGENT)
    assert urgent.future.result(timeout=WAIT) == "urgent"
    assert not routine.future.done()  # it waits for one of the two workers
    release.set()
    assert routine.future.result(timeout=WAIT) == "routine"
    pool.shutdown()


def test_order_is_urgent_then_healthy_then_new_then_failed() -> None:
    pool = CollectionPool(workers=1)
    release = _blocked(pool, Priority.ROUTINE, 1)
    ran: list[str] = []
    tasks = [
        _submit(pool, lambda name=name: ran.append(name), priority)  # type: ignore[misc]
        for name, priority in [
            ("failed", Priority.SUSPECT),
            ("new", Priority.NEW),
            ("healthy", Priority.ROUTINE),
        ]
    ]
    pool.expedite(tasks[0])  # a /probe joined the failed target's queued collection
    release.set()
    for task in tasks:
        task.future.result(timeout=WAIT)
    assert ran == ["failed", "healthy", "new"]
    pool.shutdown()


def test_failing_targets_hold_at_most_half_of_the_workers() -> None:
    pool = CollectionPool(workers=4)
    release = _blocked(pool, Priority.SUSPECT, 2)  # two hung servers
    third = _submit(pool, lambda: "suspect", Priority.SUSPECT)
    healthy = [_submit(pool, lambda: "healthy", Priority.ROUTINE) for _ in range(2)]
    for task in healthy:
        assert task.future.result(timeout=WAIT) == "healthy"
    time.sleep(0.1)
    assert not third.future.done()  # a worker is free, but not for a third failing server
    release.set()
    assert third.future.result(timeout=WAIT) == "suspect"
    pool.shutdown()


def test_a_hold_stops_routine_work_but_not_urgent_work() -> None:
    pool = CollectionPool(workers=2)
    with pool.hold():
        routine = _submit(pool, lambda: "routine", Priority.ROUTINE)
        urgent = _submit(pool, lambda: "urgent", Priority.URGENT)
        assert urgent.future.result(timeout=WAIT) == "urgent"
        time.sleep(0.1)
        assert not routine.future.done()
    assert routine.future.result(timeout=WAIT) == "routine"
    pool.shutdown()


def test_shutdown_cancels_what_is_queued() -> None:
    pool = CollectionPool(workers=1)
    release = _blocked(pool, Priority.ROUTINE, 1)
    queued = _submit(pool, lambda: "never", Priority.ROUTINE)
    pool.shutdown()
    release.set()
    assert queued.future.cancelled()


def test_the_watchdog_calls_at_the_deadline_unless_disarmed() -> None:
    watchdog = Watchdog()
    fired: list[tuple[str, float]] = []
    done = threading.Event()
    started = time.monotonic()

    def record(name: str) -> None:
        fired.append((name, time.monotonic()))
        if name == "late":
            done.set()

    watchdog.arm(0.3, partial(record, "late"))
    watchdog.arm(0.1, partial(record, "early"))
    watchdog.disarm(watchdog.arm(0.2, partial(record, "disarmed")))
    assert done.wait(WAIT)
    assert [name for name, _ in fired] == ["early", "late"]
    assert fired[0][1] - started >= 0.1
    assert fired[1][1] - started >= 0.3


def test_a_hold_can_begin_later_and_the_workers_keep_it_themselves() -> None:
    clock = Clock()
    pool = CollectionPool(workers=1, clock=clock)
    with pool.hold(start=clock.now + 0.3):
        before = _submit(pool, lambda: "before", Priority.ROUTINE)
        assert before.future.result(timeout=WAIT) == "before"
        clock.now += 0.3  # nobody wakes at the hold's start: the worker checks it itself
        after = _submit(pool, lambda: "after", Priority.ROUTINE)
        time.sleep(0.1)  # time for a worker to take it, were it free to
        assert not after.future.done()
    assert after.future.result(timeout=WAIT) == "after"
    pool.shutdown()


def test_new_servers_leave_a_quarter_of_the_workers_to_healthy_ones() -> None:
    pool = CollectionPool(workers=4)
    release = _blocked(pool, Priority.NEW, 3)  # three new servers that hang
    fourth = _submit(pool, lambda: "new", Priority.NEW)
    healthy = _submit(pool, lambda: "healthy", Priority.ROUTINE)
    assert healthy.future.result(timeout=WAIT) == "healthy"
    time.sleep(0.1)
    assert not fourth.future.done()
    release.set()
    assert fourth.future.result(timeout=WAIT) == "new"
    pool.shutdown()
