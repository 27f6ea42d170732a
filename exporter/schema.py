"""Building blocks shared by the configuration models: strict models and durations."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(value: object) -> object:
    """Seconds from a number or a Prometheus-style duration such as "500ms", "5s" or "1m30s"."""
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


Duration = Annotated[float, BeforeValidator(parse_duration), Field(gt=0)]


class Strict(BaseModel):
    """A configuration block: unknown fields are errors, values never change after loading."""

    model_config = ConfigDict(extra="forbid", frozen=True)
