"""The resolver of probed host names, driven by a lookup and a clock of the tests' own: one
lookup per name at a time, none held up by another, a cap on what a flood can start."""

from __future__ import annotations

import ipaddress
import re
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from support import Clock, wait_until

from pg_advisory_exporter.fleet.discovery import TargetAddress, parse_target, resolve
from pg_advisory_exporter.fleet.resolver import IpAddress, Resolver, Unresolved

LOCALHOST = [ipaddress.IPv4Address("127.0.0.1")]
WAIT = 2.0  # as a probe waits; what resolves at once never waits for it


class Dns:
    """Lookups as a test wants them: names under `hang` hang until the test ends, `good.test`
    and `answers` resolve at once, any other name is unknown. `asked` is every lookup."""

    def __init__(self) -> None:
        self.answers: dict[str, list[str]] = {"good.test": ["127.0.0.1"]}
        self.asked: list[str] = []
        self.started = threading.Event()  # set by the first lookup
        self.released = threading.Event()

    def __call__(self, name: str) -> list[IpAddress]:
        self.asked.append(name)
        self.started.set()
        if name.startswith("hang"):
            self.released.wait()
        if name not in self.answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [ipaddress.ip_address(a) for a in self.answers[name]]


@pytest.fixture
def dns() -> Iterator[Dns]:
    lookups = Dns()
    yield lookups
    lookups.released.set()  # the hung lookups' threads end


def _flood(resolver: Resolver, names: int, prefix: str = "hang") -> None:
    """Probes of distinct names that hang, each given up at once (wait 0): their lookups stay."""
    for i in range(names):
        with pytest.raises(Unresolved, match="did not resolve within 0s"):
            resolver.resolve(f"{prefix}-{i}.test", 0)


def test_probes_of_one_name_share_its_lookup(dns: Dns) -> None:
    resolver = Resolver(dns)
    dns.answers["hang.test"] = ["10.0.0.1"]
    answers: list[list[IpAddress]] = []
    probes = [
        threading.Thread(target=lambda: answers.append(resolver.resolve("hang.test", 10)))
        for _ in range(4)
    ]
    for probe in probes:
        probe.start()
    assert dns.started.wait(5)
    dns.released.set()
    for probe in probes:
        probe.join(5)
    assert answers == [[ipaddress.IPv4Address("10.0.0.1")]] * 4
    assert dns.asked == ["hang.test"]  # one lookup for the four
    # Once it has answered, the next probe looks the name up again: no answer is reused.
    resolver.resolve("hang.test", WAIT)
    assert dns.asked == ["hang.test", "hang.test"]


def test_a_lookup_given_up_on_is_not_waited_for_again_until_it_ends(dns: Dns) -> None:
    resolver = Resolver(dns)
    dns.answers["hang.test"] = ["10.0.0.1"]
    with pytest.raises(Unresolved, match=r"did not resolve within 0\.2s"):
        resolver.resolve("hang.test", 0.2)
    started = time.monotonic()
    with pytest.raises(Unresolved):
        resolver.resolve("hang.test", 5)  # only looked at: the first one waited it out
    assert time.monotonic() - started < 1

    def resolved() -> bool:
        try:
            return resolver.resolve("hang.test", 5) == [ipaddress.IPv4Address("10.0.0.1")]
        except Unresolved:  # the lookup given up on, until it ends
            return False

    dns.released.set()
    wait_until(resolved, 5, "the late answer")


def test_a_hung_name_asked_for_again_and_again_does_not_delay_another(dns: Dns) -> None:
    resolver = Resolver(dns)
    for _ in range(100):  # Prometheus probing it on every interval, or a caller insisting
        with pytest.raises(Unresolved, match="did not resolve within 0s"):
            resolver.resolve("hang.test", 0)
    assert resolver.resolve("good.test", WAIT) == LOCALHOST
    assert dns.asked.count("hang.test") == 1


def test_a_good_name_resolves_through_a_hundred_hung_ones(dns: Dns) -> None:
    resolver = Resolver(dns)
    _flood(resolver, 100)
    assert resolver.resolve("good.test", WAIT) == LOCALHOST


def test_past_the_cap_a_new_name_is_refused_at_once_and_a_known_one_resolves(dns: Dns) -> None:
    clock = Clock()
    resolver = Resolver(dns, clock, max_lookups=3)
    assert resolver.resolve("good.test", WAIT) == LOCALHOST  # known from now on
    _flood(resolver, 3)
    dns.answers["new.test"] = ["10.0.0.1"]
    at_cap = (
        "new.test is not looked up: the cap of 3 host names being resolved at once is "
        "reached, and it has not resolved in the last 600s"
    )
    with pytest.raises(Unresolved, match=f"^{re.escape(at_cap)}$"):
        resolver.resolve("new.test", WAIT)
    assert "new.test" not in dns.asked
    assert resolver.resolve("good.test", WAIT) == LOCALHOST
    clock.now += 599
    assert resolver.resolve("good.test", WAIT) == LOCALHOST  # which makes it known anew
    clock.now += 601  # not resolved for ten minutes: a new name again
    with pytest.raises(Unresolved, match=r"^good\.test is not looked up"):
        resolver.resolve("good.test", WAIT)


def test_a_flood_holds_no_more_threads_than_the_cap(dns: Dns) -> None:
    resolver = Resolver(dns, max_lookups=8)
    for i in range(1000):
        given_up = "did not resolve within 0s" if i < 8 else "is not looked up: the cap of 8 "
        with pytest.raises(Unresolved, match=given_up):
            resolver.resolve(f"hang-{i}.flood.test", 0)
    lookups = [t for t in threading.enumerate() if t.name.endswith(".flood.test")]
    assert len(lookups) == 8
    assert all(thread.daemon for thread in lookups)  # none keeps the exporter from exiting


def test_known_names_are_the_most_recent_few_and_hold_no_more_threads(dns: Dns) -> None:
    resolver = Resolver(dns, max_lookups=1, known_names=2)
    names = [f"hang-{i}.known.test" for i in range(1000)]
    dns.released.set()  # they resolve at first...
    for name in names:
        dns.answers[name] = ["10.0.0.1"]
        assert resolver.resolve(name, WAIT)
    wait_until(
        lambda: not [t for t in threading.enumerate() if t.name.endswith(".known.test")],
        5,
        "the resolved names' lookup threads ended",
    )
    dns.released.clear()  # ...then their DNS stops answering, and a flood comes
    _flood(resolver, 1)
    for name in names[:-2]:
        with pytest.raises(Unresolved, match="is not looked up: the cap of 1 "):
            resolver.resolve(name, 0)
    for name in names[-2:]:  # only the two most recent are remembered
        with pytest.raises(Unresolved, match="did not resolve within 0s"):
            resolver.resolve(name, 0)
    lookups = [t for t in threading.enumerate() if t.name.endswith(".known.test")]
    assert len(lookups) == 2


def test_a_name_that_does_not_resolve_is_refused_with_the_reason(dns: Dns) -> None:
    resolver = Resolver(dns, max_lookups=1)
    reason = "nowhere.test does not resolve: Name or service not known"
    with pytest.raises(Unresolved, match=f"^{re.escape(reason)}$"):
        resolver.resolve("nowhere.test", WAIT)
    _flood(resolver, 1)
    with pytest.raises(Unresolved, match="is not looked up"):  # a failure makes no name known
        resolver.resolve("nowhere.test", WAIT)


def test_a_lookup_that_fails_frees_its_place(dns: Dns) -> None:
    resolver = Resolver(dns, max_lookups=1)
    for _ in range(3):
        with pytest.raises(Unresolved, match="does not resolve"):
            resolver.resolve("nowhere.test", WAIT)
    assert resolver.resolve("good.test", WAIT) == LOCALHOST


def test_an_ipv4_mapped_answer_is_its_ipv4_address(dns: Dns) -> None:
    dns.answers["mapped.test"] = ["::ffff:10.0.0.1", "10.0.0.1", "2001:db8::1", "::ffff:10.0.0.2"]
    assert Resolver(dns).resolve("mapped.test", WAIT) == [
        ipaddress.IPv4Address("10.0.0.1"),
        ipaddress.IPv6Address("2001:db8::1"),
        ipaddress.IPv4Address("10.0.0.2"),
    ]


def test_an_ipv4_mapped_literal_is_its_ipv4_address() -> None:
    mapped = parse_target("[::ffff:127.0.0.1]:5432")
    assert mapped == parse_target("127.0.0.1:5432")
    assert resolve(mapped, 0) == LOCALHOST  # a literal is not looked up
    # Any other IPv6 address stays as it is.
    assert resolve(TargetAddress(ipaddress.IPv6Address("::1"), 5432, "x"), 0) == [
        ipaddress.IPv6Address("::1")
    ]
