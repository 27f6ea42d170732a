"""Building blocks shared by the configuration models and the alert thresholds: strict models,
durations and errors that say where they are."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

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


def format_duration(seconds: float, resolution: float = 0.001) -> str:
    """Seconds as Prometheus writes a duration (its model.Duration): 900 -> "15m",
    90 -> "1m30s", 0.5 -> "500ms", 0 -> "0s"; parse_duration reads it back.

    Rounded first to `resolution` seconds, a whole number of milliseconds: a measured age
    reads better as "1h2m5s" than as "1h2m5s417ms".
    """
    step = max(round(resolution * 1000), 1)
    milliseconds = round(seconds * 1000 / step) * step
    if milliseconds == 0:
        return "0s"
    parts = []
    for unit in ("d", "h", "m", "s", "ms"):
        count, milliseconds = divmod(milliseconds, round(_DURATION_UNITS[unit] * 1000))
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)


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
    """Where in a document a validation error is: "targets[0].collection.min_interval"."""
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or "(top level)"


def describe_error(error: Mapping[str, Any]) -> str:
    """What is wrong, from one of pydantic's errors, in the words of a configuration."""
    if error["type"] == "extra_forbidden":
        return "unknown field"
    if error["type"] == "missing":
        return "required field is missing"
    return str(error["msg"]).removeprefix("Value error, ")


class Strict(BaseModel):
    """A configuration block: unknown fields are errors, values never change after loading."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def port_number(text: str, lowest: int = 1) -> int:
    """A TCP port written as decimal digits, from `lowest` (0 where it picks a free port, as
    a listen address's may) to 65535; ValueError says which range."""
    if not re.fullmatch(r"[0-9]{1,5}", text) or not lowest <= int(text) <= 65535:
        raise ValueError(f"the port must be a number from {lowest} to 65535")
    return int(text)
