"""Targets named in a /probe request (`HOST[:PORT][/DBNAME]`): parsed, normalised and checked
against an auth module's allow-list, with host names resolved once and the address pinned.

Nothing here connects to a server: a target is refused, or it comes out as an address that
was checked, for the connection to be made to that address and no other.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass

from pg_advisory_exporter.fleet import resolver
from pg_advisory_exporter.fleet.resolver import IpAddress
from pg_advisory_exporter.validation import port_number

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

DEFAULT_PORT = 5432
_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_HOST_NAME = re.compile(rf"(?=.{{1,253}}$){_LABEL}(?:\.{_LABEL})*")
_PATTERN = re.compile(rf"(?:\*\.)?{_LABEL}(?:\.{_LABEL})*")
# A database name as a URL carries it: PostgreSQL allows more, a probe URL needs no more.
DBNAME_PATTERN = r"[A-Za-z0-9_][A-Za-z0-9_$.-]{0,62}"
_DBNAME = re.compile(DBNAME_PATTERN)
# HOST (a name, an IPv4 address or [IPv6]), then :PORT, then /DBNAME, each optional after HOST.
_TARGET = re.compile(r"(?P<host>\[[^\]]*\]|[^:/\[\]]+)(?::(?P<port>[^/]*))?(?:/(?P<dbname>.*))?")


class Refused(ValueError):
    """A target that is not probed; the message says why, and nothing was connected to."""


def _port(text: str, what: str) -> int:
    try:
        return port_number(text)
    except ValueError as exc:
        raise Refused(f"{what}: {exc}") from None


def _host(text: str) -> str | IpAddress:
    """An IP address, or a host name in lower case without its trailing dot."""
    if text.startswith("["):
        try:
            address = ipaddress.IPv6Address(text[1:-1])
        except ValueError:
            raise Refused(f"{text} is not an IPv6 address") from None
        if address.scope_id is not None:  # an interface of the exporter's host: not a target
            raise Refused(f"{text}: a target's address has no zone (%interface)")
        return resolver.folded(address)
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


def resolve(target: TargetAddress, wait: float) -> list[IpAddress]:
    """The addresses the target's host stands for, in the resolver's order; Refused when the
    name does not resolve within `wait` seconds or is not looked up (resolver.Resolver)."""
    if not isinstance(target.host, str):
        return [target.host]
    try:
        return resolver.RESOLVER.resolve(target.host, wait)
    except resolver.Unresolved as exc:
        raise Refused(str(exc)) from None
