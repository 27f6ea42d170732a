"""The prometheus_client collector that gathers the targets' series for a scrape."""

from __future__ import annotations

import logging
import platform
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent import futures
from concurrent.futures import Future
from contextlib import ExitStack, suppress
from contextvars import ContextVar
from dataclasses import dataclass, field

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from pg_advisory_exporter import __version__
from pg_advisory_exporter.collect.collection import Collection
from pg_advisory_exporter.collect.scheduling import CollectionPool, Priority, Task
from pg_advisory_exporter.collect.target import Target
from pg_advisory_exporter.fleet.sharding import Shard
from pg_advisory_exporter.metrics import Sample, build_info, families

log = logging.getLogger(__name__)


@dataclass
class ScrapeContext:
    """What the HTTP layer tells the collectors about the scrape it serves."""

    # From X-Prometheus-Scrape-Timeout-Seconds, so that a slow server is reported down
    # before Prometheus gives up on the whole scrape.
    timeout: float | None = None
    # Closed once the answer is rendered; what the collection enters here lasts until then.
    rendering: ExitStack = field(default_factory=ExitStack)


current_scrape: ContextVar[ScrapeContext | None] = ContextVar("current_scrape", default=None)

# Seconds a scrape keeps for what follows its wait: waking up, mapping, rendering, sending. A
# fixed part, plus the larger of 100µs per target (10,000 targets take about 0.3s to answer
# on an idle core) and twice the longest of the last ten answers, timed from the planned end
# of the wait so that a late wake-up counts too.
_TIMEOUT_MARGIN = 0.5
_MARGIN_PER_TARGET = 100e-6
_ANSWERS_REMEMBERED = 10
_LATE_NAMES = 10  # late targets named in the log line
# Seconds before the end of a scrape's wait from which no routine collection starts; at most
# a quarter of the wait.
_HOLD_LEAD = 0.5


class AnswerTimer:
    """How long the part of a scrape after the wait took lately, for one endpoint."""

    def __init__(self) -> None:
        self._recent: deque[float] = deque(maxlen=_ANSWERS_REMEMBERED)

    def margin(self, targets: int) -> float:
        longest = max(self._recent, default=0.0)
        return _TIMEOUT_MARGIN + max(2 * longest, targets * _MARGIN_PER_TARGET)

    def start(self, scrape: ScrapeContext, since: float) -> None:
        """Time from `since` (the planned end of the wait) until the answer is rendered."""
        scrape.rendering.callback(self._record, since)

    def _record(self, since: float) -> None:
        self._recent.append(time.monotonic() - since)


def shard_samples(shard: Shard) -> list[Sample]:
    return [
        Sample("pg_advisory_exporter_shard_index", (), shard.index),
        Sample("pg_advisory_exporter_shards", (), shard.total),
    ]


def target_samples(
    targets: Sequence[Target], pool: CollectionPool, timer: AnswerTimer, urgent: bool = False
) -> list[Sample]:
    """Start (or join) a collection on every target at once, wait, then map what came.

    Each target is waited for at most its own collection_deadline (or the scrape's timeout, less the
    margin for answering) counted from the start, so a slow target never delays the others
    beyond that. The waiting holds no lock and no GIL; only when it is over are the series
    built, with the pool held so that no routine collection competes with the answer.
    """
    started = time.monotonic()
    queue: list[tuple[Task[Collection], Priority]] = []
    begun = [(target, target.begin(urgent, queue)) for target in targets]
    pool.enqueue(queue)
    scrape = current_scrape.get() or ScrapeContext()
    margin = timer.margin(len(targets))
    waits: list[tuple[float, Future[Collection]]] = []
    for target, pending in begun:
        if isinstance(pending, Future):
            wait = target.settings.collection_deadline
            if scrape.timeout is not None:
                wait = min(wait, scrape.timeout - margin)
            waits.append((started + wait, pending))
    waits.sort(key=lambda item: item[0])
    # Workers go idle just before the end of the wait, so that this thread gets the GIL at
    # once when it wakes; what a worker would start then could not finish in time anyway.
    last = waits[-1][0] if waits else started
    lead = min(_HOLD_LEAD, (last - started) / 4)  # a short scrape keeps most of its wait
    scrape.rendering.enter_context(pool.hold(start=last - lead))
    # One future at a time, against absolute deadlines: a wait on them all at once would
    # first install itself on each, which under a busy GIL can outlast the deadline.
    for deadline, pending in waits:
        remaining = deadline - time.monotonic()
        if remaining > 0 and not pending.done():
            with suppress(futures.TimeoutError, futures.CancelledError):
                pending.exception(timeout=remaining)
    timer.start(scrape, since=last)
    samples: list[Sample] = []
    late: list[str] = []
    for target, pending in begun:
        collection = _outcome(pending)
        if collection is None:
            late.append(target.name)
            collection = target.late()
        samples += target.series(collection)
    if late:  # one line per scrape, however large the fleet
        log.warning(
            "collections are slower than the scrape allows; reporting those targets down",
            extra={
                "targets_late": len(late),
                "targets": ",".join(late[:_LATE_NAMES])
                + (",..." if len(late) > _LATE_NAMES else ""),
            },
        )
    return samples


def _outcome(pending: Collection | Future[Collection]) -> Collection | None:
    """The collection, if it is done; None while it runs (or if the pool cancelled it)."""
    if not isinstance(pending, Future):
        return pending
    if not pending.done() or pending.cancelled():
        return None
    return pending.result()


class ExporterCollector(Collector):
    """Every configured target of the shard, plus the exporter's build information, its
    shard, the reloads of its configuration file and, with a web configuration, its series
    (the last change, the rate limit): /metrics."""

    def __init__(
        self,
        targets: Callable[[], Sequence[Target]],
        pool: CollectionPool,
        shard: Callable[[], Shard],
        web_samples: Callable[[], list[Sample]] | None = None,
        config_samples: Callable[[], list[Sample]] | None = None,
    ) -> None:
        self._targets = targets  # read at each scrape: a reload may change them
        self._pool = pool
        self._shard = shard  # the same
        self._web_samples = web_samples  # None: no web configuration file
        self._config_samples = config_samples  # None: no configuration file
        self._timer = AnswerTimer()

    def describe(self) -> Iterable[Metric]:
        return ()  # nothing to collect at registration time

    def collect(self) -> Iterable[Metric]:
        samples = [build_info(__version__, platform.python_version())]
        samples += shard_samples(self._shard())
        if self._config_samples is not None:
            samples += self._config_samples()
        if self._web_samples is not None:
            samples += self._web_samples()
        return families(samples + target_samples(self._targets(), self._pool, self._timer))


class ProbeCollector(Collector):
    """One target's series: /probe?target=NAME."""

    def __init__(self, target: Target, pool: CollectionPool) -> None:
        self._target = target
        self._pool = pool
        self._timer = AnswerTimer()  # one target: the first estimate is all it needs

    def describe(self) -> Iterable[Metric]:
        return ()

    def collect(self) -> Iterable[Metric]:
        # One target, asked for by name: it goes ahead of a fleet's routine collections.
        return families(target_samples([self._target], self._pool, self._timer, urgent=True))
