"""The HTTP connections being served: a whole deadline for each request, caps per client
address and in all, and room made at a cap by cutting the oldest client still sending."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from dataclasses import dataclass, field

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Connection:
    """One accepted connection, from its accept to its close."""

    address: str
    deadline: float  # time.monotonic() by which its request must have arrived
    # A duplicate of the accepted socket's descriptor, owned here: shutting it down ends the
    # connection whatever thread is blocked on it and whatever TLS made of the original, and
    # it is never a descriptor number that a closed connection has handed to another.
    control: socket.socket = field(repr=False)
    cut: bool = False


class Connections:
    """Every connection served, safe to use from the accepting and the serving threads.

    Each connection gets `deadline` seconds from its accept for the TLS handshake, the request
    line and the headers together, however slowly a client sends them: past it, it is cut.
    At most `per_address` connections are served for one client address and `limit` in all.
    At a cap the new connection is never kept waiting: the oldest connection still sending its
    request (of the same address, or of the address with the most connections) is cut to make
    room, and only when every connection there is being answered is the new one refused. A
    scrape or a probe sends its request in milliseconds: slower readers are older.
    """

    def __init__(self, limit: int, per_address: int, deadline: float) -> None:
        self._limit = limit
        self._per_address = per_address
        self._deadline = deadline
        self._changed = threading.Condition()
        # Counted connections only (a cut one is no longer counted: its thread ends at once).
        self._by_address: dict[str, dict[Connection, None]] = {}  # each oldest first
        self._reading: dict[Connection, None] = {}  # oldest first, so the next deadline first
        self._count = 0
        self._stopped = False

    def admit(self, request: socket.socket, address: str) -> Connection | None:
        """The new connection counted, room made for it if need be; None: refused."""
        with self._changed:
            crowd = self._by_address.get(address, {})
            if len(crowd) >= self._per_address:
                if not self._cut_oldest_reader(crowd, "too many connections from its address"):
                    return None
            elif self._count >= self._limit:
                busiest = sorted(self._by_address.values(), key=len, reverse=True)
                if not any(self._cut_oldest_reader(c, "too many connections") for c in busiest):
                    return None
            connection = Connection(address, time.monotonic() + self._deadline, request.dup())
            self._by_address.setdefault(address, {})[connection] = None
            self._reading[connection] = None
            self._count += 1
            self._changed.notify_all()  # the watchdog may have been waiting for none
            return connection

    def answering(self, connection: Connection) -> None:
        """Its request has arrived: from now on it is neither cut at its deadline nor evicted."""
        with self._changed:
            self._reading.pop(connection, None)

    def release(self, connection: Connection) -> None:
        """Its thread is done with it."""
        with self._changed:
            if not connection.cut:
                self._uncount(connection)
            connection.control.close()

    def watch(self) -> None:
        """Cut each connection whose request has not arrived by its deadline, until stop()."""
        with self._changed:
            while not self._stopped:
                oldest = next(iter(self._reading), None)
                if oldest is None:
                    self._changed.wait()
                    continue
                left = oldest.deadline - time.monotonic()
                if left > 0:
                    self._changed.wait(left)
                    continue
                self._cut(oldest, "its request did not arrive in time")

    def stop(self) -> None:
        with self._changed:
            self._stopped = True
            self._changed.notify_all()

    def _cut_oldest_reader(self, connections: dict[Connection, None], why: str) -> bool:
        oldest = next((c for c in connections if c in self._reading), None)
        if oldest is None:
            return False
        self._cut(oldest, why)
        return True

    def _cut(self, connection: Connection, why: str) -> None:
        connection.cut = True
        self._uncount(connection)
        log.debug("connection cut", extra={"client": connection.address, "reason": why})
        with contextlib.suppress(OSError):  # the client has gone already
            # Wakes its thread out of any read or handshake: the client gets end of file.
            connection.control.shutdown(socket.SHUT_RDWR)

    def _uncount(self, connection: Connection) -> None:
        self._reading.pop(connection, None)
        crowd = self._by_address[connection.address]
        del crowd[connection]
        if not crowd:
            del self._by_address[connection.address]
        self._count -= 1
