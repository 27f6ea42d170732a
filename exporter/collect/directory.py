"""Who reads a running server, and which target answers for it: the one home of that rule,
for configured targets, for names found to reach one server, and for the probes of an auth
module alike.

Targets are ranked: the configured ones in the order of the file, an auth module's probes a
whole server before a database, each in the order it was made (Target.rank). A server is made
for the first target of an address (the daemon's arrangement, or the module's), with that
target's role and options; a server's rank is its first target's. Of the servers found to
reach one running server (by identity, a new connection's ServerIdentity), the first in rank
reads it, whichever connected first: a later target's weaker grant, other options or other
database never change what is read. The others read through it, connecting again every
SAME_SERVER_RECHECK to check that they still reach it. Of the targets that read one running
server, the first in rank answers for it (it carries the whole server's series): decided by
the reading server once per collection (and for an answer that no collection carries: a
late one, or one read through a server that has not read yet), not at every scrape.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Iterable
from typing import Generic, Protocol, TypeVar

# How long a server found to be another one under a second address reads through that one
# before it connects once more to check: an address (a virtual IP, a DNS name) may come to
# reach another server, and then it must be read on its own again.
SAME_SERVER_RECHECK = 300.0

Rank = tuple[int, ...]
# Of no target at all: after every ranked one.
_UNRANKED: Rank = (1 << 62,)


class View(Protocol):
    """A target as the rule sees it."""

    @property
    def name(self) -> str: ...

    @property
    def database(self) -> str | None: ...

    @property
    def rank(self) -> Rank: ...


class Reads(Protocol):
    """A server as the rule sees it."""

    @property
    def closed(self) -> bool: ...


S = TypeVar("S", bound=Reads)


class Directory(Generic[S]):
    """The servers of one family (the configured targets, or one auth module's discovered
    ones), the targets on each, and the identity each connected to."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._views: dict[View, S] = {}  # each target, and the server made for its address
        self._on: dict[S, list[View]] = {}  # and the other way
        # The identity each server's last new connection reached, and when.
        self._found: dict[S, tuple[Hashable, float]] = {}
        self._by_identity: dict[Hashable, list[S]] = {}

    # -- targets -----------------------------------------------------------------------------

    def attach(self, view: View, server: S) -> None:
        with self._lock:
            self._views[view] = server
            self._on.setdefault(server, []).append(view)

    def detach(self, view: View) -> None:
        with self._lock:
            server = self._views.pop(view, None)
            if server is not None:
                on = self._on[server]
                on.remove(view)
                if not on:
                    del self._on[server]

    # -- servers -----------------------------------------------------------------------------

    def claim(self, server: S, identity: Hashable) -> S:
        """`server` has connected to `identity` (and not to the one it connected to before,
        if another: a restart): the server that reads it now."""
        with self._lock:
            self._forget_locked(server)
            self._found[server] = (identity, self._clock())
            self._by_identity.setdefault(identity, []).append(server)
            return self._first_locked(identity)

    def renew(self, server: S) -> bool:
        """`server`, which read through another, could not connect to check again because
        the lock table is full, which no new connection can tell more of: its finding
        stands for another SAME_SERVER_RECHECK. False when it read through none."""
        with self._lock:
            found = self._found.get(server)
            if found is None or self._first_locked(found[0]) is server:
                return False
            self._found[server] = (found[0], self._clock())
            return True

    def forget(self, server: S) -> None:
        """`server` reaches no identity it knows now (it is closed, or cannot connect)."""
        with self._lock:
            self._forget_locked(server)

    def reading_server(self, server: S) -> S:
        """The server whose collections `server`'s targets get: the first in rank of the open
        servers found to reach the same one, while that finding is recent; else itself."""
        with self._lock:
            found = self._found.get(server)
            if found is None:
                return server
            identity, at = found
            first = self._first_locked(identity)
            if first is not server and self._clock() >= at + SAME_SERVER_RECHECK:
                return server  # time it checked again that it still reaches that one
            return first

    def answering(self, reader: S, databases: frozenset[str] | None) -> View | None:
        """Of the targets that read `reader` (made on it, or on a server that reads through
        it), the one that answers for the running server: the first in rank of those whose
        database it has (or that name none); any, before its databases are known."""
        with self._lock:
            found = self._found.get(reader)
            same = self._by_identity.get(found[0], []) if found is not None else []
            readers = [reader, *(s for s in same if self._reads_through_locked(s, reader))]
            candidates = [
                view
                for server in readers
                for view in self._on.get(server, ())
                if view.database is None or databases is None or view.database in databases
            ]
        return min(candidates, key=_rank, default=None)

    # -- with the lock held ------------------------------------------------------------------

    def _forget_locked(self, server: S) -> None:
        found = self._found.pop(server, None)
        if found is not None:
            same = self._by_identity[found[0]]
            same.remove(server)
            if not same:
                del self._by_identity[found[0]]

    def _rank_locked(self, server: S) -> Rank:
        return min(map(_rank, self._on.get(server, ())), default=_UNRANKED)

    def _first_locked(self, identity: Hashable) -> S:
        same: Iterable[S] = (s for s in self._by_identity[identity] if not s.closed)
        return min(same, key=self._rank_locked, default=self._by_identity[identity][0])

    def _reads_through_locked(self, server: S, reader: S) -> bool:
        found = self._found.get(server)
        if found is None or server is reader:
            return False
        identity, at = found
        recent = self._clock() < at + SAME_SERVER_RECHECK
        return recent and self._first_locked(identity) is reader


def _rank(view: View) -> Rank:
    return view.rank
