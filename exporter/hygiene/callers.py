"""The caller behind a statement, read from the annotations applications write into its
comments: sqlcommenter's (`/*action='create',controller='orders'*/`: google/sqlcommenter's
Django, Flask, SQLAlchemy and Spring integrations, OpenTelemetry's, Rails' query log tags in
their sqlcommenter format), Rails' legacy query log tags (`/*application:Shop,action:create*/`)
and django-pglocks' (django-pgware's) `-- 'nightly' @ /app/jobs.py:42`.

The comments are found by PostgreSQL's own scanner (pglast), never by a pattern over the
text: a string literal may hold `/*` and a comment may hold quotes. The text is the last
statement of a backend as pg_stat_activity keeps it, cut at track_activity_query_size,
often in the middle of a literal or of the trailing comment: such a text is scanned up to
the token that the cut left open, so a leading comment (Rails' `prepend_comment`) is still
read, and a comment cut short is dropped rather than read with a value cut in two.

What comes out is shown by /locks and check, never used as a label: each key and value is
cut (KEY_LENGTH, VALUE_LENGTH), at most MAX_TAGS pairs are kept, and characters that are not
printable (newlines, controls, bidirectional overrides) are written as escapes, so that a
hostile annotation cannot break a line of `check` or fake one.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from urllib.parse import unquote

from pglast import parser

from .risky import shorten

MAX_TAGS = 12
KEY_LENGTH = 40
VALUE_LENGTH = 120
CALLER_LENGTH = 240  # the whole caller as one line of text

SQLCOMMENTER = "sqlcommenter"
RAILS = "rails"
DJANGO_PGLOCKS = "django-pglocks"

# A key of either tag format: what sqlcommenter URL-encodes and Rails' tags are named with.
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.%-]*")
# sqlcommenter's value: single-quoted, a quote inside escaped with a backslash.
_QUOTED = re.compile(r"'((?:[^'\\]|\\.)*)'", re.DOTALL)
_ESCAPED = re.compile(r"\\(.)", re.DOTALL)
# django-pgware's build_comment: f"-- {lock_id!r} @ {filename}:{lineno}", the repr of an
# int, a str or a pair of ints (without the location where it finds no frame outside itself:
# then a comment too bare to tell from any other).
_PGLOCKS = re.compile(
    r"""(?P<lock>-?[0-9]+|'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|\(-?[0-9]+, -?[0-9]+\))"""
    r" @ (?P<file>.+):(?P<line>[0-9]+)",
    re.DOTALL,
)


@dataclass(frozen=True)
class Caller:
    """The tags of a statement's annotations, in the order written, and their formats."""

    styles: tuple[str, ...]  # SQLCOMMENTER, RAILS or DJANGO_PGLOCKS, each once
    tags: tuple[tuple[str, str], ...]  # (key, value), bounded and escaped

    @property
    def text(self) -> str:
        """`key=value` pairs on one line, at most CALLER_LENGTH characters."""
        return shorten(", ".join(f"{key}={value}" for key, value in self.tags), CALLER_LENGTH)


# Scanning costs about 0.75 ms for a statement of 4,096 characters in 2,000 tokens (pglast
# makes an object of each): 0.4 s for a page of 500 such backends. Many backends run the same
# statement (a pool of workers), and a text without the start of a comment is never scanned.
@functools.lru_cache(maxsize=256)
def caller_of(statement: str | None) -> Caller | None:
    """The caller that `statement`'s annotations name, or None where it has none. Never
    raises: a text the scanner cannot read at all has no caller."""
    if not statement or ("/*" not in statement and "--" not in statement):
        return None
    styles: list[str] = []
    tags: list[tuple[str, str]] = []
    for comment in _comments(statement):
        found = _annotation(comment)
        if found is None:
            continue
        style, pairs = found
        if style not in styles:
            styles.append(style)
        tags.extend(pairs)
    if not tags:
        return None
    kept = tags[:MAX_TAGS]
    return Caller(
        tuple(styles),
        tuple((_bounded(key, KEY_LENGTH), _bounded(value, VALUE_LENGTH)) for key, value in kept),
    )


def _comments(statement: str) -> list[str]:
    """The comment tokens of the statement, or of the part before the token a cut left
    open (an unterminated literal, quoted name or comment)."""
    text = statement
    for _ in range(2):  # the whole text, then the part before what it left open
        try:
            tokens = parser.scan(text)
        except parser.ParseError as error:
            location = error.args[1] if len(error.args) > 1 else None
            if not isinstance(location, int) or not 0 <= location < len(text):
                return []
            text = text[:location]
            continue
        except Exception:  # whatever else pglast raises (a lone surrogate): no caller
            return []
        # Offsets are characters; `end` is the token's last one.
        return [
            text[token.start : token.end + 1]
            for token in tokens
            if token.name in ("C_COMMENT", "SQL_COMMENT")
        ]
    return []


def _annotation(comment: str) -> tuple[str, list[tuple[str, str]]] | None:
    if comment.startswith("--"):
        found = _PGLOCKS.fullmatch(comment[2:].strip())
        if found is None:
            return None
        location = f"{found['file']}:{found['line']}"
        return DJANGO_PGLOCKS, [("lock_id", found["lock"]), ("location", location)]
    body = comment[2:-2].strip()
    pairs = _sqlcommenter(body)
    if pairs:
        return SQLCOMMENTER, pairs
    pairs = _legacy_tags(body)
    return (RAILS, pairs) if pairs else None


def _sqlcommenter(body: str) -> list[tuple[str, str]]:
    """`key='value'` pairs joined by commas, keys and values URL-encoded, a quote in a value
    escaped with a backslash (the spec; Rails 7.0 escapes quotes without URL-encoding).
    google/sqlcommenter's Python writes each `%` of the encoding twice, for a driver that
    formats parameters into the statement: `%%` is read as `%`, which a value URL-encoded
    never holds otherwise. Invalid percent-encoding is kept as written."""
    pairs: list[tuple[str, str]] = []
    position = 0
    while position < len(body):
        key = _KEY.match(body, position)
        if key is None or body[key.end() : key.end() + 1] != "=":
            return []
        value = _QUOTED.match(body, key.end() + 1)
        if value is None:
            return []
        pairs.append((_decoded(key[0]), _decoded(_ESCAPED.sub(r"\1", value[1]))))
        position = value.end()
        if position < len(body):
            if body[position] != ",":
                return []
            position += 1
    return pairs


def _legacy_tags(body: str) -> list[tuple[str, str]]:
    """Rails' legacy (marginalia) format: `key:value` joined by commas, values as written.
    Every part must be a pair whose value follows its colon at once, so that a comment of
    prose (`TODO: fix, later`) is none."""
    pairs: list[tuple[str, str]] = []
    for part in body.split(","):
        key, colon, value = part.partition(":")
        if not colon or _KEY.fullmatch(key) is None or "%" in key or value[:1].isspace():
            return []
        pairs.append((key, value))
    return pairs


def _decoded(text: str) -> str:
    return unquote(text.replace("%%", "%"), errors="replace")


def _bounded(text: str, limit: int) -> str:
    """Non-printable characters as escapes (a newline as `\\n`), then cut at `limit`."""
    escaped = "".join(char if char.isprintable() else ascii(char)[1:-1] for char in text)
    return escaped if len(escaped) <= limit else escaped[: limit - 1] + "…"
