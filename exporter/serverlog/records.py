"""The server log's lines read into records, one parser per `log_destination` format.

A parser is fed one physical line at a time (bytes, without its newline; a trailing carriage
return is dropped) and returns the records that line completed; `flush()` at the end of a
file returns what is still pending. Nothing it is fed makes it raise, and what it holds is
bounded (MAX_RECORD_BYTES, MAX_RECORD_LINES) whatever the lines are.

`unparsed` counts what could not be read: a line (jsonlog, stderr) or a record (csvlog) that
does not parse, a TOO_LONG line, a record dropped for its size or cut by a TOO_LONG line or
the end of a file, and in stderr a line that belongs to no record (a DETAIL or a continuation
after a line that could not be read). Every line ends up in a record returned or in what
`unparsed` counts.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Literal, Protocol

from .follower import Line, TooLong
from .prefix import MARKER, SECONDARY, LinePattern, Prefixed

MAX_RECORD_BYTES = 1 << 20  # what one record may hold; past it, it is dropped and counted
MAX_RECORD_LINES = 10_000  # what one stderr record may keep, in lines
DEFAULT_LINE_PREFIX = "%m [%p] "  # PostgreSQL's own default (10 and later)


@dataclass(frozen=True)
class Record:
    """One report from the server log, as the format carries it."""

    severity: str  # as logged: "LOG", "WARNING", "ERROR", "FATAL", "PANIC", ...
    message: str
    sqlstate: str | None = None  # "53200", where the format carries it
    detail: str | None = None
    hint: str | None = None
    database: str | None = None
    application_name: str | None = None
    pid: int | None = None
    # Where the server raised it, "function, file.c:line" (log_error_verbosity = verbose
    # only): what a client's RAISE cannot imitate, since it is written from the C source.
    location: str | None = None


class Parser(Protocol):
    """One format's reader: lines in, records out."""

    unparsed: int  # lines or records that could not be read, so far

    def feed(self, line: Line) -> list[Record]: ...

    def flush(self) -> list[Record]: ...  # at the end of a file: what is pending


Format = Literal["jsonlog", "csvlog", "stderr"]


def parser(format: Format, line_prefix: str | None = None) -> Parser:
    """A parser for `format`; stderr reads its lines through the server's `log_line_prefix`
    (its default, DEFAULT_LINE_PREFIX, if None), which the other formats do not use."""
    if format == "jsonlog":
        return JsonlogParser()
    if format == "csvlog":
        return CsvlogParser()
    if format == "stderr":
        return StderrParser(DEFAULT_LINE_PREFIX if line_prefix is None else line_prefix)
    raise ValueError(f"unknown log format {format!r}: jsonlog, csvlog or stderr")


def _line(line: bytes) -> bytes:
    return line[:-1] if line.endswith(b"\r") else line


def _text(data: bytes | bytearray) -> str:
    return data.decode("utf-8", "replace")


class JsonlogParser:
    """jsonlog (PostgreSQL 15 and later, jsonlog.c): one JSON object a line, its keys those
    set (error_severity, state_code, message, detail, hint, dbname, application_name, pid...).
    A line that is not an object, lacks error_severity or message, or holds one of the keys
    read here with the wrong type is unparsed."""

    def __init__(self) -> None:
        self.unparsed = 0

    def feed(self, line: Line) -> list[Record]:
        record = None if isinstance(line, TooLong) else _json_record(_line(line))
        if record is None:
            self.unparsed += 1
            return []
        return [record]

    def flush(self) -> list[Record]:
        return []


_JSON_TEXTS = ("state_code", "detail", "hint", "dbname", "application_name")


def _json_record(line: bytes) -> Record | None:
    try:
        value = json.loads(_text(line))
    except (ValueError, RecursionError):  # not JSON; nested past the interpreter's depth
        return None
    if not isinstance(value, dict):
        return None
    severity, message, pid = value.get("error_severity"), value.get("message"), value.get("pid")
    texts = [value.get(key) for key in _JSON_TEXTS]
    if not (isinstance(severity, str) and isinstance(message, str)):
        return None
    if not all(text is None or isinstance(text, str) for text in texts):
        return None
    if pid is not None and type(pid) is not int:  # a bool is an int to isinstance
        return None
    sqlstate, detail, hint, database, application_name = texts
    return Record(
        severity,
        message,
        sqlstate,
        detail,
        hint,
        database,
        application_name or None,
        pid,
        _json_location(value.get("func_name"), value.get("file_name"), value.get("file_line_num")),
    )


def _json_location(function: object, file: object, line: object) -> str | None:
    """jsonlog's func_name, file_name and file_line_num as csvlog and stderr write them."""
    if not (isinstance(file, str) and type(line) is int):
        return None
    return f"{function}, {file}:{line}" if isinstance(function, str) else f"{file}:{line}"


# csvlog (csvlog.c), 14 to 18: 26 columns. PostgreSQL quotes every text it writes in the
# columns below (appendCSVLiteral, doubling quotes; the remote host too) and writes the others
# bare, an absent value as nothing. The reader holds each column to that: a quoted field's
# text can then only come from inside one PostgreSQL quoted, and text that a client had
# logged inside a quoted field (a statement) cannot pass for a record's message, detail or
# hint even when the parser has lost its place (after a TOO_LONG line or a dropped record):
# read from outside, every quote of it is doubled. The csv module cannot tell a quoted field
# from a bare one, so the reader is this one pattern, unambiguous, possessive and linear.
CSV_COLUMNS = 26
_QUOTED = frozenset({2, 3, 5, 8, 14, 15, 16, 17, 19, 20, 22, 23, 24})  # 1-based, as documented
_CSV_FIELD = r'(?>"((?:[^"]|"")*+)"|([^,"\n]*+))'
_CSV = re.compile(",".join([_CSV_FIELD] * CSV_COLUMNS))
_CSV_TIME = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}(?: [^ ]*)?", re.ASCII)
_SQLSTATE = re.compile(r"[0-9A-Z]{5}")


class CsvlogParser:
    """csvlog: a record spans physical lines while a quoted field holds newlines, that is
    until the quotes it has read balance."""

    def __init__(self) -> None:
        self.unparsed = 0
        self._pending = bytearray()
        self._lines = 0
        self._quotes = 0

    def feed(self, line: Line) -> list[Record]:
        if isinstance(line, TooLong):
            self.unparsed += 1 + self._drop()
            return []
        line = _line(line)
        if self._lines:
            self._pending += b"\n"
        self._pending += line
        self._lines += 1
        self._quotes += line.count(b'"')
        if len(self._pending) > MAX_RECORD_BYTES:
            self.unparsed += self._drop()
            return []
        if self._quotes % 2:  # inside a quoted field: the record goes on
            return []
        record = _csv_record(_text(self._pending))
        self._drop()
        if record is None:
            self.unparsed += 1
            return []
        return [record]

    def flush(self) -> list[Record]:
        self.unparsed += self._drop()  # a record its file ends inside
        return []

    def _drop(self) -> int:
        """Forget the record being read; 1 if there was one."""
        had = 1 if self._lines else 0
        self._pending = bytearray()
        self._lines = self._quotes = 0
        return had


def _csv_record(text: str) -> Record | None:
    found = _CSV.fullmatch(text)
    if found is None:
        return None
    groups = found.groups()
    values: list[str | None] = []
    for column in range(1, CSV_COLUMNS + 1):
        quoted, bare = groups[2 * column - 2], groups[2 * column - 1]
        if column in _QUOTED:
            if bare:
                return None
            values.append(None if quoted is None else quoted.replace('""', '"'))
        elif quoted is not None:
            return None
        else:
            values.append(bare or None)
    time, database, pid = values[0], values[2], values[3]
    severity, sqlstate, message, detail, hint = values[11:16]
    if time is None or not _CSV_TIME.fullmatch(time) or severity is None:
        return None
    if pid is not None and not (pid.isascii() and pid.isdigit()):
        return None
    if sqlstate is not None and not _SQLSTATE.fullmatch(sqlstate):
        return None
    return Record(
        severity,
        message or "",
        sqlstate,
        detail,
        hint,
        database,
        values[22] or None,
        None if pid is None else int(pid),
        values[21] or None,
    )


@dataclass
class _Report:
    """A stderr report being read: its first line's severity and fields, and the parts a
    record keeps (message, DETAIL, HINT, LOCATION), each a list of lines."""

    severity: str
    fields: dict[str, bytes]
    parts: dict[str, list[str]] = field(default_factory=dict)
    current: list[str] | None = None  # where a continuation line goes; None: a part not kept
    size: int = 0
    lines: int = 0
    dropped: bool = False  # past the bounds: counted, its lines up to the next report ignored

    def record(self) -> Record:
        def part(name: str) -> str | None:
            lines = self.parts.get(name)
            return None if lines is None else "\n".join(lines)

        fields = {name: _text(value).strip(" ") for name, value in self.fields.items()}
        pid, sqlstate = fields.get("pid", ""), fields.get("sqlstate")
        message = part("message") or ""
        # log_error_verbosity = verbose, which adds the LOCATION, puts the SQLSTATE first.
        if "LOCATION" in self.parts and (verbose := _VERBOSE.match(message)):
            sqlstate, message = sqlstate or verbose.group(1), message[verbose.end() :]
        return Record(
            self.severity,
            message,
            sqlstate or None,
            part("DETAIL"),
            part("HINT"),
            fields.get("database") or None,
            fields.get("application_name") or None,
            int(pid) if pid.isascii() and pid.isdigit() else None,
            part("LOCATION"),
        )


_KEPT = frozenset({"DETAIL", "HINT", "LOCATION"})
_VERBOSE = re.compile(r"([0-9A-Z]{5}): ")


class StderrParser:
    """stderr: every line of a report starts with the prefix, the first with the report's
    severity, the others with their part's label (DETAIL, HINT, STATEMENT...); a line that
    starts with a tab continues the part above it (PostgreSQL indents the lines of a message
    that holds newlines). A report is complete when the next one starts, or at the end.

    A line is unparsed, and ends the report before it, where it does not start with the
    prefix, where its pid is not the report's, or where it holds a label with two spaces
    besides its own: free text in the prefix (an application_name, a user name that a client
    sends before it authenticates) could be imitating the prefix's end, and the message read
    would not be the one logged. Then, up to the next first line, every line is unparsed.
    A TOO_LONG line ends the report before it too (made of whole lines, it is returned).
    A report that would keep more than the bounds is dropped and counted once, with the rest
    of its lines; the parts a record does not keep (STATEMENT, CONTEXT...) cost nothing.
    """

    def __init__(self, line_prefix: str = DEFAULT_LINE_PREFIX) -> None:
        self.unparsed = 0
        self._pattern = LinePattern(line_prefix)
        self._report: _Report | None = None  # None: lines up to the next report are not read

    def feed(self, line: Line) -> list[Record]:
        if isinstance(line, TooLong):
            self.unparsed += 1
            return self._end()
        line = _line(line)
        if line[:1] == b"\t":
            self._continue(line[1:])
            return []
        read = self._pattern.match(line)
        if read is None or _ambiguous(line, read) or not self._follows(read):
            self.unparsed += 1
            return self._end()
        text = line[read.text_start :]
        if read.label in SECONDARY:
            self._part(read.label, text)
            return []
        done = self._end()
        self._report = _Report(read.label, dict(read.fields))
        self._part("message", text)
        return done

    def flush(self) -> list[Record]:
        return self._end()

    def _follows(self, read: Prefixed) -> bool:
        """Whether a line can be read where it is: a first line always; another part only
        within a report, and from the report's process where the prefix shows it."""
        if read.label not in SECONDARY:
            return True
        if self._report is None:
            return False
        return read.fields.get("pid") == self._report.fields.get("pid")

    def _part(self, label: str, text: bytes) -> None:
        report = self._report
        assert report is not None
        if report.dropped or label in report.parts or (label not in _KEPT and label != "message"):
            report.current = None  # a part a record does not keep, or one seen already
            return
        report.current = report.parts[label] = []
        self._keep(text)

    def _continue(self, text: bytes) -> None:
        if self._report is None:
            self.unparsed += 1
        elif self._report.current is not None:
            self._keep(text)

    def _keep(self, text: bytes) -> None:
        report = self._report
        assert report is not None
        assert report.current is not None
        report.size += len(text) + 1
        report.lines += 1
        if report.size > MAX_RECORD_BYTES or report.lines > MAX_RECORD_LINES:
            self.unparsed += 1
            report.dropped, report.current = True, None
            report.parts.clear()
            return
        report.current.append(_text(text))

    def _end(self) -> list[Record]:
        """Close the report being read: its record, unless it was dropped."""
        report, self._report = self._report, None
        return [] if report is None or report.dropped else [report.record()]


def _ambiguous(line: bytes, read: Prefixed) -> bool:
    """Whether the line holds a label with its two spaces besides the one read."""
    label_start = read.text_start - len(read.label) - 3
    return bool(MARKER.search(line, 0, label_start) or MARKER.search(line, read.text_start))
