"""Work that many callers ask for, done once for them all: the last outcome while it is fresh,
else the run under way, which any number of callers join; and waiting for a run no longer
than it has been waited for already."""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Turn(Generic[T]):
    """The caller's turn to do the work: it must complete `future`, on which every caller
    who asks meanwhile waits."""

    future: Future[T]


class Shared(Generic[T]):
    """The outcome of one piece of work (a collection, a read of the locks, of a pooler's
    console) for everyone who asks: the last one within `fresh_for` of when it ended (or
    while `fresh` says so), else the run under way, else a new run, the asker's turn.

    So any number of scrapes, people and scripts cause at most one run at a time, and one per
    `fresh_for`. The clock is injectable: tests step it instead of sleeping.
    """

    def __init__(self, fresh_for: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._fresh_for = fresh_for
        self._clock = clock
        self._lock = threading.Lock()
        self._running: Future[T] | None = None
        self._started = 0.0
        self._last: T | None = None
        self._ended = 0.0

    def ask(self, fresh: Callable[[T], bool] | None = None) -> T | Future[T] | Turn[T]:
        """The last outcome if it is fresh (ended within `fresh_for`, or `fresh` says so);
        the run under way; or the caller's turn to start one."""
        with self._lock:
            if self._running is not None:
                return self._running
            last = self._last
            if last is not None and (
                self._clock() - self._ended < self._fresh_for or (fresh is not None and fresh(last))
            ):
                return last
            running = self._running = Future()
            self._started = self._clock()
        running.add_done_callback(self._ended_with)
        return Turn(running)

    def last(self) -> T | None:
        with self._lock:
            return self._last

    def started(self) -> float:
        """When the run under way (or the last one) started, on the clock."""
        with self._lock:
            return self._started

    def _ended_with(self, future: Future[T]) -> None:
        with self._lock:
            if self._running is future:
                self._running = None
            if not future.cancelled() and future.exception() is None:
                self._last, self._ended = future.result(), self._clock()


class Patience(Generic[T]):
    """Waits for runs (a pooler's read, a host name's resolution) at most once each: a run
    that one caller stopped waiting for is only looked at by the next ones, so a peer that
    hangs costs the first of them the wait, and the rest nothing until it ends."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waited_out: weakref.WeakSet[Future[T]] = weakref.WeakSet()

    def wait(self, future: Future[T], seconds: float) -> T | None:
        """The run's outcome (or what it raised), or None if it has not ended in time."""
        with self._lock:
            seconds = 0.0 if future in self._waited_out else max(seconds, 0.0)
        try:
            return future.result(timeout=seconds)
        except FutureTimeout:
            with self._lock:
                self._waited_out.add(future)
            return None
