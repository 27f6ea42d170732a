"""Turning backends' application_name values into bounded label values."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

import re2  # type: ignore[import-untyped]  # google-re2 ships no type information

OTHER = "__other__"


class Match(Protocol):
    """What a rule uses of an RE2 match."""

    def group(self, group: int, /) -> str | None: ...


class Pattern(Protocol):
    """What a rule uses of a compiled RE2 pattern."""

    @property
    def groups(self) -> int: ...

    @property
    def groupindex(self) -> Mapping[str, int]: ...

    def fullmatch(self, text: str, /) -> Match | None: ...


# Literal text, and the numbers of the groups to insert between it.
Template = tuple[str | int, ...]

_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # a bad pattern is a configuration error, not a line on stderr

# \C matches one byte of the UTF-8 encoding; names are matched as text, and the engine of
# Prometheus relabeling refuses it too. An even run of backslashes before it escapes itself.
_ANY_BYTE = re.compile(r"(?<!\\)(?:\\\\)*\\C")

# A backslash and what follows it in a replacement: g<name or number>, a group number, or
# anything else (a backslash, or an escape that is refused).
_ESCAPE = re.compile(r"\\(?:g<([^<>]*)>|([1-9][0-9]?)|(.?))", re.DOTALL)
_ESCAPES_HELP = r"use \1, \g<1> or \g<name> for a group, \\ for a backslash"
_SYNTAX = "RE2 syntax: https://github.com/google/re2/wiki/Syntax"


def compile_pattern(pattern: str) -> Pattern:
    """Compile for RE2, which matches in time linear in the name whatever the pattern.

    A client chooses its own application_name: a backtracking engine could be made to spin
    on it for minutes.
    """
    if _ANY_BYTE.search(pattern):
        raise ValueError(f"bad regular expression {pattern!r}: \\C (any byte) is not supported")
    try:
        compiled: Pattern = re2.compile(pattern, _RE2_OPTIONS)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else "invalid"
        if isinstance(reason, bytes):  # the binding passes on RE2's message undecoded
            reason = reason.decode(errors="replace")
        raise ValueError(f"bad regular expression {pattern!r}: {reason} ({_SYNTAX})") from None
    return compiled


def parse_template(replacement: str, pattern: Pattern) -> Template:
    """Split a replacement into literal text and group numbers, each group checked to exist.

    `\\1` to `\\99`, `\\g<1>` and `\\g<name>` insert a group, `\\\\` a backslash; any other
    escape is refused rather than guessed at.
    """
    parts: list[str | int] = []
    literal_start = 0
    for escape in _ESCAPE.finditer(replacement):
        parts.append(replacement[literal_start : escape.start()])
        parts.append(_escaped(escape, pattern))
        literal_start = escape.end()
    parts.append(replacement[literal_start:])
    return tuple(part for part in parts if part != "")


def _escaped(escape: re.Match[str], pattern: Pattern) -> str | int:
    name, number, other = escape.groups()
    if other == "\\":
        return "\\"
    if other is not None:
        raise ValueError(f"unknown escape {escape.group()} ({_ESCAPES_HELP})")
    if name is None:
        group = int(number)
    elif name.isascii() and name.isdigit():
        group = int(name)
    elif name in pattern.groupindex:
        group = pattern.groupindex[name]
    else:
        raise ValueError(f"{escape.group()}: the pattern has no group named {name!r}")
    if group > pattern.groups:
        raise ValueError(
            f"{escape.group()} refers to group {group}, but the pattern has {pattern.groups}"
        )
    return group


@dataclass(frozen=True)
class RewriteRule:
    """Replace a whole application_name that matches `pattern` with `template` filled in.

    The pattern must match the whole name (as in Prometheus relabeling); a group that took
    no part in the match inserts nothing.
    """

    pattern: Pattern
    template: Template

    @classmethod
    def compile(cls, pattern: str, replacement: str) -> RewriteRule:
        """A rule from its configuration; ValueError says what is wrong with either."""
        compiled = compile_pattern(pattern)
        return cls(compiled, parse_template(replacement, compiled))

    def apply(self, name: str) -> str:
        match = self.pattern.fullmatch(name)
        if match is None:
            return name
        return "".join(
            part if isinstance(part, str) else match.group(part) or "" for part in self.template
        )


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
