"""How check and /locks spell what they show, each thing one way: a moment as a Unix time."""

from __future__ import annotations

from datetime import UTC, datetime


def unix_time(value: float) -> str:
    """A Unix time as an ISO 8601 moment in UTC, to the second."""
    return datetime.fromtimestamp(value, UTC).isoformat(timespec="seconds")
