"""Connection poolers in front of a target: which server backends each pool owns, and in what
mode, read from PgBouncer's admin console or known from the poolers' addresses."""

from __future__ import annotations

import ipaddress
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import psycopg
from psycopg.rows import dict_row

from pg_advisory_exporter import logs
from pg_advisory_exporter.config.collection import CollectionSettings
from pg_advisory_exporter.config.dsn import redact
from pg_advisory_exporter.config.targets import PoolerConfig
from pg_advisory_exporter.fleet import resolver
from pg_advisory_exporter.sharing import Patience, Shared, Turn

from .kept_connection import CannotCollect, KeptConnection, connect
from .scheduling import Watchdog

log = logging.getLogger(__name__)

# Seconds of a collection's deadline kept back from its poolers' reads, so that a pooler that
# does not answer never makes the server's series late.
_POOLER_MARGIN = 0.5
# The most a collection waits for its poolers, in all, after the server's read: 0.5s, and at
# most a quarter of the deadline. A console answers SHOW from memory in milliseconds; one
# that does not answer would otherwise hold a collection worker, and a fleet behind hung
# poolers would starve the pool (docs/forensics.md, "Session locks stranded in a pool").
POOLER_WAIT = 0.5
_POOLER_SHARE = 0.25

# The admin console's commands, read by column name: columns are added between releases
# (1.23 inserted `replication` into SHOW SERVERS) and renamed (1.24's reserve_pool_size).
# SHOW SERVERS maps each server connection to its backend: remote_pid, and local_addr and
# local_port, the backend's client_addr and client_port. SHOW POOLS says each pool's mode in
# effect; SHOW DATABASES (NULL: the default) and SHOW CONFIG are read only where it lacks it.
SHOW_SERVERS = "SHOW SERVERS"
SHOW_POOLS = "SHOW POOLS"
SHOW_DATABASES = "SHOW DATABASES"
SHOW_CONFIG = "SHOW CONFIG"

# The modes in which a server connection passes from client to client between transactions
# (or statements): a session-level lock left on it outlives the client that took it.
SHARING_MODES = frozenset({"transaction", "statement"})
_RESOLVED_FOR = 60.0  # seconds a pooler's host name stays resolved


@dataclass(frozen=True)
class PooledBackend:
    """What owns a server backend: a pooler, its pool (database/user; empty where the pooler
    is known only by address) and the pool's mode."""

    pooler: str
    pool: str
    pool_mode: str

    @property
    def shared(self) -> bool:
        """Handed from client to client between transactions or statements."""
        return self.pool_mode in SHARING_MODES


@dataclass(frozen=True)
class _Server:
    backend: PooledBackend
    local_port: int | None


@dataclass(frozen=True)
class PoolerView:
    """One pooler as one read found it; `error` is None when it could be read."""

    name: str
    error: str | None = None
    by_pid: Mapping[int, _Server] = field(default_factory=dict)
    by_socket: Mapping[tuple[str, int], _Server] = field(default_factory=dict)
    networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    pool_mode: str = ""  # of every backend from `networks`

    @property
    def up(self) -> bool:
        return self.error is None

    def owner(
        self, pid: int, client_addr: str | None, client_port: int | None
    ) -> PooledBackend | None:
        """The pool that owns the backend `pid`, whose client is client_addr:client_port.

        A pid alone could be another server's, where one pooler fronts several: the port the
        pooler's connection left from must then be the backend's client port, where both
        sides show it.
        """
        server = self.by_pid.get(pid)
        if server is not None:
            if client_port is None or server.local_port is None or server.local_port == client_port:
                return server.backend
            return None
        if client_addr is None:
            return None
        if client_port is not None:
            server = self.by_socket.get((client_addr, client_port))
            if server is not None:
                return server.backend
        if self.networks:
            address = ipaddress.ip_address(client_addr)
            if any(address in network for network in self.networks):
                return PooledBackend(self.name, "", self.pool_mode)
        return None


def owner(
    views: Iterable[PoolerView], pid: int, client_addr: str | None, client_port: int | None
) -> PooledBackend | None:
    """The first pooler that owns the backend, if any does."""
    for view in views:
        if view.up:
            found = view.owner(pid, client_addr, client_port)
            if found is not None:
                return found
    return None


def _rows(conn: psycopg.Connection[Any], command: str) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(command).fetchall()


def _odd(command: str, column: str, value: object, expected: str) -> ValueError:
    shown = repr(value)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    return ValueError(f"{command} gave {column} = {shown}, not {expected}")


def _text(row: Mapping[str, Any], column: str, command: str) -> str:
    """A text column; "" where it is NULL or missing."""
    value = row.get(column)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _odd(command, column, value, "text")
    return value


def _number(row: Mapping[str, Any], column: str, command: str) -> int:
    """A whole-number column; 0 where it is NULL or missing."""
    value = row.get(column)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise _odd(command, column, value, "a whole number")
    return value


def _pool(row: Mapping[str, Any], command: str) -> tuple[str, str]:
    return _text(row, "database", command), _text(row, "user", command)


Show = Callable[[str], list[dict[str, Any]]]  # runs a SHOW command, returns its rows


def console_view(name: str, show: Show) -> PoolerView:
    """Read the admin console once. A column a version lacks is done without: the mode
    falls back from SHOW POOLS to SHOW DATABASES to the global pool_mode, and a server
    without remote_pid is matched by the port its connection left from. A value of the
    wrong type (remote_pid as text, say) raises ValueError: the pooler's failure, never
    a guess at which backend is whose."""
    servers = show(SHOW_SERVERS)
    pools = {_pool(row, SHOW_SERVERS) for row in servers}
    modes = {
        _pool(row, SHOW_POOLS): _text(row, "pool_mode", SHOW_POOLS) for row in show(SHOW_POOLS)
    }
    if any(not modes.get(pool) for pool in pools):
        databases = {
            _text(row, "name", SHOW_DATABASES): _text(row, "pool_mode", SHOW_DATABASES)
            for row in show(SHOW_DATABASES)
        }
        default = next(
            (
                _text(row, "value", SHOW_CONFIG)
                for row in show(SHOW_CONFIG)
                if _text(row, "key", SHOW_CONFIG) == "pool_mode"
            ),
            "session",
        )
        for pool in pools:
            if not modes.get(pool):
                modes[pool] = databases.get(pool[0]) or default
    by_pid: dict[int, _Server] = {}
    by_socket: dict[tuple[str, int], _Server] = {}
    for row in servers:
        database, user = _pool(row, SHOW_SERVERS)
        local_port = _number(row, "local_port", SHOW_SERVERS)
        local_addr = _text(row, "local_addr", SHOW_SERVERS)
        remote_pid = _number(row, "remote_pid", SHOW_SERVERS)
        server = _Server(
            PooledBackend(name, f"{database}/{user}", modes[database, user]),
            local_port or None,
        )
        # 0 while the connection logs in; a random number (negative up to 1.20) where the
        # server is another PgBouncer, whose pids could never match anyway.
        if remote_pid > 0:
            by_pid[remote_pid] = server
        if local_addr and local_port:
            by_socket[local_addr, local_port] = server
    return PoolerView(name, by_pid=by_pid, by_socket=by_socket)


class _Addresses:
    """A pooler's addresses as networks; host names resolved at most once a minute, by the
    exporter's resolver, so that a slow one costs a collection no more than its wait, and
    only the first collection that finds it slow: the next ones do not wait for the same
    lookup again (a resolver that does not answer holds it for its own timeout)."""

    def __init__(
        self,
        addresses: Sequence[str],
        clock: Callable[[], float],
        names: resolver.Resolver | None = None,
    ) -> None:
        self._clock = clock
        self._names = resolver.RESOLVER if names is None else names
        self._networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
        self._hosts: list[str] = []
        for address in addresses:
            try:
                self._networks.append(ipaddress.ip_network(address, strict=False))
            except ValueError:
                self._hosts.append(address)
        self._resolved: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
        self._resolved_at = -math.inf

    def networks(
        self, seconds: float
    ) -> tuple[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...], str | None]:
        """The networks, and an error if a host name could not be resolved in `seconds`."""
        error = None
        if self._hosts and self._clock() - self._resolved_at > _RESOLVED_FOR:
            deadline = self._clock() + seconds
            try:
                found = [
                    address
                    for host in self._hosts
                    for address in self._names.resolve(host, deadline - self._clock())
                ]
            except resolver.Unresolved as exc:
                error = f"cannot resolve its host names: {exc}"
            else:
                self._resolved = tuple(ipaddress.ip_network(a) for a in found)
                self._resolved_at = self._clock()
        return (*self._networks, *self._resolved), error


class _Console:
    """The one connection kept to a pooler's admin console (a KeptConnection), read in a
    thread of its own, one read at a time, so that a console that never answers holds no
    collection worker: the collection waits for the read only as long as it can spare, and
    the read goes on to its own deadline. After a failure the console is not tried again
    until the backoff has passed, and the failure is the answer meanwhile, as for a server.
    """

    def __init__(
        self, config: PoolerConfig, settings: CollectionSettings, clock: Callable[[], float]
    ) -> None:
        self.config = config
        self._settings = settings
        self._clock = clock
        # SHOW commands are answered from the pooler's memory: there is nothing to cancel,
        # and a cancel request to a frozen pooler would only delay the interrupt.
        self._kept = KeptConnection(
            self._connect,
            _as_is,
            backoff_max=settings.reconnect_backoff_max,
            cancel=False,
            clock=clock,
        )
        # One read at a time, joined by whoever asks meanwhile (never reused once it ended:
        # each collection reads the console anew).
        self._reads: Shared[PoolerView] = Shared(0.0, clock)
        self._patience: Patience[PoolerView] = Patience()
        # Used by the reader only.
        self._conninfo = config.admin_dsn or ""
        self._failure: PoolerView | None = None

    def start(self, watchdog: Watchdog) -> Future[PoolerView]:
        """The read under way, or a new one: it ends within a connect and a statement."""
        asked = self._reads.ask()
        if isinstance(asked, Future):
            return asked
        assert isinstance(asked, Turn), "a read that ended is never reused"
        seconds = self._settings.connect_timeout + self._settings.statement_timeout
        try:
            threading.Thread(
                target=self._run,
                args=(asked.future, watchdog, seconds),
                name=f"pooler-{self.config.name}",
                daemon=True,
            ).start()
        except BaseException as exc:  # no thread: the next call starts another read
            asked.future.set_exception(exc)
            raise
        return asked.future

    def wait(self, reading: Future[PoolerView], seconds: float, late: str) -> PoolerView:
        """The read's view, or `late` if it has not ended within `seconds`; a read that
        was waited out once is not waited for again, only looked at."""
        view = self._patience.wait(reading, seconds)
        return PoolerView(self.config.name, error=late) if view is None else view

    def _run(self, reading: Future[PoolerView], watchdog: Watchdog, seconds: float) -> None:
        try:
            view = self.read(watchdog, seconds)
        except Exception as exc:  # never leave the read unfinished: no other would start
            view = PoolerView(self.config.name, error=_describe(exc, self._conninfo))
        reading.set_result(view)

    def read(self, watchdog: Watchdog, seconds: float) -> PoolerView:
        """The console's view, or why there is none; interrupted after `seconds`."""
        if self._failure is not None and self._kept.backing_off(self._clock()):
            return self._failure
        with self._kept.deadline(watchdog, seconds) as expired, self._kept.use():
            try:
                view = console_view(self.config.name, partial(_rows, self._kept.get()))
            except Exception as exc:  # any failure or odd answer: this pooler's, not the target's
                self._kept.failed()
                view = PoolerView(self.config.name, error=_describe(exc, self._conninfo))
            else:
                self._kept.succeeded()
        if expired.is_set():
            # Backed off as a failure already; the connection is closed even if the read
            # ended as the deadline passed.
            self._kept.drop()
            view = PoolerView(self.config.name, error=self._kept.unanswered(seconds))
        self._failure = None if view.up else view
        return view

    def close(self) -> None:
        """No more reads; one under way is interrupted, and its reader closes the connection."""
        self._kept.close()

    def _connect(self) -> psycopg.Connection[Any]:
        self._conninfo = self.config.conninfo()
        return connect(
            self._conninfo,
            self._settings.connect_timeout,
            # The console takes only the simple query protocol (up to 1.25 at least);
            # psycopg would prepare a statement it runs a fifth time.
            prepare_threshold=None,
        )


def _describe(exc: Exception, conninfo: str) -> str:
    """Why a console could not be read, without its password."""
    if isinstance(exc, psycopg.Error | ValueError | CannotCollect):
        return redact(str(exc).strip(), conninfo)
    return redact(f"unexpected {type(exc).__name__}: {exc}", conninfo)


def _as_is(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    """A console needs nothing done before it is read."""
    return conn


class Poolers:
    """A target's poolers, read within a bounded wait."""

    def __init__(
        self,
        configs: Sequence[PoolerConfig],
        settings: CollectionSettings,
        clock: Callable[[], float] = time.monotonic,
        name: str = "",
    ) -> None:
        self._clock = clock
        self._name = name  # the target's, in what its collections log
        self._said = logs.Changes()
        self._consoles = {c.name: _Console(c, settings, clock) for c in configs if c.admin_dsn}
        self._addresses = {c.name: _Addresses(c.addresses, clock) for c in configs if c.addresses}
        self._configs = tuple(configs)

    def __bool__(self) -> bool:
        return bool(self._configs)

    def read(self, watchdog: Watchdog, seconds: float) -> tuple[PoolerView, ...]:
        """Each pooler's view, all read at once; one that has not answered within `seconds`
        (in all) is reported down for this read. Its console's read goes on, in its own
        thread, to its own deadline (a connect and a statement), and the next calls find it
        rather than open another, without waiting for it again: a console that hangs costs
        the first call `seconds`, and the calls until its read ends nothing."""
        deadline = self._clock() + seconds
        reading = {name: console.start(watchdog) for name, console in self._consoles.items()}
        late = KeptConnection.unanswered(seconds)
        views = []
        for config in self._configs:
            left = max(deadline - self._clock(), 0.0)
            if config.name in reading:
                views.append(self._consoles[config.name].wait(reading[config.name], left, late))
            else:
                networks, error = self._addresses[config.name].networks(left)
                mode = config.pool_mode or ""
                views.append(PoolerView(config.name, error, networks=networks, pool_mode=mode))
        return tuple(views)

    def read_after_server(
        self, watchdog: Watchdog, deadline: float, elapsed: float
    ) -> tuple[PoolerView, ...]:
        """The poolers, read by a collection after its server's read (so that they know its
        backends) for at most POOLER_WAIT of what is left of its `deadline`, `elapsed` of it
        gone: a pooler never fails the server's series, nor holds its worker for long. Each
        pooler's failure is logged once, and when it is read again."""
        if not self:
            return ()
        left = deadline - _POOLER_MARGIN - elapsed
        budget = min(left, POOLER_WAIT, deadline * _POOLER_SHARE)
        try:
            views = self.read(watchdog, budget)
        except Exception as exc:  # no thread to read them in, say: theirs, not the server's
            error = f"cannot read: {type(exc).__name__}: {exc}"
            views = tuple(PoolerView(c.name, error) for c in self._configs)
        for view in views:  # once per distinct error, as for the server
            if not self._said.changed(view.name, view.error):
                continue
            if view.error is None:
                log.info("pooler read again", extra={"target": self._name, "pooler": view.name})
            else:
                log.warning(
                    "cannot read the pooler",
                    extra={"target": self._name, "pooler": view.name, "error": view.error},
                )
        return views

    def close(self) -> None:
        for console in self._consoles.values():
            console.close()
