"""The server log's lines read into records: each format as PostgreSQL writes it (excerpts
of real logs, and lines built the way its writers build them), and what a hostile or broken
log makes of the parsers: nothing raised, everything bounded, every line accounted for."""

from __future__ import annotations

import itertools
import json
import time
import tracemalloc
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pg_advisory_exporter.serverlog.follower import TOO_LONG, Line
from pg_advisory_exporter.serverlog.prefix import LinePattern
from pg_advisory_exporter.serverlog.records import (
    MAX_RECORD_BYTES,
    MAX_RECORD_LINES,
    CsvlogParser,
    Format,
    JsonlogParser,
    Parser,
    Record,
    StderrParser,
    parser,
)


def read(p: Parser, lines: Iterable[Line]) -> list[Record]:
    """Every record the lines make, the end of the file included."""
    records = []
    for line in lines:
        records += p.feed(line)
    return records + p.flush()


def physical(text: str) -> list[bytes]:
    """A log's text as the follower hands it: line by line, without the newlines."""
    return text.encode().split(b"\n")


# Excerpts of real logs (lc_messages = C), one report each of what the events count.
# PostgreSQL 18.6, jsonlog.
JSONLOG_18 = r"""{"timestamp":"2026-12-01 23:37:05.909 UTC","user":"postgres","dbname":"postgres","pid":11963,"remote_host":"127.0.0.1","remote_port":34426,"session_id":"6b0f5a21.2ebb","line_num":2,"ps":"SELECT","session_start":"2026-12-01 23:37:05 UTC","vxid":"0/3","txid":0,"error_severity":"WARNING","state_code":"01000","message":"you don't own a lock of type ShareLock","application_name":"app-a","backend_type":"client backend","query_id":0}
{"timestamp":"2026-12-01 23:37:06.714 UTC","user":"postgres","dbname":"postgres","pid":11963,"remote_host":"127.0.0.1","remote_port":34426,"session_id":"6b0f5a21.2ebb","line_num":4,"ps":"SELECT","session_start":"2026-12-01 23:37:05 UTC","vxid":"0/7","txid":0,"error_severity":"ERROR","state_code":"40P01","message":"deadlock detected","detail":"Process 11963 waits for ExclusiveLock on advisory lock [5,3,4,2]; blocked by process 11964.\nProcess 11964 waits for ExclusiveLock on advisory lock [5,1,4294967294,2]; blocked by process 11963.\nProcess 11963: select pg_advisory_lock(3, 4) /* multi\nline */\nProcess 11964: select pg_advisory_lock(1, -2)","hint":"See server log for query details.","statement":"select pg_advisory_lock(3, 4) /* multi\nline */","application_name":"app-a","backend_type":"client backend","query_id":0}
{"timestamp":"2026-12-01 23:37:06.721 UTC","user":"postgres","dbname":"postgres","pid":11963,"remote_host":"127.0.0.1","remote_port":34426,"session_id":"6b0f5a21.2ebb","line_num":5,"ps":"SELECT","session_start":"2026-12-01 23:37:05 UTC","vxid":"0/10","txid":0,"error_severity":"ERROR","state_code":"53200","message":"out of shared memory","hint":"You might need to increase \"max_locks_per_transaction\".","statement":"select count(pg_advisory_xact_lock(i)) from generate_series(1, 100000) i","application_name":"app-a","backend_type":"client backend","query_id":0}
{"timestamp":"2026-12-01 23:37:05.801 UTC","pid":11950,"session_id":"6b0f5a21.2eae","line_num":2,"session_start":"2026-12-01 23:37:05 UTC","txid":0,"error_severity":"LOG","message":"listening on IPv4 address \"127.0.0.1\", port 45163","backend_type":"postmaster","query_id":0}"""  # noqa: E501

# PostgreSQL 18.6, csvlog: a record whose quoted fields hold newlines spans physical lines.
CSVLOG_18 = """2026-12-01 23:37:06.413 UTC,"postgres","postgres",11964,"127.0.0.1:34434",6b0f5a21.2ebc,3,"SELECT waiting",2026-12-01 23:37:05 UTC,1/5,0,LOG,00000,"process 11964 still waiting for ExclusiveLock on advisory lock [5,1,4294967294,2] after 100.090 ms","Process holding the lock: 11963. Wait queue: 11964.",,,,,"select pg_advisory_lock(1, -2)",,,"app-b","client backend",,0
2026-12-01 23:37:06.714 UTC,"postgres","postgres",11963,"127.0.0.1:34426",6b0f5a21.2ebb,4,"SELECT",2026-12-01 23:37:05 UTC,0/7,0,ERROR,40P01,"deadlock detected","Process 11963 waits for ExclusiveLock on advisory lock [5,3,4,2]; blocked by process 11964.
Process 11964 waits for ExclusiveLock on advisory lock [5,1,4294967294,2]; blocked by process 11963.
Process 11963: select pg_advisory_lock(3, 4) /* multi
line */
Process 11964: select pg_advisory_lock(1, -2)","See server log for query details.",,,,"select pg_advisory_lock(3, 4) /* multi
line */",,,"app-a","client backend",,0
2026-12-01 23:37:06.728 UTC,"postgres","postgres",11967,"127.0.0.1:34440",6b0f5a22.2ebf,2,"DO",2026-12-01 23:37:06 UTC,2/3,0,WARNING,01000,"a ""quoted"", multi
line",,,,,"PL/pgSQL function inline_code_block line 1 at RAISE",,,,"x WARNING:  you don't own a lock of type ExclusiveLock","client backend",,0
2026-12-01 23:37:05.801 UTC,,,11950,,6b0f5a21.2eae,2,,2026-12-01 23:37:05 UTC,,0,LOG,00000,"listening on IPv4 address ""127.0.0.1"", port 45163",,,,,,,,,"","postmaster",,0"""  # noqa: E501

# PostgreSQL 14.23, stderr, log_line_prefix = '%t [%p-%l] %q%u@%d,app=%a,host=%r '.
STDERR_14_PREFIX = "%t [%p-%l] %q%u@%d,app=%a,host=%r "
STDERR_14 = """2026-12-01 23:37:00 UTC [11849-6] postgres@postgres,app=app-a,host=127.0.0.1(53222) ERROR:  deadlock detected
2026-12-01 23:37:00 UTC [11849-7] postgres@postgres,app=app-a,host=127.0.0.1(53222) DETAIL:  Process 11849 waits for ExclusiveLock on advisory lock [12972,3,4,2]; blocked by process 11850.
\tProcess 11850 waits for ExclusiveLock on advisory lock [12972,1,4294967294,2]; blocked by process 11849.
\tProcess 11849: select pg_advisory_lock(3, 4) /* multi
\tline */
\tProcess 11850: select pg_advisory_lock(1, -2)
2026-12-01 23:37:00 UTC [11849-8] postgres@postgres,app=app-a,host=127.0.0.1(53222) HINT:  See server log for query details.
2026-12-01 23:37:00 UTC [11849-9] postgres@postgres,app=app-a,host=127.0.0.1(53222) STATEMENT:  select pg_advisory_lock(3, 4) /* multi
\tline */
2026-12-01 23:37:00 UTC [11849-10] postgres@postgres,app=app-a,host=127.0.0.1(53222) ERROR:  out of shared memory
2026-12-01 23:37:00 UTC [11849-11] postgres@postgres,app=app-a,host=127.0.0.1(53222) HINT:  You might need to increase max_locks_per_transaction.
2026-12-01 23:37:00 UTC [11849-12] postgres@postgres,app=app-a,host=127.0.0.1(53222) STATEMENT:  select count(pg_advisory_xact_lock(i)) from generate_series(1, 100000) i
2026-12-01 23:36:59 UTC [11840-4] LOG:  listening on IPv4 address "127.0.0.1", port 59915"""  # noqa: E501

# PostgreSQL 16.15, stderr, a padded pid and most escapes.
STDERR_16_PREFIX = "%m %n [%-8p] %q%e %c %v %x %b %i %h %s "
STDERR_16 = """2026-12-01 23:37:01.932 UTC 1796168221.932 [11887   ] 00000 6b0f5a1d.2e6f 4/2 0 client backend SELECT waiting 127.0.0.1 2026-12-01 23:37:01 UTC LOG:  process 11887 still waiting for ExclusiveLock on advisory lock [5,4294967295,4294967291,1] after 100.154 ms
2026-12-01 23:37:01.932 UTC 1796168221.932 [11887   ] 00000 6b0f5a1d.2e6f 4/2 0 client backend SELECT waiting 127.0.0.1 2026-12-01 23:37:01 UTC DETAIL:  Process holding the lock: 11886. Wait queue: 11887.
2026-12-01 23:37:01.932 UTC 1796168221.932 [11887   ] 00000 6b0f5a1d.2e6f 4/2 0 client backend SELECT waiting 127.0.0.1 2026-12-01 23:37:01 UTC STATEMENT:  select pg_advisory_lock(-5)
2026-12-01 23:37:03.161 UTC 1796168223.161 [11880   ] LOG:  checkpoint starting: shutdown immediate"""  # noqa: E501

# PostgreSQL 18.6, stderr, log_error_verbosity = verbose: the SQLSTATE before the message.
STDERR_18_VERBOSE_PREFIX = "%m [%p] %q%a %d %e "
STDERR_18_VERBOSE = """2026-12-01 23:43:12.934 UTC [23182] app-a postgres 01000 WARNING:  01000: you don't own a lock of type ExclusiveLock
2026-12-01 23:43:12.934 UTC [23182] app-a postgres 01000 LOCATION:  LockRelease, lock.c:2110"""  # noqa: E501


def test_jsonlog_as_postgresql_writes_it() -> None:
    p = parser("jsonlog")
    unlock, deadlock, full, postmaster = read(p, physical(JSONLOG_18))
    assert p.unparsed == 0
    assert unlock == Record(
        "WARNING", "you don't own a lock of type ShareLock", "01000",
        database="postgres", application_name="app-a", pid=11963,
    )  # fmt: skip
    assert deadlock.sqlstate == "40P01"
    assert deadlock.detail is not None
    assert deadlock.detail.split("\n")[2:4] == [
        "Process 11963: select pg_advisory_lock(3, 4) /* multi",
        "line */",
    ]
    assert full.hint == 'You might need to increase "max_locks_per_transaction".'
    assert postmaster == Record(
        "LOG", 'listening on IPv4 address "127.0.0.1", port 45163', pid=11950
    )  # a LOG has no state_code: its SQLSTATE, 00000, is zero


def test_csvlog_as_postgresql_writes_it() -> None:
    p = parser("csvlog")
    waiting, deadlock, raised, postmaster = read(p, physical(CSVLOG_18))
    assert p.unparsed == 0
    assert waiting.detail == "Process holding the lock: 11963. Wait queue: 11964."
    assert (waiting.sqlstate, waiting.application_name, waiting.pid) == ("00000", "app-b", 11964)
    assert deadlock.detail is not None
    assert deadlock.detail.count("\n") == 4
    assert deadlock.hint == "See server log for query details."
    assert raised.message == 'a "quoted", multi\nline'
    assert raised.application_name == "x WARNING:  you don't own a lock of type ExclusiveLock"
    assert (postmaster.database, postmaster.application_name) == (None, None)


def test_stderr_as_postgresql_14_writes_it() -> None:
    p = parser("stderr", STDERR_14_PREFIX)
    deadlock, full, postmaster = read(p, physical(STDERR_14))
    assert p.unparsed == 0
    assert deadlock.detail == "\n".join([
        "Process 11849 waits for ExclusiveLock on advisory lock [12972,3,4,2];"
        " blocked by process 11850.",
        "Process 11850 waits for ExclusiveLock on advisory lock [12972,1,4294967294,2];"
        " blocked by process 11849.",
        "Process 11849: select pg_advisory_lock(3, 4) /* multi",
        "line */",
        "Process 11850: select pg_advisory_lock(1, -2)",
    ])  # fmt: skip
    assert (deadlock.database, deadlock.application_name, deadlock.pid) == (
        "postgres",
        "app-a",
        11849,
    )
    assert deadlock.sqlstate is None  # the prefix has no %e
    assert full == Record(
        "ERROR", "out of shared memory", None, None,
        "You might need to increase max_locks_per_transaction.", "postgres", "app-a", 11849,
    )  # fmt: skip
    # %q: a process without a session prints nothing after it.
    assert postmaster == Record(
        "LOG", 'listening on IPv4 address "127.0.0.1", port 59915', pid=11840
    )


def test_stderr_with_padding_and_most_escapes() -> None:
    p = parser("stderr", STDERR_16_PREFIX)
    waiting, checkpoint = read(p, physical(STDERR_16))
    assert p.unparsed == 0
    assert (waiting.pid, waiting.sqlstate, waiting.detail) == (
        11887, "00000", "Process holding the lock: 11886. Wait queue: 11887."
    )  # fmt: skip
    assert checkpoint == Record("LOG", "checkpoint starting: shutdown immediate", pid=11880)


def test_stderr_verbose_puts_the_sqlstate_first_and_adds_the_location() -> None:
    p = parser("stderr", STDERR_18_VERBOSE_PREFIX)
    (unlock,) = read(p, physical(STDERR_18_VERBOSE))
    assert unlock.message == "you don't own a lock of type ExclusiveLock"
    assert (unlock.sqlstate, unlock.location) == ("01000", "LockRelease, lock.c:2110")
    # Without %e in the prefix, the verbose message still gives the SQLSTATE.
    p = parser("stderr", "%m [%p] %q%a %d ")
    lines = [line.replace(b"postgres 01000 ", b"postgres ") for line in physical(STDERR_18_VERBOSE)]
    (unlock,) = read(p, lines)
    assert (unlock.sqlstate, unlock.message) == (
        "01000",
        "you don't own a lock of type ExclusiveLock",
    )


# Writers that build lines the way PostgreSQL's do, for what real excerpts do not cover.


def csv_literal(value: str | None) -> str:
    """appendCSVLiteral: nothing for NULL, else quoted with its quotes doubled."""
    return "" if value is None else '"' + value.replace('"', '""') + '"'


def csvlog(
    severity: str,
    message: str | None,
    sqlstate: str = "00000",
    *,
    detail: str | None = None,
    hint: str | None = None,
    query: str | None = None,
    database: str = "postgres",
    application_name: str = "app",
    pid: int = 4242,
    location: str | None = None,
) -> list[bytes]:
    """A csvlog record (write_csvlog's 26 columns), in physical lines."""
    columns = [
        "2026-12-01 23:31:27.352 UTC", csv_literal("postgres"), csv_literal(database), str(pid),
        '"127.0.0.1:43808"', "6b0f58cf.1092", "1", csv_literal("SELECT"),
        "2026-12-01 23:31:27 UTC", "3/2", "0", severity, sqlstate, csv_literal(message),
        csv_literal(detail), csv_literal(hint), "", "", "", csv_literal(query), "",
        csv_literal(location), csv_literal(application_name), csv_literal("client backend"), "",
        "0",
    ]  # fmt: skip
    return physical(",".join(columns))


def jsonlog(severity: str, message: str, sqlstate: str | None = None, **keys: Any) -> bytes:
    """A jsonlog line: write_jsonlog's keys in its order (those after the message as given),
    escape_json's escaping (json.dumps' without ensure_ascii: quotes, backslashes and control
    characters escaped, the rest as it is). A LOG has no state_code: 00000 is zero."""
    value: dict[str, Any] = {
        "timestamp": "2026-12-01 23:31:27.352 UTC", "user": "postgres", "dbname": "postgres",
        "pid": 4242, "remote_host": "127.0.0.1", "remote_port": 43808,
        "session_id": "6b0f58cf.1092", "line_num": 1, "ps": "SELECT",
        "session_start": "2026-12-01 23:31:27 UTC", "vxid": "3/2", "txid": 0,
        "error_severity": severity,
        **({} if sqlstate is None else {"state_code": sqlstate}),
        "message": message, **keys, "backend_type": "client backend", "query_id": 0,
    }  # fmt: skip
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def stderr_report(prefix: str, severity: str, message: str, *parts: tuple[str, str]) -> list[bytes]:
    """A stderr report: each part's line starts with the expanded prefix, and each newline
    of a part is followed by a tab (append_with_tabs)."""
    lines = []
    for label, text in ((severity, message), *parts):
        lines.append(f"{prefix}{label}:  {text}".replace("\n", "\n\t"))
    return physical("\n".join(lines))


def test_jsonlog_escapes_and_optional_keys() -> None:
    line = jsonlog(
        "ERROR", 'a "quote", a\nnewline, a tab\t, \u00e9 and \x01', "P0001",
        detail="d\\e", hint="h", func_name="exec_stmt_raise", file_name="pl_exec.c",
        file_line_num=3909, application_name="app",
    )  # fmt: skip
    (record,) = read(parser("jsonlog"), [line])
    assert record.message == 'a "quote", a\nnewline, a tab\t, \u00e9 and \x01'
    assert (record.sqlstate, record.detail, record.hint) == ("P0001", "d\\e", "h")
    assert record.location == "exec_stmt_raise, pl_exec.c:3909"


@pytest.mark.parametrize(
    "line",
    [
        b"",
        b"not json",
        b'["error_severity", "message"]',
        b'"a string"',
        b'{"error_severity": "LOG"}',  # no message
        b'{"message": "m"}',  # no severity
        b'{"error_severity": "LOG", "message": 5}',
        b'{"error_severity": "LOG", "message": "m", "pid": "12"}',
        b'{"error_severity": "LOG", "message": "m", "pid": true}',
        b'{"error_severity": "LOG", "message": "m", "hint": ["h"]}',
        b'{"error_severity": "LOG", "message": "m", "dbname": null, "state_code": 1}',
        b'{"error_severity": "LOG", "message": "m\x00"}',  # a raw control character
        b'{"error_severity": "LOG", "message": "m"',  # cut short
        b"[" * 100_000,  # deeper than the interpreter recurses
        b'{"error_severity": "LOG", "message": "m", "pid": 1' + b"0" * 5000 + b"}",
    ],
)
def test_a_jsonlog_line_that_is_no_record_is_unparsed(line: bytes) -> None:
    p = parser("jsonlog")
    good = jsonlog("LOG", "after")
    assert [r.message for r in read(p, [line, good])] == ["after"]
    assert p.unparsed == 1


def test_jsonlog_decodes_invalid_utf8_and_keeps_escaped_nul() -> None:
    line = jsonlog("LOG", "caf\u00e9").replace("é".encode(), b"\xff\xfe")
    escaped = b'{"error_severity":"LOG","message":"a\\u0000b"}'
    assert [r.message for r in read(parser("jsonlog"), [line, escaped])] == [
        "caf\ufffd\ufffd",
        "a\x00b",
    ]


def test_csvlog_embedded_newlines_quotes_and_windows_line_ends() -> None:
    lines = csvlog(
        "ERROR", 'two\nlines with "quotes"', "P0001", detail='"', hint="h,\n\n",
        query='select 1;\nselect ""; -- "', location="exec_stmt_raise, pl_exec.c:3909",
    )  # fmt: skip
    assert len(lines) == 5
    (record,) = read(p := parser("csvlog"), [line + b"\r" for line in lines])
    assert p.unparsed == 0
    assert (record.message, record.detail, record.hint) == (
        'two\nlines with "quotes"',
        '"',
        "h,\n\n",
    )
    assert record.location == "exec_stmt_raise, pl_exec.c:3909"


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (lambda line: line.replace(b',"postgres",', b",postgres,", 1), "a bare user name"),
        (lambda line: line.replace(b'"the message"', b"the message"), "a bare message"),
        (lambda line: line.replace(b",WARNING,", b',"WARNING",'), "a quoted severity"),
        (lambda line: line.replace(b",01000,", b",1000,"), "a SQLSTATE of four characters"),
        (lambda line: line.replace(b",4242,", b",42a,"), "a pid that is not a number"),
        (lambda line: line.replace(b"2026-12-01 23:31:27.352 UTC", b"yesterday"), "no time"),
        (lambda line: line + b",", "27 columns"),
        (lambda line: line.rsplit(b",", 1)[0], "25 columns"),
        (lambda line: line.replace(b'"the message"', b'"the "mess"age"'), "a lone quote inside"),
        (lambda line: line.replace(b'"the message"', b'"the message"x'), "text after a quote"),
    ],
)
def test_a_csvlog_record_not_as_postgresql_writes_it_is_unparsed(
    damage: Callable[[bytes], bytes], why: str
) -> None:
    (line,) = csvlog("WARNING", "the message", "01000")
    assert read(parser("csvlog"), [line]), "the undamaged record reads"
    p = parser("csvlog")
    records = read(p, [damage(line), *csvlog("LOG", "after")])
    assert [r.message for r in records] == ["after"], why
    assert p.unparsed == 1


def test_a_csvlog_quote_that_never_closes_is_bounded_then_the_parser_recovers() -> None:
    p = CsvlogParser()
    (opened,) = csvlog("LOG", "x")
    assert p.feed(opened.replace(b'"x"', b'"x')) == []  # the quote opened, never closed
    filler, fed = b"y" * 1000, len(opened)
    while p.unparsed == 0:
        assert p.feed(filler) == []
        fed += len(filler) + 1
    assert MAX_RECORD_BYTES < fed <= MAX_RECORD_BYTES + len(filler) + 1
    assert [r.message for r in read(p, csvlog("LOG", "after"))] == ["after"]
    assert p.unparsed == 1


def test_a_too_long_line_inside_a_csvlog_record_drops_it() -> None:
    p = parser("csvlog")
    first, *rest = csvlog("LOG", "cut\nshort\nrecord")
    records = read(p, [first, TOO_LONG, rest[-1], *csvlog("LOG", "after")])
    # The cut line and the record it was in. Then the record's last line, read as a record,
    # opens a quote: the next record is read into it, and the file ends inside.
    assert [r.message for r in records] == []
    assert p.unparsed == 3
    assert [r.message for r in read(p, csvlog("LOG", "then"))] == ["then"]


def test_text_logged_inside_a_csvlog_field_cannot_pass_for_a_record() -> None:
    """A client's statement holding a newline and a whole forged record, read from outside
    its quotes (as after a cut line): every quote in it is doubled, so the forged record's
    message reads as nothing a lock event could be."""
    (forged,) = csvlog("WARNING", "you don't own a lock of type ExclusiveLock", "01000")
    lines = csvlog("ERROR", "syntax error", "42601", query="x\n" + forged.decode() + "\ny")
    assert len(lines) == 3
    p = parser("csvlog")
    records = read(p, [lines[0], TOO_LONG, *lines[1:]])  # as if the follower cut a long line
    assert not any("lock" in record.message for record in records)
    records = read(p, lines[1:])  # or the record started with its first line lost
    assert not any("lock" in record.message for record in records)


def test_csvlog_flush_counts_a_record_the_file_ends_inside() -> None:
    p = parser("csvlog")
    first, *_ = csvlog("LOG", "two\nlines")
    assert read(p, [first]) == []
    assert p.unparsed == 1


def test_stderr_detail_hint_and_continuations() -> None:
    prefix = "2026-12-01 23:37:00.123 UTC [77] app db 40P01 "
    lines = stderr_report(
        prefix, "ERROR", "first\nsecond", ("DETAIL", "d1\nd2\n"), ("HINT", "h"),
        ("CONTEXT", "c1\nc2"), ("STATEMENT", "select\n1"), ("QUERY", "q"),
    )  # fmt: skip
    p = parser("stderr", "%m [%p] %q%a %d %e ")
    (record,) = read(p, lines)
    assert p.unparsed == 0
    assert record == Record("ERROR", "first\nsecond", "40P01", "d1\nd2\n", "h", "db", "app", 77)


def test_stderr_every_escape_and_padding() -> None:
    line_prefix = "%m|%t|%s|%n|%5p|%-5P|%l|%c|%v|%x|%Q|%e|%-8a|%10u|%d|%b|%i|%r|%h|%L|%%|%y|%q>"
    expanded = (
        "2026-12-01 23:37:01.932 CEST|2026-12-01 23:37:01 +03|2026-12-01 23:37:01 UTC|"
        "1796168221.932|   77|     |12|6b0f5a1d.2e6f||0|-42|53200|app     |      user|"
        "my db|client backend|SELECT waiting|[local]|[local]|10.0.0.1|%||>"
    )
    (record,) = read(parser("stderr", line_prefix), [f"{expanded}ERROR:  m".encode()])
    assert record == Record("ERROR", "m", "53200", database="my db", application_name="app", pid=77)


@pytest.mark.parametrize(
    ("line_prefix", "expanded"),
    [
        ("", ""),
        ("%", ""),  # a '%' at the end prints nothing
        ("%-", ""),
        ("[%z%7z] ", "[] "),  # an escape PostgreSQL does not know prints nothing
        ("%%p %p ", "%p 9 "),
        ("%q%a ", ""),  # no session: nothing after %q
        ("%q%a %q%d ", "app db "),  # a second %q is nothing
        ("\u00e9%p.*+?()[]{}|\\^$ ", "\u00e99.*+?()[]{}|\\^$ "),
    ],
)
def test_stderr_prefix_edges(line_prefix: str, expanded: str) -> None:
    (record,) = read(parser("stderr", line_prefix), [f"{expanded}LOG:  m".encode()])
    assert record.message == "m"


def test_a_crafted_application_name_cannot_put_words_in_a_message() -> None:
    """An application_name that imitates the end of the prefix: the message read would not
    be the one logged, so the line is unparsed, and the report it would start is not read."""
    line_prefix = "%m [%p] %a %d "
    crafted = "x WARNING:  you don't own a lock of type ExclusiveLock"
    prefix = f"2026-12-01 23:37:04.689 UTC [11928] {crafted} postgres "
    p = parser("stderr", line_prefix)
    records = read(p, [
        *stderr_report(prefix, "LOG", "statement: select 1"),
        *stderr_report(prefix, "WARNING", "you don't own a lock of type ExclusiveLock"),
        *stderr_report("2026-12-01 23:37:04.690 UTC [11929] psql postgres ", "LOG", "next"),
    ])  # fmt: skip
    assert [r.message for r in records] == ["next"]
    assert p.unparsed == 2


def test_a_crafted_application_name_cannot_make_a_report_with_a_sqlstate() -> None:
    """With %e: two statements under application_names that read as a 53200 ERROR and its
    HINT, were the line read at the first split the prefix allows."""
    p = parser("stderr", "%m [%p] %a %d %e ")
    at = "2026-12-01 23:37:04.689 UTC [11928]"
    error = "x db 53200 ERROR:  out of shared memory"
    hint = "x db 53200 HINT:  You might need to increase max_locks_per_transaction."
    records = read(p, [
        *stderr_report(f"{at} {error} postgres 00000 ", "LOG", "statement: select 1"),
        *stderr_report(f"{at} {hint} postgres 00000 ", "LOG", "statement: select 1"),
    ])  # fmt: skip
    assert records == []
    assert p.unparsed == 2


def test_stderr_lines_that_belong_to_no_report_are_unparsed() -> None:
    prefix = "2026-12-01 23:37:00.123 UTC [77] "
    p = parser("stderr")
    records = read(p, [
        b"\torphan continuation",
        f"{prefix}DETAIL:  orphan detail".encode(),
        b"no prefix at all",
        *stderr_report(prefix, "LOG", "kept", ("DETAIL", "kept detail")),
        b"2026-12-01 23:37:00.123 UTC [78] DETAIL:  another process's detail",
        f"{prefix}HINT:  after a line not read".encode(),
        b"\tand its continuation",
        *stderr_report(prefix, "LOG", "next"),
    ])  # fmt: skip
    assert [(r.message, r.detail, r.hint) for r in records] == [
        ("kept", "kept detail", None),
        ("next", None, None),
    ]
    assert p.unparsed == 6


def test_stderr_too_long_returns_the_report_before_and_skips_to_the_next() -> None:
    prefix = "2026-12-01 23:37:00.123 UTC [77] "
    p = parser("stderr")
    records = read(p, [
        *stderr_report(prefix, "LOG", "before", ("DETAIL", "d")),
        TOO_LONG,
        b"\tthe cut part's continuation",
        f"{prefix}HINT:  the cut report's hint".encode(),
        *stderr_report(prefix, "LOG", "after"),
    ])  # fmt: skip
    assert [(r.message, r.detail, r.hint) for r in records] == [
        ("before", "d", None),
        ("after", None, None),
    ]
    assert p.unparsed == 3


def test_stderr_bounds_what_a_report_keeps_not_what_it_skips() -> None:
    prefix = "2026-12-01 23:37:00.123 UTC [77] "
    p = parser("stderr")
    many = "\n".join(["x"] * (MAX_RECORD_LINES + 1))
    records = read(p, [
        *stderr_report(prefix, "ERROR", "long statement", ("STATEMENT", many)),
        *stderr_report(prefix, "ERROR", "long detail", ("DETAIL", many), ("HINT", "h")),
        *stderr_report(prefix, "ERROR", "wide detail", ("DETAIL", "y" * (MAX_RECORD_BYTES + 1))),
        *stderr_report(prefix, "LOG", "after"),
    ])  # fmt: skip
    assert [r.message for r in records] == ["long statement", "after"]
    assert p.unparsed == 2  # the two reports dropped, each with all its lines


def test_stderr_invalid_utf8_and_nul() -> None:
    line = b"2026-12-01 23:37:00.123 UTC [77] LOG:  caf\xc3\xa9 \xff\x00 end"
    (record,) = read(parser("stderr"), [line])
    assert record.message == "caf\u00e9 \ufffd\x00 end"


AT = b"2026-12-01 23:37:00.123 UTC [7] "


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("fmt", "line"),
    [
        ("stderr", AT + b"@/ " * 350_000),  # ways to split it among %u, %d and %a
        ("stderr", AT + b"a@b/c 00000 LOG:  " + b"LOG:  " * 170_000),
        (
            "stderr",
            AT
            + b"a@b/c 00000 LOG:  process 1 still waiting for ShareLock on "
            + b"x after 1.000 ms" * 60_000,
        ),
        ("csvlog", b'"' * 1_000_000),
        ("csvlog", b"2026-12-01 23:37:00.123 UTC," + b'"",' * 300_000),
        ("jsonlog", b"[" * 1_000_000),
        ("jsonlog", b'{"a":' * 200_000),
    ],
)
def test_a_megabyte_line_built_against_the_parser_reads_at_once(fmt: Format, line: bytes) -> None:
    """What the follower hands on under its maximum length: read in one pass, whatever it
    holds. (The first line's prefix pattern in Python's re, which backtracks, took 8 s on
    3,600 bytes of it, and grows with the cube of the length.)"""
    p = parser(fmt, "%m [%p] %q%u@%d/%a %e ")
    started = time.perf_counter()
    records = read(p, [line])
    assert time.perf_counter() - started < 1.0
    assert len(records) + p.unparsed == 1


def test_parser_refuses_an_unknown_format() -> None:
    with pytest.raises(ValueError, match="unknown log format 'syslog'"):
        parser("syslog")  # type: ignore[arg-type]


# Any input: nothing raises, and every line is in a record or counted.

LINES = st.lists(st.one_of(st.binary(max_size=300), st.just(TOO_LONG)), max_size=40)


@given(LINES)
def test_any_lines_never_raise(lines: list[Line]) -> None:
    for name in ("jsonlog", "csvlog", "stderr"):
        p = parser(name)
        records = read(p, lines)
        assert len(records) + p.unparsed <= len(lines), name
    p = parser("jsonlog")
    assert len(read(p, lines)) + p.unparsed == len(lines)


def _single_line(fmt: str) -> st.SearchStrategy[bytes]:
    """A one-line record of `fmt`, or anything that is none."""
    text = st.text(max_size=50)
    if fmt == "jsonlog":
        return text.map(lambda message: jsonlog("LOG", message))
    one_line = text.map(lambda message: message.replace("\n", " "))
    if fmt == "csvlog":
        return one_line.map(lambda message: csvlog("LOG", message)[0])
    stderr = one_line.map(lambda message: f"2026-12-01 23:37:00.123 UTC [7] LOG:  {message}")
    return stderr.map(str.encode).filter(lambda line: not _unclear(line))


def _unclear(line: bytes) -> bool:
    """Whether a line would not read as one report: no prefix, or a label's two spaces in
    its text."""
    read_line = LinePattern("%m [%p] ").match(line)
    return read_line is None or b":  " in line[read_line.text_start :]


def _not_a_line(fmt: str) -> st.SearchStrategy[bytes]:
    """Bytes that start no record and join none: no quote for csvlog, no tab for stderr."""
    junk = st.binary(max_size=100)
    if fmt == "csvlog":
        return junk.map(lambda line: line.replace(b'"', b"'"))
    if fmt == "stderr":
        pattern = LinePattern("%m [%p] ")
        return junk.filter(lambda line: not line.startswith(b"\t") and not pattern.match(line))
    return junk.filter(lambda line: not line.strip().startswith(b"{"))


@pytest.mark.parametrize("fmt", ["jsonlog", "csvlog", "stderr"])
@given(data=st.data())
def test_records_and_unparsed_account_for_every_line(fmt: str, data: st.DataObject) -> None:
    line = st.one_of(_single_line(fmt), _not_a_line(fmt), st.just(TOO_LONG))
    lines = data.draw(st.lists(line))
    p = parser(fmt)  # type: ignore[arg-type]
    records = read(p, lines)
    assert len(records) + p.unparsed == len(lines)


NAMES = st.text("abcxyz-_.0123456789", min_size=1, max_size=20)


@given(NAMES, NAMES, NAMES, st.integers(1, 2**22), st.text(max_size=40))
def test_stderr_prefix_fields_read_back(
    application_name: str, user: str, database: str, pid: int, message: str
) -> None:
    line_prefix = "%m [%5p] %q%u@%d/%-12a %e "
    at = "2026-12-01 23:37:00.123 UTC"
    expanded = f"{at} [{pid:5d}] {user}@{database}/{application_name:<12} 00000 "
    message = message.replace("\n", " ").replace("\r", " ")
    line = f"{expanded}LOG:  {message}".encode()
    if b":  " in message.encode():
        return
    (record,) = read(parser("stderr", line_prefix), [line])
    assert record == Record("LOG", message, "00000", None, None, database, application_name, pid)


# A burst: what the parsers hold, and how fast they read.


def _burst() -> list[Line]:
    """The lines of a busy stderr log that a burst repeats: short reports, multi-line ones,
    junk, crafted prefixes, cut lines."""
    prefix = "2026-12-01 23:37:00.123 UTC [77] app db 00000 "
    waiting = "process 77 still waiting for ExclusiveLock on advisory lock [5,0,7,1] after 1.042 ms"
    cycle_detail = (
        "Process 1 waits for ExclusiveLock on advisory lock [5,0,1,1]; blocked by process 2.\n"
        "Process 2 waits for ShareLock on transaction 9; blocked by process 1.\n"
        "Process 1: select 1\nProcess 2: select\n  2"
    )
    cycle: list[Line] = [
        *stderr_report(prefix, "LOG", waiting, ("DETAIL", "Process holding the lock: 76."),
                       ("STATEMENT", "select pg_advisory_lock(7)")),
        *stderr_report(prefix, "ERROR", "deadlock detected", ("DETAIL", cycle_detail),
                       ("HINT", "See server log for query details.")),
        *stderr_report(prefix, "LOG", "statement: " + "x" * 2000),
        b"\xff\xfe not a log line \x00",
        TOO_LONG,
        *stderr_report("2026-12-01 23:37:00.123 UTC [78] x WARNING:  y db 00000 ", "LOG", "z"),
    ]  # fmt: skip
    return cycle


def _lines(burst: Sequence[Line], big: Sequence[Line], total: int = 30_000) -> Iterator[Line]:
    yield from big
    yield from itertools.islice(itertools.cycle(burst), total - len(big))


def test_a_burst_of_lines_in_bounded_memory() -> None:
    """30,000 lines, the first a report whose detail goes past the bound (12,000 lines)."""
    burst, prefix = _burst(), "2026-12-01 23:37:00.123 UTC [77] app db 00000 "
    big = stderr_report(prefix, "LOG", "big", ("DETAIL", "\n".join(["w" * 100] * 12_000)))
    lines = 0
    tracemalloc.start()  # the lines exist already: what is traced is the parser's
    try:
        p = StderrParser("%m [%p] %q%a %d %e ")
        for line in _lines(burst, big):
            p.feed(line)
            lines += 1
        p.flush()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert lines == 30_000
    assert p.unparsed > 0
    assert peak < 5 * 2**20, f"peak {peak / 2**20:.2f} MiB"


def test_the_parsers_meet_the_protocol() -> None:
    parsers: Mapping[str, Parser] = {
        "jsonlog": JsonlogParser(),
        "csvlog": CsvlogParser(),
        "stderr": StderrParser(),
    }
    for name, p in parsers.items():
        assert type(parser(name)) is type(p)  # type: ignore[arg-type]
        assert p.unparsed == 0
