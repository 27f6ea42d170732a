"""What settings are checked with: strict models, ports, and errors that say where they are
(the file, the path in it, the item's name)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict


class ConfigError(Exception):
    """A configuration that cannot be used; the message names the source and the problem."""


# The names a file may give: a target's, a pooler's and an auth module's (a label value and
# part of a URL), and a key's (a label value that may carry a library's own spelling, such
# as "app:lock").
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
KEY_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.:-]{0,99}$"
# A name repeated in a message beside its item's position: one of those, not whatever an
# invalid one holds (a megabyte, a newline).
_SHOWN_NAMES = (re.compile(NAME_PATTERN), re.compile(KEY_NAME_PATTERN))


def item_name(item: object) -> str | None:
    """The `name` of a list's item (a target, a pooler, a key), to say which it is beside
    its position; None where it has none, or one no valid name looks like."""
    name = item.get("name") if isinstance(item, Mapping) else None
    shown = isinstance(name, str) and any(p.fullmatch(name) for p in _SHOWN_NAMES)
    return name if shown else None


def step(path: str, part: int | str, name: str | None = None) -> str:
    """`path` one level further: an item of a list by its position and, if it has one, its
    name ("targets[1] (billing)"); a mapping's field by its key."""
    if isinstance(part, int):
        return f"{path}[{part}]" + (f" ({name})" if name else "")
    return f"{path}.{part}" if path else str(part)


def location(loc: Sequence[int | str], document: object = None) -> str:
    """Where in a document a validation error is: "targets[0].collection.min_interval", or
    with the document the file gave, each named item of a list by its name too:
    "targets[1] (billing).collection.min_interval"."""
    path = ""
    at = document
    for part in loc:
        if isinstance(part, int):
            inside = isinstance(at, list | tuple) and -len(at) <= part < len(at)
            at = at[part] if inside else None  # type: ignore[index]
            path = step(path, part, item_name(at))
        else:
            path = step(path, part)
            at = at.get(part) if isinstance(at, Mapping) else None
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
