"""Following the server's log (serverlog/follower.py) on real files: from the end, through
rotation, replacement and truncation, a complete line at a time, within bounds whatever the
input."""

from __future__ import annotations

import errno
import os
import stat
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import Clock

from pg_advisory_exporter.serverlog.follower import TOO_LONG, Follower, Status, TooLong

Follow = Callable[..., Follower]
Line = bytes | TooLong
# Modification times set by the tests (nanoseconds): the order of a directory's files.
EPOCH = 1_700_000_000 * 10**9
SECOND = 10**9


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def follow(clock: Clock) -> Iterator[Follow]:
    """Followers on the test's clock, closed at the end."""
    made: list[Follower] = []

    def start(path: Path, **options: Any) -> Follower:
        made.append(Follower(path, clock=clock, **options))
        return made[-1]

    yield start
    for follower in made:
        follower.close()


def append(path: Path, data: bytes, mtime: int | None = None) -> None:
    """Write at the end of a file; with `mtime` (ns), date the write then."""
    with path.open("ab") as file:
        file.write(data)
    if mtime is not None:
        os.utime(path, ns=(mtime, mtime))


def write(path: Path, data: bytes, mtime: int) -> Path:
    """A file of the directory, modified at `mtime` (ns)."""
    path.write_bytes(data)
    os.utime(path, ns=(mtime, mtime))
    return path


def drain(follower: Follower, calls: int = 20) -> list[Line]:
    """The lines of that many calls: a call may read max_read bytes and hand out none (of a
    line that is not complete yet, or too long), so one with none does not say it is all."""
    return [line for _ in range(calls) for line in follower.lines()]


def numbered(count: int, prefix: str = "line") -> list[bytes]:
    return [f"{prefix} {i}".encode() for i in range(count)]


def joined(lines: list[bytes]) -> bytes:
    return b"".join(line + b"\n" for line in lines)


# Where reading starts.


def test_a_file_is_read_from_its_end_then_what_is_appended(tmp_path: Path, follow: Follow) -> None:
    log = tmp_path / "postgresql.log"
    log.write_bytes(b"before 1\nbefore 2\nwritten befo")
    follower = follow(log)
    assert follower.lines() == []
    assert follower.status() == Status(readable=True, error=None, path=log)
    # The rest of the line the server was writing at the start is of the past too.
    append(log, b"re the start\nafter 1\nafter 2\n")
    assert follower.lines() == [b"after 1", b"after 2"]
    assert follower.lines() == []
    append(log, b"after 3\n")
    assert follower.lines() == [b"after 3"]


def test_a_directory_is_read_from_the_end_of_its_newest_file_by_time_not_name(
    tmp_path: Path, follow: Follow
) -> None:
    # log_filename need not sort: the newest file has the smallest name.
    write(tmp_path / "postgresql-c.log", b"old\n", EPOCH)
    write(tmp_path / "postgresql-b.log", b"older\n", EPOCH - SECOND)
    newest = write(tmp_path / "postgresql-a.log", b"before\n", EPOCH + SECOND)
    write(tmp_path / "postgresql-z.csv", b"another format\n", EPOCH + 2 * SECOND)
    follower = follow(tmp_path, suffix=".log")
    assert follower.lines() == []
    assert follower.status() == Status(readable=True, error=None, path=newest)
    append(newest, b"after\n")
    assert follower.lines() == [b"after"]


def test_lines_split_on_newlines_only_keeping_carriage_returns_nul_and_junk(
    tmp_path: Path, follow: Follow
) -> None:
    log = tmp_path / "postgresql.log"
    log.touch()
    follower = follow(log)
    append(log, b"crlf\r\n\x00nul\x00\n\xff\xfe junk \x80\n\n\rcr only\rstill one\n")
    assert follower.lines() == [
        b"crlf\r",
        b"\x00nul\x00",
        b"\xff\xfe junk \x80",
        b"",
        b"\rcr only\rstill one",
    ]


def test_a_partial_line_is_held_back_until_its_newline(tmp_path: Path, follow: Follow) -> None:
    log = tmp_path / "postgresql.log"
    log.touch()
    follower = follow(log)
    append(log, b"complete\nthe server is wri")
    assert follower.lines() == [b"complete"]
    append(log, b"ting")
    assert follower.lines() == []
    append(log, b" this line\nnext")
    assert follower.lines() == [b"the server is writing this line"]
    append(log, b"\n")
    assert follower.lines() == [b"next"]


# Rotation.


def test_a_file_truncated_in_place_is_read_again_from_its_start(
    tmp_path: Path, follow: Follow
) -> None:
    # logrotate's copytruncate: the lines are copied away, the file cut to nothing.
    log = tmp_path / "postgresql.log"
    log.write_bytes(b"before the start, a long line that makes the file longer\n")
    follower = follow(log)
    append(log, b"counted\nhalf a li")
    assert follower.lines() == [b"counted"]
    (tmp_path / "postgresql.log.1").write_bytes(log.read_bytes())
    with log.open("r+b") as file:
        file.truncate(0)
    append(log, b"after the truncation\n")
    # The half line went with the copy: the new file's first line is whole.
    assert follower.lines() == [b"after the truncation"]
    assert follower.status().readable


def test_a_replaced_file_is_read_to_its_end_then_the_new_one_from_its_start(
    tmp_path: Path, follow: Follow
) -> None:
    log = tmp_path / "postgresql.log"
    log.write_bytes(b"before\n")
    follower = follow(log)
    append(log, b"old 1\n")
    assert follower.lines() == [b"old 1"]
    # logrotate's way: renamed away, written to until the writer reopens, created again.
    old = log.rename(tmp_path / "postgresql.log.1")
    append(old, b"old 2\nold 3, its last line without a newline")
    log.write_bytes(b"new 1\nnew 2\n")
    assert follower.lines() == [
        b"old 2",
        b"old 3, its last line without a newline",
        b"new 1",
        b"new 2",
    ]
    assert follower.status() == Status(readable=True, error=None, path=log)
    append(log, b"new 3\n")
    assert follower.lines() == [b"new 3"]


def test_a_path_gone_leaves_the_open_file_read_and_says_so(tmp_path: Path, follow: Follow) -> None:
    log = tmp_path / "postgresql.log"
    log.touch()
    follower = follow(log)
    old = log.rename(tmp_path / "postgresql.log.1")
    append(old, b"still written\n")
    assert follower.lines() == [b"still written"]
    assert follower.status() == Status(readable=False, error="no such file", path=log)
    log.write_bytes(b"created again\n")
    assert follower.lines() == [b"created again"]
    assert follower.status().readable


@pytest.mark.parametrize("max_read", [1024 * 1024, 100])
def test_two_rotations_between_two_calls_lose_no_line_and_keep_the_order(
    tmp_path: Path, follow: Follow, max_read: int
) -> None:
    first = write(tmp_path / "postgresql-3.log", b"before\n", EPOCH)
    follower = follow(tmp_path, suffix=".log", max_read=max_read)
    append(first, b"first 1\nfirst 2, cut by the rotation", EPOCH)
    # Names that sort against the order of time; each rotation after the last write.
    write(tmp_path / "postgresql-2.log", joined(numbered(5, "second")), EPOCH + SECOND)
    third = write(tmp_path / "postgresql-1.log", joined(numbered(5, "third")), EPOCH + 2 * SECOND)
    append(third, b"third, being written")
    expected = [b"first 1", b"first 2, cut by the rotation"]
    expected += numbered(5, "second") + numbered(5, "third")
    assert drain(follower) == expected
    assert follower.status() == Status(readable=True, error=None, path=third)
    append(third, b"\n")
    assert follower.lines() == [b"third, being written"]


def test_a_name_used_again_resumes_if_appended_to_and_starts_over_if_rewritten(
    tmp_path: Path, follow: Follow, clock: Clock
) -> None:
    # log_filename = postgresql-%a.log: a week later, the same names again.
    monday = write(tmp_path / "postgresql-Mon.log", b"last monday, before the start\n", EPOCH)
    tuesday = write(tmp_path / "postgresql-Tue.log", b"last tuesday\n", EPOCH + SECOND)
    follower = follow(tmp_path, suffix=".log")
    append(tuesday, b"tuesday\n", EPOCH + SECOND)
    # log_truncate_on_rotation off: Monday's file appended to, in place (no new file).
    append(monday, b"monday again\n", EPOCH + 2 * SECOND)
    clock.now += 60
    assert drain(follower) == [b"tuesday", b"monday again"]
    # On: Tuesday's file rewritten from its start.
    tuesday.write_bytes(b"tuesday, a week later\n")
    os.utime(tuesday, ns=(EPOCH + 3 * SECOND, EPOCH + 3 * SECOND))
    clock.now += 60
    assert drain(follower) == [b"tuesday, a week later"]


def test_a_directory_unchanged_is_scanned_again_on_the_clock(
    tmp_path: Path, follow: Follow, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = write(tmp_path / "postgresql-Mon.log", b"monday\n", EPOCH)
    write(tmp_path / "postgresql-Tue.log", b"tuesday\n", EPOCH + SECOND)
    settle(tmp_path)
    follower = follow(tmp_path, suffix=".log")
    scans = count_calls(monkeypatch, "scandir")
    assert follower.lines() == []
    assert scans() == 0
    # A name used again is written in place: the directory does not change.
    append(old, b"monday again\n", EPOCH + 2 * SECOND)
    clock.now += 4.9
    assert follower.lines() == []
    clock.now += 0.1
    assert follower.lines() == [b"monday again"]
    assert scans() == 1
    # A new file changes the directory: found at once.
    write(tmp_path / "postgresql-Wed.log", b"wednesday\n", EPOCH + 3 * SECOND)
    assert follower.lines() == [b"wednesday"]
    assert scans() == 2


def settle(folder: Path) -> None:
    """Date the directory's last change a minute back: a time so far past is trusted (one of
    now may yet move within its tick), so that the directory is scanned on the clock."""
    settled = time.time_ns() - 60 * SECOND
    os.utime(folder, ns=(settled, settled))


def count_calls(monkeypatch: pytest.MonkeyPatch, name: str) -> Callable[[], int]:
    """How many times the follower calls os.`name` from now on."""
    real = getattr(os, name)
    calls = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(os, name, counted)
    return lambda: len(calls)


def test_thousands_of_old_files_cost_one_scan_and_no_open_per_call(
    tmp_path: Path, follow: Follow, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    count = 2000
    for i in range(count):
        write(tmp_path / f"postgresql-{i:05}.log", f"old {i}\n".encode(), EPOCH + i * SECOND)
    newest = tmp_path / f"postgresql-{count - 1:05}.log"
    settle(tmp_path)
    started = time.perf_counter()
    follower = follow(tmp_path, suffix=".log")
    construction = time.perf_counter() - started
    opens = count_calls(monkeypatch, "open")
    scans = count_calls(monkeypatch, "scandir")
    clock.now += 60  # a scan is due
    started = time.perf_counter()
    assert follower.lines() == []
    scan = time.perf_counter() - started
    assert (scans(), opens()) == (1, 0)
    started = time.perf_counter()
    assert follower.lines() == []  # a scan is not due: the directory has not changed
    quiet = time.perf_counter() - started
    assert scans() == 1
    append(newest, b"new\n", EPOCH + (count - 1) * SECOND)
    rotated = write(tmp_path / "postgresql-a.log", b"rotated\n", EPOCH + count * SECOND)
    started = time.perf_counter()
    assert follower.lines() == [b"new", b"rotated"]
    rotation = time.perf_counter() - started
    assert (scans(), opens()) == (2, 1)
    assert follower.status().path == rotated
    print(
        f"{count} old files: the follower's start {construction * 1000:.1f} ms, a call that"
        f" scans {scan * 1000:.1f} ms, one that need not {quiet * 1000:.2f} ms, a rotation"
        f" {rotation * 1000:.1f} ms"
    )


# Missing and unreadable.


def test_a_file_missing_at_the_start_is_read_from_its_start_once_created(
    tmp_path: Path, follow: Follow
) -> None:
    log = tmp_path / "postgresql.log"
    follower = follow(log)
    assert follower.lines() == []
    assert follower.status() == Status(readable=False, error="no such file", path=None)
    assert follower.lines() == []
    # Created after the start: all it holds was written after it.
    log.write_bytes(b"first\nsecond\n")
    assert follower.lines() == [b"first", b"second"]
    assert follower.status() == Status(readable=True, error=None, path=log)


def test_a_directory_missing_or_empty_at_the_start_is_read_from_the_start_of_its_files(
    tmp_path: Path, follow: Follow
) -> None:
    folder = tmp_path / "log"
    follower = follow(folder, suffix=".json")
    assert follower.status() == Status(readable=False, error="no such file", path=None)
    folder.mkdir()
    write(folder / "postgresql.log", b"another format\n", EPOCH)
    assert follower.lines() == []
    assert follower.status() == Status(
        readable=False, error="no .json file in the directory", path=None
    )
    write(folder / "postgresql-1.json", b'{"n": 1}\n', EPOCH + SECOND)
    write(folder / "postgresql-2.json", b'{"n": 2}\n', EPOCH + 2 * SECOND)
    assert follower.lines() == [b'{"n": 1}', b'{"n": 2}']
    assert follower.status().path == folder / "postgresql-2.json"


def test_an_unreadable_path_is_said_and_read_from_its_end_once_readable(
    tmp_path: Path, follow: Follow
) -> None:
    # As root, chmod stops no read: a link to itself fails for everyone (ELOOP).
    log = tmp_path / "postgresql.log"
    log.symlink_to(log)
    follower = follow(log)
    assert follower.lines() == []
    assert follower.status() == Status(
        readable=False, error="too many levels of symbolic links", path=None
    )
    log.unlink()
    log.write_bytes(b"written while it could not be read\n")
    # It existed at the start: what it holds may be of before the start.
    assert follower.lines() == []
    assert follower.status() == Status(readable=True, error=None, path=log)
    append(log, b"after\n")
    assert follower.lines() == [b"after"]


def test_a_path_that_is_no_regular_file_is_said(tmp_path: Path, follow: Follow) -> None:
    fifo = tmp_path / "postgresql.log"
    os.mkfifo(fifo)
    follower = follow(fifo)
    assert follower.lines() == []
    assert follower.status() == Status(readable=False, error="not a regular file", path=None)


def test_permission_denied_is_said_and_a_file_of_the_directory_waited_for(
    tmp_path: Path, follow: Follow, monkeypatch: pytest.MonkeyPatch
) -> None:
    current = write(tmp_path / "postgresql-1.log", b"", EPOCH)
    follower = follow(tmp_path, suffix=".log")
    append(current, b"last line", EPOCH)
    denied = write(tmp_path / "postgresql-2.log", b"second\n", EPOCH + SECOND)
    denied.chmod(0)
    if os.geteuid() == 0:  # as root, the mode denies nothing: the kernel's answer, faked
        real = os.open

        def refusing(path: Any, *args: Any, **kwargs: Any) -> int:
            if Path(path) == denied and stat.S_IMODE(os.stat(path).st_mode) == 0:
                raise PermissionError(errno.EACCES, "Permission denied", str(path))
            return real(path, *args, **kwargs)

        monkeypatch.setattr(os, "open", refusing)
    write(tmp_path / "postgresql-3.log", b"third\n", EPOCH + 2 * SECOND)
    assert follower.lines() == []  # the last line waits with its file
    assert follower.status() == Status(readable=False, error="permission denied", path=current)
    denied.chmod(0o644)
    assert follower.lines() == [b"last line", b"second", b"third"]
    assert follower.status().readable


# Bounds.


def test_a_10_mb_line_without_newline_is_too_long_once_in_bounded_memory(
    tmp_path: Path, follow: Follow
) -> None:
    log = tmp_path / "postgresql.log"
    log.touch()
    max_line = 64 * 1024
    follower = follow(log, max_line=max_line)
    append(log, b"before\n" + b"x" * (10 * 1024 * 1024))
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        got = drain(follower)
        append(log, b"x" * 1000)
        got += follower.lines()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got == [b"before", TOO_LONG]
    append(log, b"\nafter\n")
    assert follower.lines() == [b"after"]
    print(f"a 10 MB line: {peak / 1024:.0f} KiB at most allocated while reading it")
    # What is held (max_line and one read of 64 KiB) and a copy of it at most: not the line.
    assert peak < 2 * (max_line + 64 * 1024)


def test_lines_over_max_line_become_too_long_and_those_at_it_stay(
    tmp_path: Path, follow: Follow
) -> None:
    log = tmp_path / "postgresql.log"
    log.touch()
    follower = follow(log, max_line=10)
    append(log, b"0123456789\n0123456789a\nshort\n0123456")
    assert follower.lines() == [b"0123456789", TOO_LONG, b"short"]
    append(log, b"789ab")  # too long before its newline comes: said once
    assert follower.lines() == [TOO_LONG]
    append(log, b"cdef" * 100)
    assert follower.lines() == []
    append(log, b"\nnext\n")
    assert follower.lines() == [b"next"]


def read_sizes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of each read the follower makes from now on."""
    sizes: list[int] = []
    real = os.pread

    def measured(fd: int, size: int, offset: int) -> bytes:
        data = real(fd, size, offset)
        sizes.append(len(data))
        return data

    monkeypatch.setattr(os, "pread", measured)
    return sizes


def test_a_burst_of_100000_lines_is_handed_out_over_calls_of_max_read(
    tmp_path: Path, follow: Follow, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "postgresql.log"
    log.touch()
    max_read = 256 * 1024
    follower = follow(log, max_read=max_read)
    burst = numbered(100_000, "2026-01-01 00:00:00.000 UTC [4242] LOG:  a burst, line")
    append(log, joined(burst))
    reads = read_sizes(monkeypatch)
    got: list[Line] = []
    calls = 0
    while lines := follower.lines():
        calls += 1
        assert sum(reads) <= max_read
        reads.clear()
        got += lines
    assert got == burst
    assert calls >= len(joined(burst)) // max_read


def test_a_closed_follower_reads_nothing_and_holds_no_file(tmp_path: Path, follow: Follow) -> None:
    log = tmp_path / "postgresql.log"
    log.touch()
    follower = follow(log)
    before = len(os.listdir("/proc/self/fd"))
    follower.close()
    assert len(os.listdir("/proc/self/fd")) == before - 1
    append(log, b"after the close\n")
    assert follower.lines() == []
    assert follower.status() == Status(readable=False, error="closed", path=None)
    follower.close()


# Whatever the writes and the reads, the lines handed out are the lines written.

TEXT = st.lists(st.sampled_from([b"a", b"bc", b"\n", b"\r", b"\x00", b"defghij"]), max_size=30)


@given(
    writes=st.lists(st.tuples(TEXT.map(b"".join), st.booleans()), max_size=20),
    max_read=st.integers(min_value=1, max_value=40),
)
@settings(max_examples=200, deadline=None)
def test_the_lines_handed_out_are_the_complete_lines_written(
    writes: list[tuple[bytes, bool]], max_read: int
) -> None:
    max_line = 8
    with tempfile.TemporaryDirectory() as folder:
        log = Path(folder) / "postgresql.log"
        log.touch()
        follower = Follower(log, max_line=max_line, max_read=max_read)
        got: list[Line] = []
        for data, read in writes:
            append(log, data)
            if read:
                got += follower.lines()
        got += drain(follower, calls=len(b"".join(data for data, _ in writes)) // max_read + 2)
        follower.close()
    *complete, partial = b"".join(data for data, _ in writes).split(b"\n")
    expected: list[Line] = [line if len(line) <= max_line else TOO_LONG for line in complete]
    if len(partial) > max_line:
        expected.append(TOO_LONG)
    assert got == expected
