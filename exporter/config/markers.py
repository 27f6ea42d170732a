"""Marks on a setting's type for config/sources.py: only the file sets it, its flag's spelling."""

from __future__ import annotations

from dataclasses import dataclass


class FileOnly:
    """Marks a field that only the file sets: a list of rules has no flag or variable form."""


@dataclass(frozen=True)
class Spelled:
    """Marks a setting whose flag is spelled as the Go exporters spell it (--web.config.file)."""

    flag: str
