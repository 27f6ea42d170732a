"""Where collections run: a bounded pool of workers, urgent work first, and their deadlines."""

from __future__ import annotations

import contextlib
import enum
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class Priority(enum.IntEnum):
    """Which queued collection a free worker takes first."""

    URGENT = 0  # asked for by name (/probe): never waits behind a fleet
    ROUTINE = 1  # its last collection succeeded
    NEW = 2  # never collected yet
    SUSPECT = 3  # its last collection failed: it may well hang until its timeout again


@dataclass(eq=False)
class Task(Generic[T]):
    """One piece of work in the pool; `future` has its outcome."""

    run: Callable[[], T]
    future: Future[T] = field(default_factory=Future)
    taken: bool = False  # a worker has it (or it was cancelled): later queue entries are stale


class CollectionPool:
    """At most `workers` collections at once, by priority; sick targets cannot take them all.

    A /probe asks for one target and must not wait behind a /metrics scrape that queued a
    whole fleet: its collection is urgent, and so is a queued one that it joins, and an
    urgent collection gets a worker at once, beyond `workers` if all are busy. Servers that
    answered last time come first, then new ones, then those that failed (down, or hung
    until their connect timeout). New and failing servers together hold at most three
    quarters of the workers, failing ones at most half, so they never starve the healthy
    rest of a fleet.
    Workers start on demand and stay for the life of the pool.
    """

    def __init__(
        self, workers: int, name: str = "collect", clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._clock = clock  # for holds (tests step it)
        self._max_workers = workers
        # Servers not known to answer may hang until their connect timeout: together they
        # leave a quarter of the workers to the healthy ones, and failing ones take half.
        self._unproven_limit = max(1, workers - max(1, workers // 4))
        self._suspect_limit = max(1, workers // 2)
        self._running = dict.fromkeys(Priority, 0)
        self._name = name
        self._cond = threading.Condition()
        self._queue: list[tuple[Priority, int, Task[Any]]] = []
        self._order = itertools.count()
        self._workers = 0
        self._idle = 0
        self._holds: list[float] = []  # when each hold begins: from then no routine task starts
        self._shut_down = False

    def enqueue(self, tasks: Sequence[tuple[Task[Any], Priority]]) -> None:
        """Queue tasks made beforehand, all under one acquisition of the pool's lock.

        A scrape of a fleet starts thousands of collections: submitted one by one, each would
        wake a worker that takes the lock (and the GIL) back from the scrape, a convoy that
        was seen to stall the scrape for seconds.
        """
        with self._cond:
            if self._shut_down:
                raise RuntimeError("the collection pool is shut down")
            for task, priority in tasks:
                self._push(task, priority)

    def expedite(self, task: Task[Any]) -> None:
        """Make a task that no worker has taken yet urgent."""
        with self._cond:
            if not task.taken:
                self._push(task, Priority.URGENT)  # the older entry stays, and is skipped

    @contextlib.contextmanager
    def hold(self, start: float | None = None) -> Iterator[None]:
        """Start no routine task meanwhile, from `start` (monotonic clock) or from now.

        Rendering a scrape of a large fleet is Python work that competes for the GIL with
        every busy worker, and so is merely waking up at the scrape's deadline: a thread
        that wakes then can wait seconds for the GIL. A hold that begins shortly before the
        deadline is kept by the workers themselves, at each task they take, so that they
        are idle when the scrape needs the interpreter. Urgent tasks still start.
        """
        with self._cond:
            entry = start if start is not None else self._clock()
            self._holds.append(entry)
        try:
            yield
        finally:
            with self._cond:
                self._holds.remove(entry)
                self._cond.notify_all()

    def _held(self) -> bool:
        now = self._clock()
        return any(start <= now for start in self._holds)

    def shutdown(self) -> None:
        """Cancel what is queued; running tasks finish on their own."""
        with self._cond:
            self._shut_down = True
            for _, _, task in self._queue:
                if not task.taken:
                    task.taken = True
                    task.future.cancel()
            self._queue.clear()
            self._cond.notify_all()

    def _push(self, task: Task[Any], priority: Priority) -> None:
        heapq.heappush(self._queue, (priority, next(self._order), task))
        limit = self._max_workers * (2 if priority is Priority.URGENT else 1)
        if self._idle > 0:
            self._cond.notify()  # idle workers are alike: any one can take it, if any can
        elif self._workers < limit:
            self._workers += 1
            threading.Thread(
                target=self._work, name=f"{self._name}-{self._workers}", daemon=True
            ).start()

    def _take(self) -> tuple[Task[Any], Priority] | None:
        """The next task a worker may start now, if any; with the lock held."""
        while self._queue:
            priority, _, task = self._queue[0]
            if task.taken:
                heapq.heappop(self._queue)
                continue
            if priority is not Priority.URGENT and (
                self._held() or self._routine_running() >= self._max_workers
            ):
                return None
            if priority is Priority.SUSPECT and self._running[priority] >= self._suspect_limit:
                return None
            unproven = self._running[Priority.NEW] + self._running[Priority.SUSPECT]
            if priority >= Priority.NEW and unproven >= self._unproven_limit:
                return None
            heapq.heappop(self._queue)
            task.taken = True
            self._running[priority] += 1
            return task, priority
        return None

    def _next(self) -> tuple[Task[Any], Priority] | None:
        with self._cond:
            while (taken := self._take()) is None:
                if self._shut_down:
                    return None
                self._idle += 1
                self._cond.wait()
                self._idle -= 1
            return taken

    def _work(self) -> None:
        while (taken := self._next()) is not None:
            task, priority = taken
            if task.future.set_running_or_notify_cancel():
                try:
                    result = task.run()
                except BaseException as exc:
                    task.future.set_exception(exc)
                else:
                    task.future.set_result(result)
            with self._cond:
                self._running[priority] -= 1
                self._cond.notify()  # a place is free: a waiting worker may take it

    def _routine_running(self) -> int:
        return sum(self._running.values()) - self._running[Priority.URGENT]


@dataclass(eq=False)
class Alarm:
    when: float  # monotonic clock
    callback: Callable[[], None]
    disarmed: bool = False


class Watchdog:
    """One thread that calls each armed callback at its time, unless it was disarmed first.

    It bounds what no socket option can: a backend that is stopped, or a proxy that hangs,
    while the kernel still acknowledges every packet. Callbacks must return quickly.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._alarms: list[tuple[float, int, Alarm]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None

    def arm(self, delay: float, callback: Callable[[], None]) -> Alarm:
        alarm = Alarm(time.monotonic() + delay, callback)
        with self._cond:
            heapq.heappush(self._alarms, (alarm.when, next(self._order), alarm))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="watchdog", daemon=True)
                self._thread.start()
            self._cond.notify()
        return alarm

    def disarm(self, alarm: Alarm) -> None:
        with self._cond:
            alarm.disarmed = True

    def _due(self) -> Alarm:
        with self._cond:
            while True:
                if self._alarms:
                    when, _, alarm = self._alarms[0]
                    if alarm.disarmed:
                        heapq.heappop(self._alarms)
                        continue
                    wait = when - time.monotonic()
                    if wait <= 0:
                        heapq.heappop(self._alarms)
                        return alarm
                    self._cond.wait(wait)
                else:
                    self._cond.wait()

    def _run(self) -> None:
        while True:
            alarm = self._due()
            try:
                alarm.callback()
            except Exception:
                log.exception("a deadline callback failed")
