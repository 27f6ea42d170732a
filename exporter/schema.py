"""Building blocks shared by the configuration models: strict models and durations."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Annotated

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(value: object) -> object:
    """Seconds from a number or a Prometheus-style duration such as "500ms", "5s" or "1m30s"."""
    if isinstance(value, bool):  # YAML's true would otherwise pass as 1 second
        raise ValueError(
            f"{value!r} is not a duration (use seconds or a form like 500ms, 5s, 1m30s)"
        )
    if not isinstance(value, str):
        return value
    text = value.strip()
    parts = list(_DURATION_PART.finditer(text))
    if not parts or "".join(p.group(0) for p in parts) != text:
        try:
            return float(text)
        except ValueError:
            raise ValueError(
                f"{value!r} is not a duration (use seconds or a form like 500ms, 5s, 1m30s)"
            ) from None
    return sum(float(p.group(1)) * _DURATION_UNITS[p.group(2)] for p in parts)


# The mark of a duration: a field's metadata holds it, so its default can be shown as one.
PARSE_DURATION = BeforeValidator(parse_duration)
Duration = Annotated[float, PARSE_DURATION, Field(gt=0, allow_inf_nan=False)]


def format_duration(seconds: float) -> str:
    """A bound as it would be written: "1ms", "10m", "1h"."""
    for unit in ("d", "h", "m", "s", "ms"):
        count = seconds / _DURATION_UNITS[unit]
        if count >= 1 and count.is_integer():
            return f"{int(count)}{unit}"
    return f"{seconds}s"


def duration_within(least: float, most: float) -> AfterValidator:
    """Refuse a parsed duration outside [least, most] seconds, or not finite (inf, nan)."""

    def check(seconds: float) -> float:
        if not math.isfinite(seconds):
            raise ValueError(f"{seconds} is not a finite duration")
        if seconds < least:
            raise ValueError(f"must be at least {format_duration(least)}")
        if seconds > most:
            raise ValueError(f"must be at most {format_duration(most)}")
        return seconds

    return AfterValidator(check)


class ConfigError(Exception):
    """A configuration that cannot be used; the message names the source and the problem."""


def location(loc: Sequence[int | str]) -> str:
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or "(top level)"


class Strict(BaseModel):
    """A configuration block: unknown fields are errors, values never change after loading."""

    model_config = ConfigDict(extra="forbid", frozen=True)
