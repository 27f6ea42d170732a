"""Targets named in a /probe request (`HOST[:PORT][/DBNAME]`): parsed, normalised and checked
against an auth module's allow-list, with host names resolved once and the address pinned.

Nothing here connects to a server: a target is refused, or it comes out as an address that
was checked, for the connection to be made to that address and no other.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

DEFAULT_PORT = 5432
_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_HOST_NAME = re.compile(rf"(?=.{{1,253}}$){_LABEL}(?:\.{_LABEL})*")
_PATTERN = re.compile(rf"(?:\*\.)?{_LABEL}(?:\.{_LABEL})*")
# A database name as a URL carries it: PostgreSQL allows more, a probe URL needs no more.
DBNAME_PATTERN = r"[A-Za-z0-9_][A-Za-z0-9_$.-]{0,62}"
_DBNAME = re.compile(DBNAME_PATTERN)
_PORT = re.compile(r"[0-9]{1,5}")
# HOST (a name, an IPv4 address or [IPv6]), then :PORT, then /DBNAME, each optional after HOST.
_TARGET = re.compile(r"(?P<host>\[[^\]]*\]|[^:/\[\]]+)(?::(?P<port>[^/]*))?(?:/(?P<dbname>.*))?")


class Refused(ValueError):
    """A target that is not probed; the message says why, and nothing was connected to."""


def _port(text: str, what: str) -> int:
    if not _PORT.fullmatch(text) or not 0 < int(text) <= 65535:
        raise Refused(f"{what}: the port must be a number from 1 to 65535")
    return int(text)


# One address has one name and one check, whichever form a probe or DNS gives it in.
def _folded(address: IpAddress) -> IpAddress:
    """An IPv4-mapped IPv6 address (::ffff:10.0.0.1) as the IPv4 address it reaches."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _host(text: str) -> str | IpAddress:
    """An IP address, or a host name in lower case without its trailing dot."""
    if text.startswith("["):
        try:
            address = ipaddress.IPv6Address(text[1:-1])
        except ValueError:
            raise Refused(f"{text} is not an IPv6 address") from None
        if address.scope_id is not None:  # an interface of the exporter's host: not a target
            raise Refused(f"{text}: a target's address has no zone (%interface)")
        return _folded(address)
    try:
        return ipaddress.IPv4Address(text)
    except ValueError:
        pass
    name = text.lower().removesuffix(".")
    # All digits and dots is an IPv4 address in a form (0177.1, 2130706433) that the
    # resolver reads one way and a person another: refused rather than guessed.
    if not _HOST_NAME.fullmatch(name) or name.replace(".", "").isdigit():
        raise Refused(f"{text!r} is not a host name, an IPv4 address or [IPv6]")
    return name


@dataclass(frozen=True)
class TargetAddress:
    """A target as a probe names it, normalised: host (a lower-case name or an address),
    port, and database (None: the whole server)."""

    host: str | IpAddress
    port: int
    dbname: str | None

    @property
    def server(self) -> str:
        """HOST:PORT, the server's part of the name."""
        host = f"[{self.host}]" if isinstance(self.host, ipaddress.IPv6Address) else self.host
        return f"{host}:{self.port}"

    @property
    def name(self) -> str:
        """HOST:PORT or HOST:PORT/DBNAME, the target label of its series."""
        return self.server if self.dbname is None else f"{self.server}/{self.dbname}"


def parse_target(text: str) -> TargetAddress:
    """HOST[:PORT][/DBNAME] from a probe, or Refused: a DSN, libpq keywords, a user or a
    password have no place in it (they come from the auth module)."""
    if "@" in text:
        raise Refused("a target names no user or password: the auth module gives them")
    if re.search(r"[=?&\s'\"\\]", text) or "://" in text:
        raise Refused("a target is HOST[:PORT][/DBNAME], never a DSN or libpq keywords")
    parts = _TARGET.fullmatch(text)
    if parts is None:
        raise Refused(f"{text!r} is not HOST[:PORT][/DBNAME] (IPv6 in brackets)")
    port = parts["port"]
    dbname = parts["dbname"]
    if dbname is not None and not _DBNAME.fullmatch(dbname):
        raise Refused(f"{dbname!r} is not a database name (letters, digits, _ $ . -)")
    return TargetAddress(
        host=_host(parts["host"]),
        port=DEFAULT_PORT if port is None else _port(port, text),
        dbname=dbname or None,
    )


@dataclass(frozen=True)
class AllowedTarget:
    """One entry of an allow-list: a network or a host-name pattern, and a port or any."""

    network: IpNetwork | None
    pattern: str | None  # "db1.example.com", or "*.example.com" for any name under it
    port: int | None

    def admits_port(self, port: int) -> bool:
        return self.port is None or self.port == port

    def admits_name(self, name: str) -> bool:
        if self.pattern is None:
            return False
        if self.pattern.startswith("*."):
            return name.endswith(self.pattern[1:])
        return name == self.pattern


def parse_allowed(text: str) -> AllowedTarget:
    """A CIDR (10.0.0.0/8, fd00::/8), an address, or a host name that may start with `*.`
    (any name under it), each with an optional :PORT; IPv6 in brackets when it has a port."""
    entry = text.strip().lower()
    host, port = entry, None
    bracketed = re.fullmatch(r"\[([^\]]+)\](?::(.*))?", entry)
    if bracketed:
        host, port = bracketed[1], bracketed[2]
    elif entry.count(":") == 1:
        host, port = entry.split(":")
    checked_port = None if port is None else _port(port, text)
    try:
        return AllowedTarget(ipaddress.ip_network(host, strict=True), None, checked_port)
    except ValueError as exc:
        if "/" in host or ":" in host or host.replace(".", "").isdigit():
            raise ValueError(f"{text!r} is not a network: {exc}") from None
    name = host.removesuffix(".")
    if not _PATTERN.fullmatch(name) or len(name) > 253:
        raise ValueError(
            f"{text!r} is not a CIDR (10.0.0.0/8), an address or a host name pattern "
            "(db.example.com, *.db.example.com), with an optional :PORT"
        )
    return AllowedTarget(None, name, checked_port)


# Addresses a name may lead to only where a network of the list names them: a DNS answer
# must not turn an allowed name into the exporter's own host or a cloud metadata service.
def _special(address: IpAddress) -> bool:
    return (
        address.is_loopback
        or address.is_link_local
        or address.is_unspecified
        or address.is_multicast
        or address.is_reserved
    )


class AllowList:
    """Which targets an auth module may connect to."""

    def __init__(self, entries: Sequence[AllowedTarget]) -> None:
        self._entries = tuple(entries)

    def _in_network(self, address: IpAddress, port: int) -> bool:
        return any(
            e.network is not None and address in e.network and e.admits_port(port)
            for e in self._entries
        )

    def may_resolve(self, name: str, port: int) -> bool:
        """Whether a host name could be allowed at all: if not, it is not even resolved."""
        return any(
            e.admits_port(port) and (e.network is not None or e.admits_name(name))
            for e in self._entries
        )

    def admits(self, target: TargetAddress, addresses: Sequence[IpAddress]) -> bool:
        """Whether every address the target's host resolved to (or is) may be connected to.

        An address is allowed by a network of the list; a name's addresses also by a
        pattern the name matches, unless they are special (loopback, link-local...).
        """
        if not addresses:
            return False
        by_name = isinstance(target.host, str) and any(
            e.admits_name(target.host) and e.admits_port(target.port) for e in self._entries
        )
        return all(
            self._in_network(address, target.port) or (by_name and not _special(address))
            for address in addresses
        )


def _lookup(name: str) -> list[IpAddress]:
    """The addresses getaddrinfo gives for a host name, in its order."""
    found = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    # IPv6 zone ids ("fe80::1%eth0") are dropped: such an address is link-local anyway.
    return [ipaddress.ip_address(str(sockaddr[0]).split("%")[0]) for *_, sockaddr in found]


def _distinct(addresses: Sequence[IpAddress]) -> list[IpAddress]:
    """Each address once, as the exporter names it, in the order given."""
    return list(dict.fromkeys(map(_folded, addresses)))


# Lookups under way at once for names not known to resolve: a flood of names whose DNS
# never answers holds that many threads, no more, and the next new name is refused at once.
MAX_LOOKUPS = 256
# A name that resolved within KNOWN_FOR seconds (the KNOWN_NAMES most recent) is looked up
# even at MAX_LOOKUPS: the targets being kept keep their probes through a flood.
KNOWN_NAMES = 2048
KNOWN_FOR = 600.0


# Each lookup has a thread of its own since getaddrinfo cannot be interrupted: a name whose
# DNS hangs holds no HTTP thread beyond a probe's wait, and no other name's lookup.
class Resolver:
    """Host names to addresses, each lookup on a thread of its own, shared by every probe of
    its name meanwhile; at most `max_lookups` at once, and past it only for known names."""

    def __init__(
        self,
        lookup: Callable[[str], Sequence[IpAddress]] = _lookup,
        clock: Callable[[], float] = time.monotonic,
        max_lookups: int = MAX_LOOKUPS,
        known_names: int = KNOWN_NAMES,
        known_for: float = KNOWN_FOR,
    ) -> None:
        self._lookup = lookup
        self._clock = clock
        self._max_lookups = max_lookups
        self._known_names = known_names
        self._known_for = known_for
        self._lock = threading.Lock()
        self._pending: dict[str, Future[list[IpAddress]]] = {}
        # When each name last resolved, the least recent first.
        self._known: OrderedDict[str, float] = OrderedDict()

    def resolve(self, name: str, wait: float) -> list[IpAddress]:
        """The addresses a host name stands for; Refused when it does not resolve within
        `wait` seconds, or is not looked up at all."""
        future = self._lookup_of(name)
        try:
            return future.result(timeout=wait)
        except FutureTimeout:
            raise Refused(f"{name} did not resolve within {wait:g}s") from None
        except OSError as exc:
            raise Refused(f"{name} does not resolve: {exc.strerror or exc}") from None

    def _lookup_of(self, name: str) -> Future[list[IpAddress]]:
        """The lookup under way for the name, or a new one on a thread of its own."""
        with self._lock:
            future = self._pending.get(name)
            if future is not None:
                return future
            if not self._may_start(name):
                raise Refused(
                    f"{name} is not looked up: the cap of {self._max_lookups} host names "
                    "being resolved at once is reached, and it has not resolved in the last "
                    f"{self._known_for:g}s"
                )
            future = self._pending[name] = Future()
        try:
            threading.Thread(
                target=self._run, args=(name, future), name=f"resolve {name}", daemon=True
            ).start()
        except RuntimeError as exc:  # the process may start no more threads
            self._finish(name, None)
            future.set_exception(OSError(f"no thread to resolve it on ({exc})"))
        return future

    def _may_start(self, name: str) -> bool:
        # Past the cap, only a name that resolved lately: at most `known_names` lookups more,
        # as each remembered name has one at a time and a new one is remembered only when
        # a lookup ends.
        if len(self._pending) < self._max_lookups:
            return True
        last = self._known.get(name)
        return last is not None and self._clock() - last < self._known_for

    def _run(self, name: str, future: Future[list[IpAddress]]) -> None:
        try:
            addresses = _distinct(self._lookup(name))
        except Exception as exc:  # the probes waiting for it say why
            self._finish(name, None)
            future.set_exception(exc)
        else:
            # Known before any waiter returns, so that the next probe finds it so.
            self._finish(name, addresses)
            future.set_result(addresses)

    def _finish(self, name: str, addresses: list[IpAddress] | None) -> None:
        with self._lock:
            del self._pending[name]
            if addresses:
                self._known[name] = self._clock()
                self._known.move_to_end(name)
                if len(self._known) > self._known_names:
                    self._known.popitem(last=False)


_RESOLVER = Resolver()


def resolve(target: TargetAddress, wait: float) -> list[IpAddress]:
    """The addresses the target's host stands for, in the resolver's order; Refused when the
    name does not resolve within `wait` seconds or is not looked up (see Resolver)."""
    if not isinstance(target.host, str):
        return [target.host]
    return _RESOLVER.resolve(target.host, wait)
