"""Following the server's log: a file, or the newest file of its log_directory and each newer
one the server rotates to, read from where the exporter started a complete line at a time,
never more than a bounded amount at once."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final, NamedTuple

_CHUNK: Final = 64 * 1024  # one read: what is held beyond max_line at most
# The first bytes of a file left for a newer one, which tell whether a name the server uses
# again (log_filename = postgresql-%a.log) was appended to or rewritten when it comes back.
_HEAD: Final = 64
_REMEMBERED: Final = 1024  # files whose place and head are kept, the latest left
# A directory whose modification time is unchanged has no new file: it is scanned again
# after this many seconds only (a name reused is written in place, which that time misses).
_SCAN_EVERY: Final = 5.0
# Until then a directory's time may still move within the tick it shows: it proves nothing.
_RACY_NS: Final = 2_000_000_000
_REASONS: Final = {
    errno.ENOENT: "no such file",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
}

_Identity = tuple[int, int]  # (st_dev, st_ino)


class TooLong:
    """A line longer than max_line: handed out once in its place, the rest of it skipped."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "TOO_LONG"


TOO_LONG: Final = TooLong()

Line = bytes | TooLong


@dataclass(frozen=True)
class Status:
    """Whether the log can be read; if not, why (None when it can); the file being read."""

    readable: bool
    error: str | None
    path: Path | None


class _Found(NamedTuple):
    """A file to read, as a look found it."""

    key: tuple[int, str]  # (st_mtime_ns, name): the order of a directory's files
    path: str


@dataclass
class _Reading:
    """The file being read, and where."""

    fd: int
    path: Path
    identity: _Identity
    offset: int


class _Left(NamedTuple):
    """A file read until a newer one came: where it ended and how it began."""

    size: int
    head: bytes


def _reason(error: OSError) -> str:
    if error.errno in _REASONS:
        return _REASONS[error.errno]
    return os.strerror(error.errno).lower() if error.errno else str(error)


def _head(fd: int) -> bytes:
    return os.pread(fd, _HEAD, 0)


class Follower:
    """The complete lines written to a log since the follower started.

    `path` is a file, or a directory (the server's log_directory) whose files ending with
    `suffix` are followed: the newest (by modification time, then name: names need not sort),
    then each newer one as the server rotates, from its start, after the rest of the one
    before. A file path that is replaced (renamed away and created again: a new inode) is read
    to its end from the open file, then the new one from its start; a file truncated below
    the place reached (copy-truncate) is read again from its start.

    Where reading starts: the first file opened is read from its end, as what it holds was
    written before the exporter started, and Prometheus counters start at zero (the rest of a
    partial last line is skipped with it). But when the path was missing at the start (no
    such file or directory, or a directory without a file of the suffix), whatever appears
    later was written after the start and is read from its start. A path that existed but
    could not be read at the start (permission, not a regular file) may hold anything by the
    time it can: it is read from its end, undercounting rather than counting the past.

    A name the server uses again (log_filename with %a, %d, %H...) is a newer file again when
    it is written: from its start if it was rewritten (log_truncate_on_rotation), from where
    it ended if it is the same file appended to (its size and first bytes as they were when
    the follower left it or, for the older files at the start, saw them). A file of the
    directory that cannot be opened (not one that went away) is waited for, with its error
    in the status: the files after it come after it.

    A partial last line is held back until its newline comes, except at the end of a file
    rotated away, where it is complete. Lines split on b"\\n" only (b"\\r" and NUL bytes stay
    in them); one longer than `max_line` is handed out as TOO_LONG once, the rest of it
    skipped, so at most max_line bytes and one read are ever held. A call reads at most
    `max_read` bytes. `clock` times the directory's scans (`_SCAN_EVERY`).

    `lines()` and `close()` may be called from different threads, `status()` from any.
    """

    def __init__(
        self,
        path: Path,
        *,
        suffix: str = "",
        max_line: int = 64 * 1024,
        max_read: int = 1024 * 1024,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_line < 1 or max_read < 1:
            raise ValueError("max_line and max_read are counts of bytes, at least 1")
        self._path = path
        self._suffix = suffix
        self._max_line = max_line
        self._max_read = max_read
        self._clock = clock
        self._lock = threading.Lock()  # one reader at a time, and no close under it
        self._file: _Reading | None = None
        self._next: list[_Found] = []  # the files to read after it, oldest first
        self._pending = bytearray()  # the partial last line, up to max_line
        self._skipping = False  # in a line too long, until its newline
        self._left: dict[_Identity, _Left] = {}
        self._scanned: tuple[tuple[int, int, int], float] | None = None  # (dev, ino, mtime), when
        self._error: str | None = None
        self._missing = False  # the last look found no file
        self._from_end = True  # until the first file is opened
        self._closed = False
        with self._lock:
            self._look()
            while self._next and self._switch([]):
                pass
            if self._file is None and self._missing:
                self._from_end = False
            self._status = self._state()

    def lines(self) -> list[bytes | TooLong]:
        """The complete lines written since the last call (or the start), in order; at most
        max_read bytes read. None is not the end of the log: a call may read max_read bytes
        of a line that is not complete yet, or of one too long."""
        with self._lock:
            if self._closed:
                return []
            out: list[Line] = []
            budget = self._max_read
            looked = False
            self._check_truncated()
            while True:
                if self._file is not None:
                    budget = self._read(out, budget)
                    if not budget:
                        break
                # At the end of the file: what comes after it?
                if not self._next:
                    if looked:
                        break
                    looked = True
                    self._look()
                    if not self._next:
                        break
                if not self._switch(out):
                    break
            self._status = self._state()
            return out

    def status(self) -> Status:
        """Whether the log can be read, as the last call found it."""
        return self._status

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                os.close(self._file.fd)
                self._file = None
            self._closed = True
            self._next = []
            self._pending.clear()
            self._status = self._state()

    def _state(self) -> Status:
        if self._closed:
            return Status(readable=False, error="closed", path=None)
        path = self._file.path if self._file is not None else None
        readable = self._error is None and self._file is not None
        return Status(readable=readable, error=self._error, path=path)

    def _fail(self, reason: str, *, missing: bool = False) -> None:
        self._error = reason
        self._missing = missing

    # Reading the current file.

    def _check_truncated(self) -> None:
        current = self._file
        if current is None:
            return
        try:
            size = os.fstat(current.fd).st_size
        except OSError as error:
            self._fail(_reason(error))
            return
        if size < current.offset:  # copy-truncate: the file starts again
            current.offset = 0
            self._pending.clear()
            self._skipping = False

    def _read(self, out: list[Line], budget: int) -> int:
        """Read the current file to its end, or until `budget` bytes are read; what is left
        of the budget (0 after an error)."""
        current = self._file
        assert current is not None
        while budget > 0:
            try:
                data = os.pread(current.fd, min(_CHUNK, budget), current.offset)
            except OSError as error:
                self._fail(_reason(error))
                return 0
            if not data:
                break
            current.offset += len(data)
            budget -= len(data)
            self._split(data, out)
        return budget

    def _split(self, data: bytes, out: list[Line]) -> None:
        """Hand out the lines that `data` completes; hold its partial last line."""
        start = 0
        if self._skipping:
            start = data.find(b"\n") + 1
            if not start:
                return
            self._skipping = False
        last = data.rfind(b"\n", start)
        if last < 0:
            self._hold(data, start, out)
            return
        limit = self._max_line
        if self._pending:
            first = data.find(b"\n", start)
            self._pending += memoryview(data)[start:first]
            out.append(bytes(self._pending) if len(self._pending) <= limit else TOO_LONG)
            self._pending.clear()
            start = first + 1
        if start <= last:
            out.extend(
                line if len(line) <= limit else TOO_LONG for line in data[start:last].split(b"\n")
            )
        self._hold(data, last + 1, out)

    def _hold(self, data: bytes, start: int, out: list[Line]) -> None:
        """Keep data[start:] as the partial last line, unless that makes it too long."""
        if start >= len(data):
            return
        if len(self._pending) + len(data) - start > self._max_line:
            out.append(TOO_LONG)
            self._pending.clear()
            self._skipping = True
        else:
            self._pending += memoryview(data)[start:]

    # What to read next.

    def _look(self) -> None:
        """Find what follows the current file: a directory's newer files, a file that replaced
        it at the path; or the first to read."""
        try:
            found = os.stat(self._path)
        except OSError as error:
            self._fail(_reason(error), missing=error.errno == errno.ENOENT)
            return
        if stat.S_ISDIR(found.st_mode):
            self._scan(found)
            return
        self._error = None
        self._missing = False
        current = self._file
        if current is None or current.identity != (found.st_dev, found.st_ino):
            self._next = [_Found((found.st_mtime_ns, self._path.name), str(self._path))]

    def _scan(self, folder: os.stat_result) -> None:
        """The directory's files newer than the current one, oldest first: one pass over it."""
        stamp = (folder.st_dev, folder.st_ino, folder.st_mtime_ns)
        now = self._clock()
        if (
            self._scanned is not None
            and self._scanned[0] == stamp
            and now - self._scanned[1] < _SCAN_EVERY
        ):
            return  # no file came or went since the last scan
        settled = time.time_ns() - folder.st_mtime_ns >= _RACY_NS
        self._scanned = (stamp, now) if settled else None
        try:
            found = self._matching()
        except OSError as error:
            self._fail(_reason(error), missing=error.errno == errno.ENOENT)
            return
        if not found:
            what = f"{self._suffix} file" if self._suffix else "file"
            self._fail(f"no {what} in the directory", missing=True)
            return
        self._error = None
        self._missing = False
        current = self._file
        if current is None:
            if self._from_end:
                self._remember_unread(found[:-1])
                found = found[-1:]
            self._next = [entry for entry, _ in found]
            return
        try:
            key = (os.fstat(current.fd).st_mtime_ns, current.path.name)
        except OSError as error:
            self._fail(_reason(error))
            return
        self._next = [
            entry for entry, identity in found if entry.key > key and identity != current.identity
        ]

    def _matching(self) -> list[tuple[_Found, _Identity]]:
        """The directory's files of the suffix, oldest first, each once (a link to one is the
        same file, under its first name)."""
        found: dict[_Identity, _Found] = {}
        with os.scandir(self._path) as entries:
            for entry in entries:
                if not entry.name.endswith(self._suffix):
                    continue
                try:
                    if not entry.is_file():
                        continue
                    info = entry.stat()
                except OSError:  # gone since listed
                    continue
                identity = (info.st_dev, info.st_ino)
                item = _Found((info.st_mtime_ns, entry.name), entry.path)
                if identity not in found or item.key < found[identity].key:
                    found[identity] = item
        return sorted(((item, identity) for identity, item in found.items()), key=_by_key)

    def _remember_unread(self, older: list[tuple[_Found, _Identity]]) -> None:
        """At the start, the older files of the directory as they are (the latest of them): if
        the server appends to one again, only what it adds is new."""
        for entry, identity in older[-_REMEMBERED:]:
            try:
                fd = os.open(entry.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                with contextlib.suppress(OSError):
                    self._left[identity] = _Left(os.fstat(fd).st_size, _head(fd))
            finally:
                os.close(fd)

    def _switch(self, out: list[Line]) -> bool:
        """Open the next file, and end the current one: nothing more comes to a file rotated
        away, so its partial last line is complete. Whether to go on reading."""
        entry = self._next[0]
        try:
            fd = os.open(entry.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            del self._next[0]  # gone since found: on to the next
            self._fail("no such file")
            return True
        except OSError as error:
            self._fail(_reason(error))  # tried again at the next call
            return False
        try:
            opened = os.fstat(fd)
            if not stat.S_ISREG(opened.st_mode):
                os.close(fd)
                self._fail("not a regular file")
                return False
            identity = (opened.st_dev, opened.st_ino)
            offset, skipping = self._start(fd, opened.st_size, identity)
        except OSError as error:
            os.close(fd)
            self._fail(_reason(error))
            return False
        del self._next[0]
        self._end(out)
        self._file = _Reading(fd, Path(entry.path), identity, offset)
        self._skipping = skipping
        self._from_end = False
        self._error = None
        self._missing = False
        return True

    def _start(self, fd: int, size: int, identity: _Identity) -> tuple[int, bool]:
        """Where to start reading a file just opened, and whether in a line to skip."""
        if self._from_end:
            # The rest of a partial last line was written before the start too.
            return size, size > 0 and os.pread(fd, 1, size - 1) != b"\n"
        left = self._left.pop(identity, None)
        if left is not None and size >= left.size and os.pread(fd, len(left.head), 0) == left.head:
            return left.size, False  # appended to since: the rest is new
        return 0, False

    def _end(self, out: list[Line]) -> None:
        """Close the current file, its partial last line handed out as complete."""
        current = self._file
        if current is None:
            return
        if self._pending:
            out.append(bytes(self._pending))
        self._pending.clear()
        self._skipping = False
        with contextlib.suppress(OSError):
            self._left[current.identity] = _Left(current.offset, _head(current.fd))
        if len(self._left) > _REMEMBERED:
            del self._left[next(iter(self._left))]
        os.close(current.fd)
        self._file = None


def _by_key(item: tuple[_Found, _Identity]) -> tuple[int, str]:
    return item[0].key
