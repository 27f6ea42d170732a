"""The prometheus_client collector that gathers every target's series for a scrape."""

from __future__ import annotations

import platform
import time
from collections.abc import Iterable, Sequence
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


class ExporterCollector(Collector):
    """Starts (or joins) a collection on every target at once, then waits for all of them."""

    def __init__(self, targets: Sequence[Target]) -> None:
        self.targets = targets

    def describe(self) -> Iterable[Metric]:
        return ()  # nothing to collect at registration time

    def collect(self) -> Iterable[Metric]:
        started = time.monotonic()
        pending = [(target, target.begin()) for target in self.targets]
        limit = scrape_timeout.get()
        samples = [
            Sample(
                "pg_advisory_exporter_build_info",
                (__version__, platform.python_version()),
                1,
            )
        ]
        for target, collection in pending:
            wait = target.settings.scrape_wait
            if limit is not None:
                wait = min(wait, limit - _TIMEOUT_MARGIN)
            samples += target.samples(collection, started + wait - time.monotonic())
        return families(samples)
