"""The server's `log_line_prefix` turned into a pattern that reads it back off a stderr line.

PostgreSQL starts every line of a stderr report with the prefix expanded (elog.c,
log_status_format), then the severity or the part's label and two spaces. The pattern is
compiled for RE2 on bytes (Latin-1, one character a byte, so invalid UTF-8 matches like
anything else): the free-text escapes (%a, %u, %d, %b, %i) are what a client chooses, and
RE2 matches in time linear in the line whatever it holds, where a backtracking engine could
be made to spin on a crafted application_name.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import re2  # type: ignore[import-untyped]  # google-re2 ships no type information

# What PostgreSQL writes before the two spaces (error_severity() and the labels of
# send_message_to_server_log(), English; lc_messages translates them). A report's first line
# carries its severity (DEBUG1 to DEBUG5 all print DEBUG); its other parts, a label each.
PRIMARY = ("LOG", "WARNING", "ERROR", "FATAL", "PANIC", "NOTICE", "INFO", "DEBUG")
SECONDARY = ("DETAIL", "HINT", "QUERY", "CONTEXT", "LOCATION", "STATEMENT", "BACKTRACE")
_LABELS = rb"DEBUG[1-5]?|" + b"|".join(word.encode() for word in (*PRIMARY, *SECONDARY))

# Any label and its two spaces, wherever it is in a line: a line holding one besides its own
# cannot be told apart from a prefix whose free text imitates the end of a prefix.
MARKER = re.compile(rb"(?:" + _LABELS + rb"):  ")

_TIME = rb"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"
_ZONE = rb"(?: \S*)?"  # pg_strftime's %Z: an abbreviation such as UTC, CEST or +03
# What each escape prints (elog.c, log_status_format; postgresql.conf.sample lists them,
# 14 to 18, %L from 18). Free text is lazy, so that the first reading of a line is the one
# whose free text ends earliest. An escape not listed prints nothing, as PostgreSQL does.
FIELDS: Mapping[str, bytes] = {
    "a": rb".*?",  # application_name, truncated to 63 bytes, non-ASCII escaped
    "u": rb".*?",  # user name (63 bytes at most, as the client sent it, even unauthenticated)
    "d": rb".*?",  # database name (likewise)
    "b": rb".*?",  # backend type ("client backend", a background worker's own type...)
    "i": rb".*?",  # command tag, as ps shows it ("SELECT waiting")
    "r": rb"\S*?",  # remote host and (port): 127.0.0.1(53222), [local]
    "h": rb"\S*?",  # remote host
    "L": rb"\S*?",  # local address (18)
    "p": rb"\d+",  # process ID
    "P": rb"\d*",  # the parallel group leader's process ID, for a parallel worker
    "l": rb"\d+",  # the session's line number
    "x": rb"\d+",  # transaction ID, 0 if none
    "Q": rb"-?\d+",  # query ID, 0 if none
    "t": _TIME + _ZONE,
    "m": _TIME + rb"\.\d{3}" + _ZONE,
    "s": _TIME + _ZONE,  # session start
    "n": rb"\d+\.\d{3}",  # Unix epoch, milliseconds
    "e": rb"[0-9A-Z]{5}",  # SQLSTATE
    "c": rb"[0-9a-f]+\.[0-9a-f]+",  # session ID
    "v": rb"(?:\d+/\d+)?",  # virtual transaction ID
}
# The escapes a record keeps, by the group that captures the first of each.
CAPTURED: Mapping[str, str] = {
    "a": "application_name",
    "d": "database",
    "p": "pid",
    "e": "sqlstate",
}


class _Match(Protocol):
    def group(self, group: int, /) -> bytes | None: ...

    def end(self) -> int: ...


class _Pattern(Protocol):
    @property
    def groupindex(self) -> Mapping[bytes, int]: ...  # the binding names bytes groups in bytes

    def match(self, text: bytes, /) -> _Match | None: ...


_OPTIONS = re2.Options()
_OPTIONS.encoding = re2.Options.Encoding.LATIN1
_OPTIONS.log_errors = False


@dataclass(frozen=True)
class Prefixed:
    """A line read through the prefix: its label, the fields the prefix captured (those of
    CAPTURED it has; empty where PostgreSQL printed nothing) and where the text starts."""

    label: str
    fields: Mapping[str, bytes]
    text_start: int


class LinePattern:
    """The start of every line of a report: the prefix, the label, two spaces."""

    def __init__(self, line_prefix: str) -> None:
        source, captured = _translate(line_prefix.encode())
        self._pattern: _Pattern = re2.compile(
            source + rb"(?P<label>" + _LABELS + rb"):  ", _OPTIONS
        )
        self._groups = {name: self._pattern.groupindex[name.encode()] for name in captured}
        self._label = self._pattern.groupindex[b"label"]

    def match(self, line: bytes) -> Prefixed | None:
        """The line read through the prefix, or None where it does not start with one."""
        found = self._pattern.match(line)
        if found is None:
            return None
        fields = {name: found.group(group) or b"" for name, group in self._groups.items()}
        label = found.group(self._label)
        assert label is not None
        return Prefixed(label.decode(), fields, found.end())


def _translate(prefix: bytes) -> tuple[bytes, tuple[str, ...]]:
    """The RE2 source of an expanded prefix, and the groups it captures. Everything after %q
    is optional: PostgreSQL prints nothing past it for a process without a session."""
    before: list[bytes] = []
    after: list[bytes] | None = None
    captured: list[str] = []
    i = 0
    while i < len(prefix):
        byte = prefix[i : i + 1]
        i += 1
        if byte != b"%":
            (before if after is None else after).append(_literal(byte))
            continue
        escape, padding, i = _escape(prefix, i)
        if escape is None:  # a '%' at the very end, or a padding with nothing after it
            break
        if escape == "%%":
            piece = _literal(b"%")
        elif escape == "q":
            if after is None:
                after = []
            continue
        elif escape in FIELDS:
            group = CAPTURED.get(escape)
            name = None if group is None or group in captured else group
            if name is not None:
                captured.append(name)
            piece = _field(FIELDS[escape], name, padding)
        else:
            piece = b""  # an unknown escape prints nothing, padded or not
        (before if after is None else after).append(piece)
    source = b"".join(before)
    if after is not None:
        source += rb"(?:" + b"".join(after) + rb")?"
    return source, tuple(captured)


def _escape(prefix: bytes, i: int) -> tuple[str | None, int, int]:
    """The escape at `prefix[i]` (after its '%'; "%%" for a '%' right after it), its padding,
    and where the rest starts; as log_status_format and process_log_prefix_padding read it."""
    if i >= len(prefix):
        return None, 0, i
    if prefix[i : i + 1] == b"%":
        return "%%", 0, i + 1
    padding = 0
    if prefix[i] <= ord("9"):  # '-', digits, or any character below '9': a padding
        sign = 1
        if prefix[i : i + 1] == b"-":
            sign, i = -1, i + 1
        digits = re.match(rb"\d*", prefix[i:])
        assert digits is not None
        if digits.end():
            padding = sign * int(digits.group())
        i += digits.end()
        if i >= len(prefix):
            return None, 0, i
    return chr(prefix[i]), padding, i + 1


def _field(pattern: bytes, name: str | None, padding: int) -> bytes:
    """One escape's pattern, captured as `name` if given; a padded value may be absent and
    has spaces on its left (padding > 0) or right (padding < 0)."""
    inner = pattern if name is None else rb"(?P<" + name.encode() + rb">" + pattern + rb")"
    if padding > 0:
        return rb" *(?:" + inner + rb")?"
    if padding < 0:
        return rb"(?:" + inner + rb")? *"
    return inner


def _literal(byte: bytes) -> bytes:
    """One byte of the prefix's own text, matched as itself."""
    return byte if byte.isalnum() else b"\\x%02x" % byte[0]
