"""The kept connection's state machine without a server: backoff, the session made once per
connection, interruption from another thread, and closing without a race. A fake connection
stands in for psycopg's, with a real socket pair so that an interrupt really wakes a reader."""

from __future__ import annotations

import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any, cast

import psycopg
import pytest
from support import wait_until

from pg_advisory_exporter.collect.kept_connection import (
    APPLICATION_NAME,
    CannotCollect,
    KeptConnection,
    connect,
)
from pg_advisory_exporter.collect.scheduling import Watchdog


class FakeConnection:
    """What KeptConnection touches of a psycopg connection."""

    def __init__(self) -> None:
        self.near, self.far = socket.socketpair()  # the client's end, the server's
        self.closed = False
        self.broken = False
        self.cancels = 0
        self.cancel_gate = threading.Event()  # a cancel request waits for it
        self.cancel_gate.set()

    @property
    def pgconn(self) -> FakeConnection:
        return self

    @property
    def socket(self) -> int:
        if self.closed:
            raise psycopg.OperationalError("the connection is closed")
        return self.near.fileno()

    def cancel_safe(self, timeout: float) -> None:
        self.cancels += 1
        self.cancel_gate.wait(timeout=5)

    def close(self) -> None:
        self.closed = True
        self.near.close()
        self.far.close()

    def woken(self) -> bool:
        """Whether the client's end was shut down (interrupt()'s way to wake its reader): the
        server's end then reads the end of the stream."""
        self.far.setblocking(False)
        try:
            return self.far.recv(1) == b""
        except BlockingIOError:
            return False

    def reader(self) -> threading.Thread:
        """A thread that waits on the connection, as a collection waits for an answer."""
        near = self.near
        thread = threading.Thread(target=near.recv, args=(1,), daemon=True)
        thread.start()
        return thread


Opened = list[FakeConnection]


def _kept(
    opened: Opened,
    prepare: Callable[[FakeConnection], str] = lambda conn: f"session {id(conn)}",
    *,
    backoff_max: float = 4.0,
    cancel: bool = True,
    connect: Callable[[], FakeConnection] = FakeConnection,
) -> KeptConnection[str]:
    def open_one() -> psycopg.Connection[Any]:
        conn = connect()
        opened.append(conn)
        return cast("psycopg.Connection[Any]", conn)

    return KeptConnection(
        open_one,
        lambda conn: prepare(cast(FakeConnection, conn)),
        backoff_max=backoff_max,
        cancel=cancel,
    )


@pytest.fixture
def opened() -> Iterator[Opened]:
    connections: Opened = []
    yield connections
    for conn in connections:
        if not conn.closed:
            conn.close()


class _WatchedLock:
    """A lock that tells which threads came to take it, and which one holds it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.comers: list[str] = []
        self.holder: str | None = None

    def __enter__(self) -> None:
        self.comers.append(threading.current_thread().name)
        self._lock.acquire()
        self.holder = threading.current_thread().name

    def __exit__(self, *exc: object) -> None:
        self.holder = None
        self._lock.release()


def _ended(thread: threading.Thread, within: float = 2.0) -> bool:
    thread.join(within)
    return not thread.is_alive()


def test_a_failed_use_backs_off_one_second_doubling_up_to_the_cap(opened: Opened) -> None:
    kept = _kept(opened, backoff_max=5.0)
    assert not kept.backing_off(time.monotonic())
    for backoff in (1.0, 2.0, 4.0, 5.0, 5.0):
        before = time.monotonic()
        kept.failed()
        after = time.monotonic()
        assert kept.backing_off(before + backoff - 0.001)
        assert not kept.backing_off(after + backoff)
    # Success resets the backoff and its deadline: the next failure starts again at 1s.
    kept.succeeded()
    assert not kept.backing_off(time.monotonic())
    before = time.monotonic()
    kept.failed()
    assert kept.backing_off(before + 0.999)
    assert not kept.backing_off(time.monotonic() + 1.0)


def test_an_open_connection_is_never_backing_off(opened: Opened) -> None:
    kept = _kept(opened)
    kept.failed()
    kept.get()  # the user may open one anyway (a lost connection is reopened at once)
    assert not kept.backing_off(time.monotonic())


def test_the_session_is_prepared_once_per_connection(opened: Opened) -> None:
    prepared: list[FakeConnection] = []

    def prepare(conn: FakeConnection) -> str:
        prepared.append(conn)
        return f"session {len(prepared)}"

    kept = _kept(opened, prepare)
    assert not kept.is_open()
    assert kept.lost()
    assert kept.get() == kept.get() == "session 1"
    assert len(opened) == 1
    assert kept.is_open()
    assert not kept.lost()
    opened[0].broken = True
    assert kept.lost()
    kept.drop()
    assert opened[0].closed
    assert kept.get() == "session 2"
    assert prepared == opened


def test_a_failed_prepare_closes_the_connection_and_leaves_the_backoff_to_the_user(
    opened: Opened,
) -> None:
    def refuse(conn: FakeConnection) -> str:
        raise CannotCollect("too old")

    kept = _kept(opened, refuse)
    with pytest.raises(CannotCollect, match="too old"):
        kept.get()
    assert opened[0].closed
    assert not kept.is_open()
    assert not kept.backing_off(time.monotonic())


def test_a_prepare_can_be_interrupted(opened: Opened) -> None:
    started, woken = threading.Event(), threading.Event()

    def prepare(conn: FakeConnection) -> str:
        started.set()
        conn.near.recv(1)  # the first statement, that never gets an answer
        woken.set()
        raise psycopg.OperationalError("consuming input failed")

    kept = _kept(opened, prepare, cancel=False)
    failures: list[BaseException] = []

    def use() -> None:
        try:
            kept.get()
        except psycopg.OperationalError as exc:
            failures.append(exc)

    user = threading.Thread(target=use)
    user.start()
    assert started.wait(2)
    kept.interrupt()
    assert _ended(user)
    assert woken.is_set()
    assert len(failures) == 1
    assert opened[0].closed


def test_a_close_outside_a_use_closes_and_refuses_new_connections(opened: Opened) -> None:
    kept = _kept(opened)
    kept.get()
    kept.close()
    assert opened[0].closed
    with pytest.raises(CannotCollect, match="the target was removed from the configuration"):
        kept.get()
    assert len(opened) == 1


def test_a_close_during_a_use_interrupts_it_and_the_use_ends_by_closing(
    opened: Opened,
) -> None:
    kept = _kept(opened)
    with kept.use():
        kept.get()
        conn = opened[0]
        reader = conn.reader()
        kept.close()  # as a reload that removes the target does, from its own thread
        assert _ended(reader), "the close woke the reader"
        assert not conn.closed, "closed under its user"
    assert conn.closed
    assert not kept.is_open()


def test_a_close_while_connecting_leaves_no_connection(opened: Opened) -> None:
    kept: KeptConnection[str]

    def connect_while_removed() -> FakeConnection:
        kept.close()
        return FakeConnection()

    kept = _kept(opened, connect=connect_while_removed)
    with pytest.raises(CannotCollect):
        kept.get()
    assert opened[0].closed
    assert not kept.is_open()


def test_an_interrupt_cancels_first_and_holds_off_a_close_meanwhile(
    opened: Opened, monkeypatch: pytest.MonkeyPatch
) -> None:
    kept = _kept(opened, cancel=True)
    kept.get()
    conn = opened[0]
    closing = _WatchedLock()  # what holds off a close while the connection is used elsewhere
    monkeypatch.setattr(kept, "_closing", closing)
    conn.cancel_gate.clear()  # a server that does not answer the cancel request yet
    reader = conn.reader()
    started = time.monotonic()
    kept.interrupt()
    assert time.monotonic() - started < 0.5, "the caller (the watchdog) was held up"
    dropping = threading.Thread(target=kept.drop, name="drop")
    dropping.start()
    wait_until(
        lambda: conn.cancels == 1 and "drop" in closing.comers,
        5,
        "the cancel request sent, and the close come to wait for it",
    )
    # Both have come as far as they may while the cancel request is under way.
    assert closing.holder == "interrupt", "the cancel request does not hold off a close"
    assert not conn.woken(), "woken before the cancel request ended"
    assert not conn.closed, "closed while the cancel request used it"
    conn.cancel_gate.set()
    assert _ended(reader)
    assert _ended(dropping)
    assert conn.closed


def test_without_cancel_an_interrupt_only_wakes_the_user(opened: Opened) -> None:
    kept = _kept(opened, cancel=False)
    kept.get()
    reader = opened[0].reader()
    kept.interrupt()
    assert _ended(reader)
    assert opened[0].cancels == 0
    assert not opened[0].closed  # its user closes it


def test_an_interrupt_without_a_connection_does_nothing(
    opened: Opened, monkeypatch: pytest.MonkeyPatch
) -> None:
    kept = _kept(opened)
    interrupted: list[psycopg.Connection[Any]] = []
    monkeypatch.setattr(kept, "_interrupt", interrupted.append)
    kept.interrupt()
    kept.get()
    kept.drop()
    kept.interrupt()
    for thread in threading.enumerate():  # an interrupt runs in a thread of its own
        if thread.name == "interrupt":
            thread.join(2)
    assert interrupted == []
    assert opened[0].cancels == 0


def test_a_deadline_interrupts_a_use_that_outlives_it_only(opened: Opened) -> None:
    kept = _kept(opened, cancel=False)
    watchdog = Watchdog()
    with kept.deadline(watchdog, 0.2) as ended_in_time:
        kept.get()
    started = time.monotonic()
    with kept.deadline(watchdog, 0.4) as expired:
        opened[0].near.recv(1)  # an answer that never comes
    assert time.monotonic() - started >= 0.4  # never before its time; when after, the OS says
    assert expired.is_set()
    # The first deadline's time came before the second's, which the watchdog called (it calls
    # them in their order): the first, disarmed when its use ended, was never called, and
    # interrupted nothing of the second use.
    assert not ended_in_time.is_set()


class _Held:
    """Something a frame of a failed connection attempt refers to."""


def test_a_failed_connect_frees_what_its_frames_held(monkeypatch: pytest.MonkeyPatch) -> None:
    held: list[weakref.ref[_Held]] = []

    def timed_out(conninfo: str, **options: Any) -> psycopg.Connection[Any]:
        half_open = _Held()  # psycopg's half-open connection, in a local of its frame
        held.append(weakref.ref(half_open))
        raise psycopg.OperationalError("connection timeout expired")

    monkeypatch.setattr(psycopg, "connect", timed_out)
    with pytest.raises(psycopg.OperationalError) as failure:
        connect("host=db.example", 2.0)
    assert failure.value.__traceback__ is not None  # still held, as a caller holds it
    assert held[0]() is None


@pytest.mark.parametrize(("timeout", "whole_seconds"), [(0.5, 2), (2.0, 2), (2.5, 3)])
def test_connect_asks_for_what_libpq_takes(
    monkeypatch: pytest.MonkeyPatch, timeout: float, whole_seconds: int
) -> None:
    asked: dict[str, Any] = {}

    def record(conninfo: str, **options: Any) -> psycopg.Connection[Any]:
        asked.update(options, conninfo=conninfo)
        return cast("psycopg.Connection[Any]", None)

    monkeypatch.setattr(psycopg, "connect", record)
    connect("host=db.example", timeout, prepare_threshold=None)
    assert asked == {
        "conninfo": "host=db.example",
        "autocommit": True,
        "application_name": APPLICATION_NAME,
        "connect_timeout": whole_seconds,
        "prepare_threshold": None,
    }
