"""The prometheus_client collector that gathers the targets' series for a scrape."""

from __future__ import annotations

import platform
import time
from collections.abc import Callable, Iterable, Sequence
from contextvars import ContextVar

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from . import __version__
from .metrics import Sample, families
from .target import Target

# Set by the HTTP layer from X-Prometheus-Scrape-Timeout-Seconds, so that a slow server is
# reported down before Prometheus gives up on the whole scrape.
scrape_timeout: ContextVar[float | None] = ContextVar("scrape_timeout", default=None)

_TIMEOUT_MARGIN = 0.5  # seconds left for rendering and sending the answer


def target_samples(targets: Sequence[Target]) -> list[Sample]:
    """Start (or join) a collection on every target at once, then wait for each in turn.

    Each target waits at most its own scrape_wait (or the scrape's timeout) counted from
    the start, so a slow target never delays the others beyond that.
    """
    started = time.monotonic()
    pending = [(target, target.begin()) for target in targets]
    limit = scrape_timeout.get()
    samples: list[Sample] = []
    for target, collection in pending:
        wait = target.settings.scrape_wait
        if limit is not None:
            wait = min(wait, limit - _TIMEOUT_MARGIN)
        samples += target.samples(collection, started + wait - time.monotonic())
    return samples


class ExporterCollector(Collector):
    """Every configured target, plus the exporter's build information: /metrics."""

    def __init__(self, targets: Callable[[], Sequence[Target]]) -> None:
        self._targets = targets  # read at each scrape: a reload may change them

    def describe(self) -> Iterable[Metric]:
        return ()  # nothing to collect at registration time

    def collect(self) -> Iterable[Metric]:
        build = (__version__, platform.python_version())
        samples = [Sample("pg_advisory_exporter_build_info", build, 1)]
        return families(samples + target_samples(self._targets()))


class ProbeCollector(Collector):
    """One target's series: /probe?target=NAME."""

    def __init__(self, target: Target) -> None:
        self._target = target

    def describe(self) -> Iterable[Metric]:
        return ()

    def collect(self) -> Iterable[Metric]:
        return families(target_samples([self._target]))
