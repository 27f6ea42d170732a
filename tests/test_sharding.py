"""Which replica collects a target: jump consistent hash, and the shard settings."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from support import EXAMPLE_DSN, load_config

from pg_advisory_exporter.config.loader import load
from pg_advisory_exporter.config.settings import Config
from pg_advisory_exporter.daemon import Daemon
from pg_advisory_exporter.fleet.sharding import Shard, jump_hash, ordinal_of, target_key
from pg_advisory_exporter.validation import ConfigError

NAMES = [f"db-{i:03d}" for i in range(200)]
names = st.lists(st.text(min_size=1, max_size=40), min_size=1, max_size=50, unique=True)


# Neither the exporter's variables nor DATA_SOURCE_NAME of the shell that runs the tests.
pytestmark = pytest.mark.usefixtures("clean_environment")


def _moved(names: list[str], total: int) -> float:
    """The share of the targets whose shard changes from total to total + 1 shards."""
    before, after = Shard(total=total), Shard(total=total + 1)
    return sum(before.owner(n) != after.owner(n) for n in names) / len(names)


def test_the_published_test_vectors() -> None:
    # From the Go implementations of the paper's C++ code (dgryski/go-jump, jump_test.go).
    vectors = [(1, 1, 0), (42, 57, 43), (0xDEAD10CC, 1, 0), (0xDEAD10CC, 666, 361)]
    assert [jump_hash(key, buckets) for key, buckets, _ in vectors] == [v[2] for v in vectors]
    assert jump_hash(256, 1024) == 520


def test_the_key_is_stable_across_processes() -> None:
    # Python's hash() of a str changes with PYTHONHASHSEED; replicas must agree.
    assert target_key("orders") == 0x1C168ADB00D208E4
    assert Shard(total=3).owner("orders") == 1


@given(names, st.integers(min_value=1, max_value=64))
def test_every_target_is_in_exactly_one_shard(targets: list[str], total: int) -> None:
    for name in targets:
        owners = [index for index in range(total) if Shard(index, total).owns(name)]
        assert owners == [Shard(total=total).owner(name)]


@given(st.integers(min_value=0, max_value=2**64 - 1), st.integers(min_value=1, max_value=1000))
def test_growing_moves_keys_only_to_the_new_shard(key: int, total: int) -> None:
    before, after = jump_hash(key, total), jump_hash(key, total + 1)
    assert 0 <= before < total
    assert after in (before, total)
    assert jump_hash(key, total) == before  # deterministic


def test_two_to_three_shards_moves_at_most_forty_percent_of_200_targets() -> None:
    assert _moved(NAMES, 2) <= 0.40


@pytest.mark.parametrize("total", [1, 2, 3, 4, 5, 8, 10, 16])
def test_n_to_n_plus_one_shards_moves_about_one_in_n_plus_one(total: int) -> None:
    fleet = [f"server-{i}" for i in range(5000)]
    assert _moved(fleet, total) == pytest.approx(1 / (total + 1), abs=0.03)


def test_shards_are_about_even() -> None:
    counts = [sum(Shard(i, 3).owns(n) for n in NAMES) for i in range(3)]
    assert sum(counts) == len(NAMES)
    assert min(counts) >= 50


@pytest.mark.parametrize(
    ("host", "ordinal"), [("exp-2", 2), ("pg-advisory-exporter-10", 10), ("a-0", 0)]
)
def test_the_ordinal_of_a_statefulset_pod(host: str, ordinal: int) -> None:
    assert ordinal_of(host) == ordinal


@pytest.mark.parametrize("host", ["exporter", "exporter-", "exporter-2a", "exp2"])
def test_a_host_name_without_an_ordinal_is_refused(host: str) -> None:
    with pytest.raises(ValueError, match="does not end in -N"):
        ordinal_of(host)


def _load(
    tmp_path: Path, flags: dict[str, object], shard: dict[str, object] | None = None
) -> Shard:
    document: dict[str, object] = {"targets": [{"name": "a", "dsn": EXAMPLE_DSN}]}
    if shard is not None:
        document["shard"] = shard
    return load_config(tmp_path, document, **flags).shard


def test_unsharded_by_default(tmp_path: Path) -> None:
    assert _load(tmp_path, {}) == Shard(index=0, total=1)


def test_flag_variable_and_file_key_set_the_shard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _load(tmp_path, {}, {"total": 3, "index": 2}) == Shard(2, 3)
    assert _load(tmp_path, {"shard_total": "3", "shard_index": "1"}) == Shard(1, 3)
    monkeypatch.setenv("PG_ADVISORY_EXPORTER_SHARD_TOTAL", "4")
    monkeypatch.setenv("PG_ADVISORY_EXPORTER_SHARD_INDEX", "3")
    assert _load(tmp_path, {}, {"total": 2, "index": 1}) == Shard(3, 4)
    assert _load(tmp_path, {"shard_index": "0"}) == Shard(0, 4)


def test_auto_takes_the_ordinal_of_the_host_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: "pg-advisory-exporter-2")
    assert _load(tmp_path, {"shard_total": "3", "shard_index": "auto"}) == Shard(2, 3)
    monkeypatch.setattr(socket, "gethostname", lambda: "db-host")
    with pytest.raises(ConfigError, match=r"^flag --shard.index: auto: the host name 'db-host'"):
        _load(tmp_path, {"shard_total": "3", "shard_index": "auto"})


def test_an_index_past_the_total_names_both_sources(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigError) as error:
        _load(tmp_path, {}, {"index": 1})
    assert str(error.value) == (
        f"{tmp_path / 'config.yaml'}: shard.index: there is no shard 1: "
        "the default of --shard.total makes 1, numbered 0 to 0"
    )
    monkeypatch.setenv("PG_ADVISORY_EXPORTER_SHARD_TOTAL", "2")
    with pytest.raises(ConfigError) as error:
        _load(tmp_path, {"shard_index": "2"})
    assert str(error.value) == (
        "flag --shard.index: there is no shard 2: environment variable "
        "PG_ADVISORY_EXPORTER_SHARD_TOTAL makes 2, numbered 0 to 1"
    )


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"shard_total": "0"}, "flag --shard.total: Input should be greater than or equal to 1"),
        ({"shard_index": "-1"}, "flag --shard.index: '-1' is not a shard index"),
        ({"shard_index": "first"}, "flag --shard.index: 'first' is not a shard index"),
    ],
)
def test_bad_shard_values_are_refused_where_given(
    tmp_path: Path, flags: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=f"^{message}"):
        _load(tmp_path, flags)


def test_a_bad_file_value_names_its_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"config.yaml: shard.index: True is not a shard index"):
        _load(tmp_path, {}, {"index": True})


def test_a_reload_reassigns_the_targets(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    targets = [{"name": name, "dsn": EXAMPLE_DSN} for name in NAMES[:20]]

    def write(shard: dict[str, int]) -> None:
        path.write_text(yaml.safe_dump({"shard": shard, "targets": targets}))

    def reread() -> Config:
        flags = {"config_file": str(path), "web_listen_address": "127.0.0.1:0"}
        return load(flags)

    write({"total": 2, "index": 0})
    daemon = Daemon(reread(), reread)  # nothing connects before a scrape
    try:
        first = {t.name for t in daemon.targets()}
        assert first == {n for n in NAMES[:20] if Shard(0, 2).owns(n)}
        write({"total": 2, "index": 1})
        assert daemon.reload() is None
        second = {t.name for t in daemon.targets()}
        assert second == set(NAMES[:20]) - first
        assert daemon.elsewhere(min(first)) == (
            f"target {min(first)!r} is collected by shard 0 of 2; this exporter is shard 1: "
            "ask that replica"
        )
        assert daemon.elsewhere(min(second)) is None
        assert daemon.elsewhere("not-configured") is None
    finally:
        daemon.shutdown()
