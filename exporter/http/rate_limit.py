"""The web configuration's `rate_limit`: one token bucket for every request the exporter
answers, as exporter-toolkit's `rate.NewLimiter(rate.Every(interval), burst)`.

A full bucket holds `burst` tokens and starts full; a token comes back every `interval`; a
request takes one, or is refused while there is none. It is one bucket for the whole
exporter, not one per client, as in Go: it caps the work the exporter does for its clients,
whoever they are.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class TokenBucket:
    """golang.org/x/time/rate's Limiter.Allow(), with the wait until the next token."""

    def __init__(
        self, interval: float, burst: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        assert interval > 0, "web_config refuses any other"
        assert burst >= 1, "web_config refuses any other"
        self.interval = interval
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._at = clock()
        self._lock = threading.Lock()

    def _refill(self) -> float:
        now = self._clock()
        # A clock that went back (it is monotonic; a test's may) gives nothing back.
        elapsed = max(0.0, now - self._at)
        self._tokens = min(float(self.burst), self._tokens + elapsed / self.interval)
        self._at = now
        return self._tokens

    def take(self) -> float | None:
        """Take a token: None if there was one, else the seconds until there is."""
        with self._lock:
            tokens = self._refill()
            if tokens >= 1:
                self._tokens = tokens - 1
                return None
            return (1 - tokens) * self.interval

    def retuned(self, interval: float, burst: int) -> TokenBucket:
        """This bucket under a reloaded limit: the tokens it holds now (at most the new
        burst) carry over, so that a reload hands no client a fresh burst; the same bucket
        if the limit is the same."""
        if (interval, burst) == (self.interval, self.burst):
            return self
        bucket = TokenBucket(interval, burst, self._clock)
        with self._lock:
            bucket._tokens = min(float(burst), self._refill())
        return bucket
