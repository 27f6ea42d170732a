"""What only the server's log records, made to happen with real sessions: an unlock of a lock
not held, a lock table found full, a deadlock of advisory locks, a wait that ends before any
scrape. The server must log lock waits (log_lock_waits) after a short deadlock_timeout."""

from __future__ import annotations

import threading
from pathlib import Path

import psycopg
import pytest
from support import wait_until

UNLOCKER, FILLER, DEADLOCKER, WAITER = "unlocker", "filler", "deadlocker", "waiter"
UNLOCKED_KEY = 7_320_001
DEADLOCK_KEYS = (7_320_011, 7_320_012)
WAITED_KEY = 7_320_021
# The pairs (FILL_NAMESPACE, n) the table is filled with: no other test's keys, which one
# held would make the filling wait rather than fail.
FILL_NAMESPACE = 73_201

_WAITING = "SELECT EXISTS (SELECT FROM pg_locks WHERE pid = %s AND NOT granted)"


class ServerLog:
    """The server's log from now on (a file, or a log_directory's files): what it says once
    a wait has passed deadlock_timeout, the state a test waits for (no time is long enough
    on a busy machine)."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._read = {file: file.stat().st_size for file in self._files()}

    def _files(self) -> list[Path]:
        return sorted(self._path.iterdir()) if self._path.is_dir() else [self._path]

    def says(self, text: str) -> bool:
        found = False
        for file in self._files():
            with file.open("rb") as log:
                log.seek(self._read.get(file, 0))
                found = found or text in log.read().decode(errors="replace")
        return found

    def logged_wait(self, pid: int) -> None:
        """Until the server has logged that backend `pid` is waiting (its deadlock check at
        deadlock_timeout, which logs it, has run)."""
        wait_until(
            lambda: self.says(f"process {pid} still waiting for"),
            10,
            f"the server logging the wait of backend {pid}",
        )


def _connect(dsn: str, application_name: str, autocommit: bool = True) -> psycopg.Connection:
    return psycopg.connect(dsn, autocommit=autocommit, application_name=application_name)


def unlock_not_held(dsn: str, application_name: str = UNLOCKER) -> None:
    """pg_advisory_unlock() of a key the session does not hold: false, and a WARNING."""
    with _connect(dsn, application_name) as conn:
        row = conn.execute("SELECT pg_advisory_unlock(%s)", (UNLOCKED_KEY,)).fetchone()
    assert row == (False,)


def fill_lock_table(dsn: str, application_name: str = FILLER) -> None:
    """One transaction that takes a lock per row until the shared lock table is full: its
    statement fails with out of shared memory, and its rollback empties the table again."""
    with _connect(dsn, application_name, autocommit=False) as conn:
        with pytest.raises(psycopg.errors.OutOfMemory, match="out of shared memory"):
            conn.execute(
                "SELECT count(pg_advisory_xact_lock(%s, g)) FROM generate_series(1, 10000000) AS g",
                (FILL_NAMESPACE,),
            )
        conn.rollback()


def _waiting(watcher: psycopg.Connection, waiter: psycopg.Connection) -> None:
    """Until `waiter` waits for a lock (as `watcher` sees in pg_locks)."""

    def waits() -> bool:
        row = watcher.execute(_WAITING, (waiter.info.backend_pid,)).fetchone()
        return bool(row and row[0])

    wait_until(waits, 10, "the session waiting for its lock")


def advisory_deadlock(dsn: str, log: Path, application_name: str = DEADLOCKER) -> None:
    """Two transactions that take two keys in opposite orders: one is cancelled as the
    deadlock's victim (after the first waited past deadlock_timeout, which logs its wait)."""
    first, second = DEADLOCK_KEYS
    failures: list[BaseException] = []
    with (
        _connect(dsn, application_name, autocommit=False) as one,
        _connect(dsn, application_name, autocommit=False) as other,
        _connect(dsn, "watcher") as watcher,
    ):
        one.execute("SELECT pg_advisory_xact_lock(%s)", (first,))
        other.execute("SELECT pg_advisory_xact_lock(%s)", (second,))

        def crossed() -> None:
            try:
                one.execute("SELECT pg_advisory_xact_lock(%s)", (second,))
            except psycopg.errors.DeadlockDetected as error:
                failures.append(error)

        server_log = ServerLog(log)
        thread = threading.Thread(target=crossed)
        thread.start()
        _waiting(watcher, one)
        # Its deadlock check passes (and logs its wait) before the cycle closes: the other,
        # whose check finds it, is the victim, and this one's wait ends acquired.
        server_log.logged_wait(one.info.backend_pid)
        try:
            other.execute("SELECT pg_advisory_xact_lock(%s)", (first,))
        except psycopg.errors.DeadlockDetected as error:
            failures.append(error)
        other.rollback()  # the victim's, or the survivor's lock that lets the other through
        thread.join(timeout=10)
        one.rollback()
    assert len(failures) == 1, f"one victim, not {failures}"


def ended_wait(dsn: str, log: Path, key: int = WAITED_KEY, application_name: str = WAITER) -> None:
    """A session waits for `key` past deadlock_timeout (the server logs it), then gets it."""
    with _connect(dsn, "holder") as holder, _connect(dsn, application_name) as waiter:
        holder.execute("SELECT pg_advisory_lock(%s)", (key,))
        thread = threading.Thread(
            target=waiter.execute, args=("SELECT pg_advisory_lock(%s)", (key,))
        )
        server_log = ServerLog(log)
        thread.start()
        _waiting(holder, waiter)
        server_log.logged_wait(waiter.info.backend_pid)
        holder.execute("SELECT pg_advisory_unlock(%s)", (key,))
        thread.join(timeout=10)
        assert not thread.is_alive()
        waiter.execute("SELECT pg_advisory_unlock(%s)", (key,))


def every_event(dsn: str, log: Path) -> None:
    """Each event once, on the server of `dsn`, whose log is `log` (a file or a folder)."""
    unlock_not_held(dsn)
    fill_lock_table(dsn)
    advisory_deadlock(dsn, log)
    ended_wait(dsn, log)
