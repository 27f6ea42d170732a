"""Turning backends' application_name values into bounded label values."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

OTHER = "__other__"


@dataclass(frozen=True)
class RewriteRule:
    """Replace a whole application_name that matches `pattern` with `replacement`.

    The pattern must match the whole name (as in Prometheus relabeling), and the replacement
    may refer to groups as `\\1` or `\\g<name>`.
    """

    pattern: re.Pattern[str]
    replacement: str

    def apply(self, name: str) -> str:
        match = self.pattern.fullmatch(name)
        return name if match is None else match.expand(self.replacement)


def rewrite(name: str, rules: Iterable[RewriteRule]) -> str:
    """Apply every rule in order, each to the result of the one before."""
    for rule in rules:
        name = rule.apply(name)
    return name


@dataclass(frozen=True)
class Folding:
    """Which label each name gets under the cap, and how many names were folded."""

    labels: Mapping[str, str]
    folded: int

    def label(self, name: str) -> str:
        return self.labels[name]


def fold(lock_counts: Mapping[str, int], limit: int) -> Folding:
    """Keep at most `limit` distinct values: the names with the most locks, then `__other__`.

    When there are more names than `limit`, the `limit - 1` names with the most advisory lock
    entries keep their own label (ties go to the name that sorts first, so the choice is
    stable) and the rest share `__other__`.
    """
    if len(lock_counts) <= limit:
        return Folding({name: name for name in lock_counts}, 0)
    ranked = sorted(lock_counts, key=lambda name: (-lock_counts[name], name))
    kept = set(ranked[: limit - 1])
    labels = {name: name if name in kept else OTHER for name in lock_counts}
    return Folding(labels, len(lock_counts) - len(kept))
