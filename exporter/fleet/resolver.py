"""Host names to addresses within a bounded wait, whatever the resolver does: a lookup on a
thread of its own, shared by everyone who asks for that name meanwhile, and a cap on lookups
at once that a flood of names cannot pass (probes' target names, poolers' addresses)."""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future

from pg_advisory_exporter.sharing import Patience

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class Unresolved(Exception):
    """A name that did not resolve in time, or is not looked up; the message says which."""


# One address has one name and one check, whichever form a probe or DNS gives it in.
def folded(address: IpAddress) -> IpAddress:
    """An IPv4-mapped IPv6 address (::ffff:10.0.0.1) as the IPv4 address it reaches."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _lookup(name: str) -> list[IpAddress]:
    """The addresses getaddrinfo gives for a host name, in its order."""
    found = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    # IPv6 zone ids ("fe80::1%eth0") are dropped: such an address is link-local anyway.
    return [ipaddress.ip_address(str(sockaddr[0]).split("%")[0]) for *_, sockaddr in found]


def _distinct(addresses: Sequence[IpAddress]) -> list[IpAddress]:
    """Each address once, as the exporter names it, in the order given."""
    return list(dict.fromkeys(map(folded, addresses)))


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
        # A lookup one caller gave up waiting for is not waited for again until it ends.
        self._patience: Patience[list[IpAddress]] = Patience()
        # When each name last resolved, the least recent first.
        self._known: OrderedDict[str, float] = OrderedDict()

    def resolve(self, name: str, wait: float) -> list[IpAddress]:
        """The addresses a host name stands for; Unresolved when it does not resolve within
        `wait` seconds (none when its lookup has been waited out already), or is not looked
        up at all."""
        future = self._lookup_of(name)
        try:
            found = self._patience.wait(future, wait)
        except OSError as exc:
            raise Unresolved(f"{name} does not resolve: {exc.strerror or exc}") from None
        if found is None:
            raise Unresolved(f"{name} did not resolve within {wait:g}s") from None
        return found

    def _lookup_of(self, name: str) -> Future[list[IpAddress]]:
        """The lookup under way for the name, or a new one on a thread of its own."""
        with self._lock:
            future = self._pending.get(name)
            if future is not None:
                return future
            if not self._may_start(name):
                raise Unresolved(
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


RESOLVER = Resolver()  # the exporter's: its cap holds for every caller
