"""Durations as Prometheus writes them (its model.ParseDuration and Duration.String()), in
the configuration, the alert thresholds and the chart's values; and as numbers of seconds."""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator, Field

# Prometheus' units (its model.ParseDuration and Duration.String()) in milliseconds, largest
# first: a duration names each at most once, in this order, with a whole number of it. A year
# is 365 days and a week 7, as there.
_UNITS = {
    "y": 365 * 86_400_000,
    "w": 7 * 86_400_000,
    "d": 86_400_000,
    "h": 3_600_000,
    "m": 60_000,
    "s": 1_000,
    "ms": 1,
}
# Prometheus writes a year or a week only for a whole number of them ("90d", not "12w6d").
_WHOLE_ONLY = frozenset({"y", "w"})
# Its longest duration: Go's time.Duration counts nanoseconds in an int64.
_LONGEST_MS = (2**63 - 1) // 1_000_000
_UNIT_PARTS = "".join(f"([0-9]+{unit})?" for unit in _UNITS)
_PROMETHEUS_DURATION = re.compile(_UNIT_PARTS)
# What parse_duration takes as text, for JSON schemas (the Helm chart's): a number of seconds,
# or Prometheus' form. Its second branch also matches "", which a schema refuses with
# minLength 1. No lookahead or named group: Helm's validator has Go's regular expressions.
DURATION_PATTERN = rf"^([0-9]+(\.[0-9]+)?|{_UNIT_PARTS})$"
# A number and the letters after it, to say what is wrong with a duration that is not one.
_TOKEN = re.compile(r"([0-9]+)(\.[0-9]*)?([^0-9.]*)")
_EXAMPLES = "use seconds or a form like 500ms, 5s, 1m30s"


def prometheus_milliseconds(text: str) -> int:
    """Milliseconds from a duration in Prometheus' grammar ("1h30m", "1w", "0"); ValueError,
    naming the problem, for what Prometheus refuses."""
    if text == "0":  # the one number Prometheus takes without a unit
        return 0
    match = _PROMETHEUS_DURATION.fullmatch(text) if text else None
    if match is None:
        raise ValueError(_problem(text))
    milliseconds = sum(
        int(part.removesuffix(unit)) * size
        for part, (unit, size) in zip(match.groups(), _UNITS.items(), strict=True)
        if part
    )
    if milliseconds > _LONGEST_MS:
        raise ValueError(
            f"{text!r} is not a duration: longer than Prometheus' longest, "
            f"{format_duration(_LONGEST_MS / 1000)} (about 292 years)"
        )
    return milliseconds


def _problem(text: str) -> str:
    """Why `text` is not a duration in Prometheus' grammar, as the error says it."""
    refused = f"{text!r} is not a duration"
    if text[:1] in ("-", "+"):
        return f"{refused}: Prometheus' durations have no sign"
    order = list(_UNITS)
    last = None
    for number, fraction, unit in _tokens(text):
        if unit == "":
            return f"{refused}: {number}{fraction} has no unit ({', '.join(order)})"
        if unit not in _UNITS:
            return f"{refused}: unknown unit {unit!r} (Prometheus has {', '.join(order)})"
        if fraction:
            return f"{refused}: {_whole_numbers_only(number + fraction, unit)}"
        if last is not None and order.index(unit) <= order.index(last):
            where = "twice" if unit == last else f"after {last}"
            return (
                f"{refused}: {unit} {where} (the units go from the largest to the smallest, "
                f"each at most once: {' '.join(order)})"
            )
        last = unit
    return f"{refused} ({_EXAMPLES})"


def _tokens(text: str) -> list[tuple[str, str, str]]:
    """The (number, fraction, unit) parts of `text`; none if anything else is in it."""
    tokens = []
    position = 0
    while position < len(text):
        token = _TOKEN.match(text, position)
        if token is None:
            return []
        number, fraction, unit = token.groups()
        tokens.append((number, fraction or "", unit))
        position = token.end()
    return tokens


def _whole_numbers_only(number: str, unit: str) -> str:
    """The problem with a fraction of a unit, and how Prometheus writes it where it can."""
    problem = f"Prometheus takes a whole number of each unit, not {number}{unit}"
    milliseconds = Decimal(number) * _UNITS[unit]
    if milliseconds == milliseconds.to_integral_value() and milliseconds > 0:
        return f"{problem} (write {format_duration(int(milliseconds) / 1000)})"
    return problem


def parse_duration(value: object) -> object:
    """Seconds from a number, or from text: a number of seconds ("30", "1.5") or a duration in
    Prometheus' grammar ("500ms", "1m30s", "1w")."""
    if isinstance(value, bool):  # YAML's true would otherwise pass as 1 second
        raise ValueError(f"{value!r} is not a duration ({_EXAMPLES})")
    if not isinstance(value, str):
        return value
    text = value.strip()
    try:  # seconds as a number: the exporter's own form, which Prometheus does not take
        return float(text)
    except ValueError:
        pass
    return prometheus_milliseconds(text) / 1000


# The mark of a duration: a field's metadata holds it, so its default can be shown as one.
PARSE_DURATION = BeforeValidator(parse_duration)
Duration = Annotated[float, PARSE_DURATION, Field(gt=0, allow_inf_nan=False)]


def format_duration(seconds: float, resolution: float = 0.001) -> str:
    """Seconds as Prometheus writes a duration (its model.Duration.String()): 900 -> "15m",
    90 -> "1m30s", 1.5 -> "1s500ms", 14 days -> "2w", 0 -> "0s"; parse_duration reads it back.

    Rounded first to `resolution` seconds, a whole number of milliseconds: a measured age
    reads better as "1h2m5s" than as "1h2m5s417ms".
    """
    step = max(round(resolution * 1000), 1)
    milliseconds = round(seconds * 1000 / step) * step
    if milliseconds == 0:
        return "0s"
    sign = "-" if milliseconds < 0 else ""
    left = abs(milliseconds)
    parts = []
    for unit, size in _UNITS.items():
        if unit in _WHOLE_ONLY and left % size:
            continue
        count, left = divmod(left, size)
        if count:
            parts.append(f"{count}{unit}")
    return sign + "".join(parts)


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
