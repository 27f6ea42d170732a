"""Targets that probes name: parsing, normalising, the allow-list, the auth_modules block and
the registry of discovered targets, without a server."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support import Clock, load_config

from pg_advisory_exporter.collect.scheduling import CollectionPool, Watchdog
from pg_advisory_exporter.collect.target import Target
from pg_advisory_exporter.fleet.discovery import (
    AllowList,
    Refused,
    TargetAddress,
    parse_allowed,
    parse_target,
    resolve,
)
from pg_advisory_exporter.http import discovered as discovered_module
from pg_advisory_exporter.http.discovered import DiscoveredTargets, ProbeRefused, Refusal
from pg_advisory_exporter.validation import ConfigError


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("10.1.2.3", "10.1.2.3:5432"),  # no database: the whole server
        ("10.1.2.3:6432/orders", "10.1.2.3:6432/orders"),
        ("DB-1.Example.COM.", "db-1.example.com:5432"),
        ("db.example.com/billing", "db.example.com:5432/billing"),
        ("[::1]", "[::1]:5432"),
        ("[2001:DB8:0:0::1]:5433/x", "[2001:db8::1]:5433/x"),
        ("[::ffff:127.0.0.1]:5432", "127.0.0.1:5432"),  # IPv4-mapped: one address
    ],
)
def test_a_target_is_normalised(text: str, name: str) -> None:
    assert parse_target(text).name == name


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("monitor:secret@db.example.com", "no user or password"),
        ("monitor@db.example.com", "no user or password"),
        ("host=db.example.com port=5432", "never a DSN or libpq keywords"),
        ("db.example.com/x?sslmode=disable", "never a DSN or libpq keywords"),
        ("db.example.com sslmode=disable", "never a DSN or libpq keywords"),
        ("postgresql://db.example.com/x", "never a DSN"),
        ("::1", "IPv6 in brackets"),
        ("[::1", "IPv6 in brackets"),
        ("[db.example.com]", "not an IPv6 address"),
        ("[fe80::1%eth0]", "has no zone"),
        ("db.example.com:0", "the port must be"),
        ("db.example.com:65536", "the port must be"),
        ("db.example.com:54x", "the port must be"),
        ("db.example.com/", "not a database name"),
        ("db.example.com/a/b", "not a database name"),
        ("0177.0.0.1", "not a host name"),  # read by the resolver as 127.0.0.1
        ("2130706433", "not a host name"),
        ("-db.example.com", "not a host name"),
        ("", "not HOST"),
    ],
)
def test_a_malformed_target_is_refused(text: str, why: str) -> None:
    with pytest.raises(Refused, match=why.replace("?", r"\?")):
        parse_target(text)


@given(
    address=st.ip_addresses(),
    port=st.integers(1, 65535),
    dbname=st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_$.-]{0,20}", fullmatch=True),
)
def test_normalising_twice_changes_nothing(
    address: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int, dbname: str
) -> None:
    host = f"[{address}]" if address.version == 6 else str(address)
    parsed = parse_target(f"{host}:{port}/{dbname}")
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    assert parsed == TargetAddress(mapped or address, port, dbname)
    assert parse_target(parsed.name) == parsed


@given(st.text(max_size=20), st.sampled_from("@= ?"), st.text(max_size=20))
def test_credentials_and_keywords_never_pass(before: str, mark: str, after: str) -> None:
    with pytest.raises(Refused):
        parse_target(before + mark + after)


def _allows(entries: list[str], target: str, *addresses: str) -> bool:
    allowed = AllowList([parse_allowed(entry) for entry in entries])
    parsed = parse_target(target)
    return allowed.admits(parsed, [ipaddress.ip_address(a) for a in addresses])


def test_networks_admit_the_addresses_in_them_on_their_port() -> None:
    assert _allows(["10.0.0.0/8"], "10.9.8.7:6000", "10.9.8.7")
    assert not _allows(["10.0.0.0/8"], "11.0.0.1", "11.0.0.1")
    assert _allows(["10.0.0.0/8:5432"], "10.0.0.1", "10.0.0.1")
    assert not _allows(["10.0.0.0/8:5432"], "10.0.0.1:5433", "10.0.0.1")
    assert _allows(["[fd00::/8]:5432"], "[fd00::1]", "fd00::1")
    # A probe's IPv4-mapped address is the IPv4 address it reaches, which the network holds.
    mapped = parse_target("[::ffff:10.0.0.1]")
    assert AllowList([parse_allowed("10.0.0.0/8")]).admits(mapped, resolve(mapped, 0))


def test_a_name_is_admitted_only_if_every_address_is() -> None:
    # All addresses in the network: admitted; one outside: refused.
    assert _allows(["10.0.0.0/8"], "db.example.com", "10.0.0.1", "10.0.0.2")
    assert not _allows(["10.0.0.0/8"], "db.example.com", "10.0.0.1", "192.168.0.1")


def test_name_patterns_admit_names_under_them_but_not_special_addresses() -> None:
    assert _allows(["*.db.internal"], "pg-1.eu.db.internal", "192.168.4.5")
    assert not _allows(["*.db.internal"], "db.internal", "192.168.4.5")
    assert not _allows(["*.db.internal"], "evil-db.internal", "192.168.4.5")
    assert _allows(["pg.example.com:5432"], "pg.example.com", "192.168.4.5")
    assert not _allows(["pg.example.com:5432"], "pg.example.com:6432", "192.168.4.5")
    # A DNS answer cannot turn an allowed name into the exporter's host or the metadata
    # service; a network of the list can admit them.
    for special in ("127.0.0.1", "169.254.169.254", "::1", "0.0.0.0", "::ffff:169.254.169.254"):
        assert not _allows(["*.db.internal"], "pg.db.internal", special), special
    assert _allows(["*.db.internal", "127.0.0.0/8"], "pg.db.internal", "127.0.0.1")


def test_a_name_no_entry_could_admit_is_not_resolved() -> None:
    names_only = AllowList([parse_allowed("*.db.internal:5432")])
    assert not names_only.may_resolve("pg.example.com", 5432)
    assert not names_only.may_resolve("pg.db.internal", 6432)
    assert names_only.may_resolve("pg.db.internal", 5432)
    assert AllowList([parse_allowed("10.0.0.0/8")]).may_resolve("pg.example.com", 1)


@pytest.mark.parametrize(
    "entry", ["10.0.0.1/8", "*.*.example.com", "db.*.example.com", "a:b:c", "1.2.3", "x:99999"]
)
def test_a_bad_allow_list_entry_is_refused(entry: str) -> None:
    with pytest.raises(ValueError, match=entry.replace("*", r"\*")):
        parse_allowed(entry)


def test_a_module_without_allowed_targets_is_a_located_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as error:
        load_config(tmp_path, {"auth_modules": {"fleet": {"user": "monitor"}}})
    assert str(error.value) == (
        f"{tmp_path / 'config.yaml'}: auth_modules.fleet.allowed_targets: an auth module needs "
        "allowed_targets: the networks (10.0.0.0/8) and host names (*.db.internal), with "
        "optional ports, that probes may name"
    )


@pytest.mark.parametrize(
    ("module", "where"),
    [
        ({"allowed_targets": ["10.0.0.1/8"]}, "auth_modules.fleet.allowed_targets[0]: "),
        ({"options": {"host": "x"}}, "auth_modules.fleet.options: host: an auth module's"),
        ({"options": {"password": "x"}}, "auth_modules.fleet.options: password:"),
        ({"dbname": "a b"}, "auth_modules.fleet.dbname: "),
        ({"collection": {"min_interval": "soon"}}, "auth_modules.fleet.collection.min_interval"),
    ],
)
def test_module_errors_are_located(tmp_path: Path, module: dict[str, object], where: str) -> None:
    fleet = {"user": "monitor", "allowed_targets": ["10.0.0.0/8"], **module}
    with pytest.raises(ConfigError) as error:
        load_config(tmp_path, {"auth_modules": {"fleet": fleet}})
    assert f"config.yaml: {where}" in str(error.value)


def test_a_module_takes_the_top_level_settings_it_does_not_override(tmp_path: Path) -> None:
    config = load_config(
        tmp_path,
        {
            "collection": {"statement_timeout": "2s", "min_interval": "1s"},
            "catalog": False,
            "auth_modules": {
                "fleet": {
                    "user": "monitor",
                    "options": {"sslmode": "verify-full"},
                    "collection": {"min_interval": "3s"},
                    "allowed_targets": ["*.db.internal"],
                }
            },
            "discovered_targets": {"idle_after": "2m", "max": 5},
        },
    )
    module = config.auth_modules["fleet"]
    assert (module.collection.statement_timeout, module.collection.min_interval) == (2.0, 3.0)
    assert module.catalog is False
    assert module.dbname == "postgres"
    limits = config.discovered_targets
    assert (limits.idle_after, limits.max) == (120.0, 5)
    settings = module.target(
        parse_target("pg.db.internal/orders"), ipaddress.ip_address("10.0.0.7")
    )
    assert settings.name == "pg.db.internal:5432"  # the server's: it reads every database
    # The checked address is where libpq connects; the name is what TLS verifies; the
    # database is the module's, whichever the probe names.
    assert settings.dsn == (
        "host=pg.db.internal hostaddr=10.0.0.7 port=5432 dbname=postgres user=monitor "
        "sslmode=verify-full"
    )


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def discovered(tmp_path: Path, clock: Clock) -> Iterator[DiscoveredTargets]:
    """The registry of a module for 10.0.0.0/8 and *.db.internal; its targets never connect
    in these tests (a Target connects at its first collection)."""
    config = load_config(
        tmp_path,
        {
            "auth_modules": {
                "fleet": {"user": "monitor", "allowed_targets": ["10.0.0.0/8", "*.db.internal"]}
            },
            "discovered_targets": {"idle_after": "100ms", "max": 3},
        },
    )
    pool, watchdog = CollectionPool(1), Watchdog()
    registry = DiscoveredTargets(
        pool, watchdog, config.auth_modules, config.discovered_targets, clock=clock
    )
    yield registry
    registry.close()
    pool.shutdown()


def _resolving(monkeypatch: pytest.MonkeyPatch, *answers: list[str]) -> list[str]:
    """Make host names resolve to each answer in turn; the names looked up are returned."""
    asked: list[str] = []
    replies = iter(answers)

    def resolve(target: TargetAddress, wait: float) -> list[ipaddress.IPv4Address]:
        asked.append(str(target.host))
        return [ipaddress.IPv4Address(a) for a in next(replies)]

    monkeypatch.setattr(discovered_module, "resolve", resolve)
    return asked


def test_a_name_keeps_its_connection_while_it_resolves_to_its_address(
    discovered: DiscoveredTargets, monkeypatch: pytest.MonkeyPatch
) -> None:
    _resolving(monkeypatch, ["10.0.0.1", "10.0.0.2"], ["10.0.0.2", "10.0.0.1"], ["10.0.0.3"])
    first = discovered.probe("pg.example.com", "fleet")
    assert isinstance(first, Target)
    assert "hostaddr=10.0.0.1" in first.config.dsn
    assert discovered.probe("pg.example.com", "fleet") is first  # round-robin order
    moved = discovered.probe("pg.example.com", "fleet")  # resolves elsewhere now
    assert isinstance(moved, Target)
    assert moved is not first
    assert "hostaddr=10.0.0.3" in moved.config.dsn


def test_every_address_of_a_name_is_checked(
    discovered: DiscoveredTargets, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked = _resolving(monkeypatch, ["10.0.0.1"], ["10.0.0.1", "192.168.0.1"])
    assert isinstance(discovered.probe("pg.example.com:5432", "fleet"), Target)
    refused = discovered.probe("other.example.com", "fleet")  # one address outside
    assert isinstance(refused, ProbeRefused)
    assert refused.refusal is Refusal.NOT_ALLOWED
    assert asked == ["pg.example.com", "other.example.com"]
    assert len([s for s in discovered.samples() if s.value]) == 3  # target, server, refusal


def test_idle_targets_are_forgotten_and_the_cap_frees(
    discovered: DiscoveredTargets, clock: Clock
) -> None:
    for host in ("10.0.0.1", "10.0.0.2", "10.0.0.3"):
        assert isinstance(discovered.probe(host, "fleet"), Target)
    full = discovered.probe("10.0.0.4", "fleet")
    assert isinstance(full, ProbeRefused)
    assert full.refusal is Refusal.LIMIT_REACHED
    assert isinstance(discovered.probe("10.0.0.1", "fleet"), Target)  # kept ones still serve
    clock.now += 0.15  # idle_after passes
    discovered.sweep()
    assert isinstance(discovered.probe("10.0.0.4", "fleet"), Target)
    counts = {s.name: s.value for s in discovered.samples() if not s.labels}
    assert counts == {
        "pg_advisory_exporter_discovered_targets": 1,
        "pg_advisory_exporter_discovered_servers": 1,
    }


def test_a_changed_module_closes_its_targets(discovered: DiscoveredTargets, tmp_path: Path) -> None:
    """A kept target is reused without its settings being made again: only because a reload
    that changes its module closes it, and the next probe makes it anew, or refuses it."""
    kept = discovered.probe("10.0.0.1", "fleet")
    assert isinstance(kept, Target)
    assert discovered.probe("10.0.0.1", "fleet") is kept

    def reload(allowed: str) -> None:
        changed = load_config(
            tmp_path, {"auth_modules": {"fleet": {"user": "auditor", "allowed_targets": [allowed]}}}
        )
        discovered.update(changed.auth_modules, changed.discovered_targets)

    reload("10.0.0.0/8")  # another user, the same allow-list
    again = discovered.probe("10.0.0.1", "fleet")
    assert isinstance(again, Target)
    assert again is not kept
    assert "user=auditor" in again.config.dsn
    assert "user=monitor" in kept.config.dsn
    reload("10.1.0.0/16")  # it is no longer allowed
    refused = discovered.probe("10.0.0.1", "fleet")
    assert isinstance(refused, ProbeRefused)
    assert refused.refusal is Refusal.NOT_ALLOWED
