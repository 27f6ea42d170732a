"""The answers of /locks: one read of a target shared by every request that comes while it is
fresh, and what each request renders of it made once per answer."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import TypeVar, cast

from pg_advisory_exporter.collect.connection import Unanswered
from pg_advisory_exporter.collect.holds import NO_HOLDS, Holds
from pg_advisory_exporter.collect.pg_stat_statements import StatementsRead
from pg_advisory_exporter.collect.scheduling import Watchdog
from pg_advisory_exporter.collect.server import Server
from pg_advisory_exporter.config.settings import TargetSettings
from pg_advisory_exporter.sharing import Shared, Turn

from .model import Forensics
from .read import answer_kept

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class Answer:
    """One read's outcome: the forensics, or why there are none."""

    forensics: Forensics | None
    error: str | None
    finished: float  # monotonic clock
    # What the requests that get this answer make of it (its /locks page in each format),
    # made by the first that asks and kept with the answer for the others: a hundred viewers
    # of one read cost one render, not a hundred, in time and in memory.
    _made: dict[Hashable, object] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _making: threading.Lock = field(
        default_factory=threading.Lock, init=False, repr=False, compare=False
    )

    def made(self, key: Hashable, make: Callable[[Answer], T]) -> T:
        """make(self), once per key: the requests that ask meanwhile wait for it."""
        with self._making:
            if key not in self._made:
                self._made[key] = make(self)
            return cast(T, self._made[key])


class OnDemand:
    """One target's answers: a request within `reuse_for` of the last answer gets it, and
    requests that arrive while a read runs wait for it (at most `wait_at_most`), so that any
    number of people and scripts cause at most one read of pg_locks per `reuse_for`. The
    read runs in the caller's thread (an HTTP request's), never on the collection pool."""

    def __init__(
        self,
        read: Callable[[], Forensics],
        reuse_for: float,
        wait_at_most: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._read = read
        self._answers: Shared[Answer] = Shared(reuse_for, clock)
        self._wait_at_most = wait_at_most  # for a read that somebody else runs
        self._clock = clock

    def get(self) -> tuple[Answer, float]:
        """An answer and its age in seconds."""
        asked = self._answers.ask()
        if isinstance(asked, Turn):
            try:
                answer = self._answer()
            except BaseException as exc:  # the read's waiters are never left waiting
                asked.future.set_exception(exc)
                raise
            asked.future.set_result(answer)
            return answer, 0.0
        if isinstance(asked, Future):
            try:
                answer = asked.result(timeout=self._wait_at_most)
            except FutureTimeout:
                gave_up = "another read of this target is still running; try again later"
                return Answer(None, gave_up, self._clock()), 0.0
        else:
            answer = asked
        return answer, self._clock() - answer.finished

    def _answer(self) -> Answer:
        try:
            forensics: Forensics | None = self._read()
            error = None
        except Unanswered as exc:
            forensics, error = None, str(exc)
        except Exception:  # a bug must not take down the exporter
            log.exception("reading the locks failed unexpectedly")
            forensics, error = None, "internal error, see the exporter's log"
        return Answer(forensics, error, self._clock())


def on_demand(
    target: TargetSettings,
    server: Server,
    watchdog: Watchdog,
    statements: Callable[[], StatementsRead | None] = lambda: None,
    holds: Callable[[], Holds] = lambda: NO_HOLDS,
) -> OnDemand:
    """The answers of one target as its configuration says: reused for locks_page.reuse_for,
    read on the connection its `server` keeps (read.answer_kept). Each carries what
    `statements` gives then: the daemon's last read of pg_stat_statements (a page view never
    reads it: its texts can be megabytes); and its holds are bounded by what `holds` gives:
    those of the server's last collection."""
    # A read and its poolers' reads end within one deadline (read.answer_kept); the wait allows
    # twice that and a second, so that a busy machine's late thread is not taken for a hang.
    wait = 2 * target.collection.collection_deadline + 1.0

    def read() -> Forensics:
        found = answer_kept(target, server, watchdog, holds)
        return dataclasses.replace(found, statements=statements())

    return OnDemand(read, target.locks_page.reuse_for, wait)
