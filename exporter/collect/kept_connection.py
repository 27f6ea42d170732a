"""A connection kept between uses, to a server or to a pooler's admin console: opened when
needed, opened again only after a backoff, and interrupted or closed safely from any thread."""

from __future__ import annotations

import contextlib
import math
import os
import socket
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

import psycopg

from pg_advisory_exporter.durations import format_duration

from .scheduling import Watchdog

APPLICATION_NAME = "pg-advisory-exporter"
_FIRST_BACKOFF = 1.0  # seconds before a failed connection is tried again; doubles up to a cap
_CANCEL_TIMEOUT = 1.0  # seconds a cancel request may take after a deadline
_REMOVED = "the target was removed from the configuration"

S = TypeVar("S")


class CannotCollect(Exception):
    """A failure that is not the database's error: a server too old, a password file gone,
    a connection closed because its target was removed."""


def connect(
    conninfo: str,
    connect_timeout: float,
    application_name: str = APPLICATION_NAME,
    **options: Any,
) -> psycopg.Connection[Any]:
    """A new autocommit connection in the exporter's name (psycopg.Error if not)."""
    try:
        return psycopg.connect(
            conninfo,
            autocommit=True,
            application_name=application_name,
            # libpq takes whole seconds and treats values below 2 as 2.
            connect_timeout=max(2, math.ceil(connect_timeout)),
            **options,
        )
    except psycopg.Error as exc:
        # When an attempt times out, psycopg leaves the half-open connection in a frame
        # that this exception's traceback holds, in a reference cycle that only the cyclic
        # garbage collector breaks: minutes later, or never. Until then its socket stays
        # open, and so does the server backend behind it once the server gets to it.
        # Clearing the frames' locals frees it now.
        traceback.clear_frames(exc.__traceback__)
        raise


def interrupt(conn: psycopg.Connection[Any]) -> None:
    """Wake a thread that waits on `conn`, from another thread, without closing its socket.

    Shutting the socket down makes the waiting side see the end of the stream at once,
    whatever the server does; closing it instead could hand its descriptor to another
    socket while the waiting thread still polls it.
    """
    try:
        fd = conn.pgconn.socket
    except psycopg.OperationalError:  # libpq has already dropped the socket
        return
    with socket.socket(fileno=os.dup(fd)) as sock, contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


class KeptConnection(Generic[S]):
    """One connection kept between uses, and the backoff between attempts to open it.

    `connect` opens the connection, and `prepare` readies it for use (the connection can
    be interrupted meanwhile) and returns what its user works with, its session. The user,
    one at a time, gets the session with `get()` within `use()`, and says whether the use
    `failed()` (the connection is closed, and none is opened again before a backoff of 1s,
    doubling up to `backoff_max`) or `succeeded()`. Other threads (a deadline, a reload
    that removes the target) never close it under a use: they `interrupt()` it, and
    `close()` interrupts a use under way, whose end closes the connection.
    """

    def __init__(
        self,
        connect: Callable[[], psycopg.Connection[Any]],
        prepare: Callable[[psycopg.Connection[Any]], S],
        *,
        backoff_max: float,
        cancel: bool,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        self._connect_with = connect
        self._prepare_with = prepare
        self._backoff_max = backoff_max
        self._cancel = cancel  # an interrupt first asks the server to cancel the statement
        self._state = threading.Lock()  # guards the fields below it
        # Held while the connection is closed or used from another thread, so that it is
        # never freed under that use; taken before _state.
        self._closing = threading.Lock()
        self._conn: psycopg.Connection[Any] | None = None
        self._session: S | None = None  # what prepare made of _conn
        self._using = False
        self._closed = False
        self._reconnect_at = 0.0  # no new connection before this (monotonic clock)
        # Used by the connection's user only.
        self._backoff = 0.0

    # -- the user's ------------------------------------------------------------------------

    @contextlib.contextmanager
    def use(self) -> Iterator[None]:
        """One use: a close() meanwhile interrupts it, and its end closes the connection."""
        with self._state:
            self._using = True
        try:
            yield
        finally:
            with self._state:
                self._using = False
                closed = self._closed
            if closed:
                self.drop()

    def get(self) -> S:
        """The open connection's session, or a new one's. Raises CannotCollect once closed,
        or what connect and prepare raise: nothing is left open then."""
        with self._state:
            if self._closed:
                raise CannotCollect(_REMOVED)
            session = self._session
        if session is not None:
            return session
        conn = self._connect_with()
        with self._state:
            closed = self._closed
            if not closed:
                self._conn = conn  # from here a deadline can interrupt it
        if closed:  # while connecting
            conn.close()
            raise CannotCollect(_REMOVED)
        try:
            session = self._prepare_with(conn)
        except BaseException:
            self.drop()
            raise
        with self._state:
            if self._conn is conn:
                self._session = session
        return session

    def failed(self) -> None:
        """The use failed: close the connection, and open none before the backoff passed."""
        self.drop()
        self._backoff = min(max(self._backoff * 2, _FIRST_BACKOFF), self._backoff_max)
        with self._state:
            self._reconnect_at = self._clock() + self._backoff

    def succeeded(self) -> None:
        """The use succeeded: a failure after it backs off from the start again."""
        self._backoff = 0.0
        with self._state:
            self._reconnect_at = 0.0

    def drop(self) -> None:
        """Close the connection, if any; the next get() opens a new one."""
        with self._closing, self._state:
            conn, self._conn, self._session = self._conn, None, None
        if conn is not None:
            conn.close()

    def is_open(self) -> bool:
        with self._state:
            return self._conn is not None

    def lost(self) -> bool:
        """True when there is no usable connection (closed, or found broken)."""
        with self._state:
            conn = self._conn
        return conn is None or conn.closed or conn.broken

    @staticmethod
    def unanswered(seconds: float) -> str:
        """What to say of a read that deadline() interrupted."""
        return f"no answer within {format_duration(seconds)}"

    @contextlib.contextmanager
    def deadline(
        self, watchdog: Watchdog, seconds: float, announce: Callable[[], None] | None = None
    ) -> Iterator[threading.Event]:
        """Interrupt the connection if the block has not ended within `seconds` (a stopped
        backend, a hung proxy or pooler), calling `announce` first; the event says whether
        it was. The one deadline of every use of a connection: collections, pooler reads and
        /locks reads alike."""
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            if announce is not None:
                announce()
            self.interrupt()

        alarm = watchdog.arm(seconds, expire)
        try:
            yield expired
        finally:
            watchdog.disarm(alarm)

    # -- any thread's ----------------------------------------------------------------------

    def backing_off(self, now: float) -> bool:
        """True while a failed connection waits out its backoff: its failure is the answer."""
        with self._state:
            return self._conn is None and now < self._reconnect_at

    def interrupt(self) -> None:
        """Stop what the connection's user waits for, at once."""
        with self._state:
            conn = self._conn
        if conn is not None:
            # A cancel request may wait on the network, and the lock on a close: neither
            # may hold up the caller (the watchdog, which keeps every deadline).
            threading.Thread(
                target=self._interrupt, args=(conn,), name="interrupt", daemon=True
            ).start()

    def close(self) -> None:
        """No more connections; a use under way is interrupted, and its end closes it."""
        with self._closing:
            with self._state:
                self._closed = True
                conn, using = self._conn, self._using
                if not using:
                    self._conn = self._session = None
            if conn is None:
                return
            if using:
                interrupt(conn)
            else:
                conn.close()

    def _interrupt(self, conn: psycopg.Connection[Any]) -> None:
        with self._closing:  # the user cannot close the connection meanwhile
            with self._state:
                if self._conn is not conn:
                    return
            if self._cancel:
                # A server that is merely slow stops the statement; a stopped backend or a
                # hung proxy never answers, and the interrupt wakes the user regardless.
                with contextlib.suppress(Exception):
                    conn.cancel_safe(timeout=_CANCEL_TIMEOUT)
            interrupt(conn)
