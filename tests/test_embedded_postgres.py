"""The cache of downloaded server binaries: only a directory of the user's own is trusted."""

from __future__ import annotations

import contextlib
import os
import socket
import stat
from pathlib import Path

import pytest

from devtools.embedded_postgres import (
    CACHE_VARIABLE,
    PORTS_VARIABLE,
    WHEEL_VERSIONS,
    EmbeddedPostgresError,
    _wheel_bindir,
    cache_dir,
    free_port,
)

NOBODY = 65534


def _plant_server(cache: Path) -> None:
    """A `postgres` where the cache would keep a downloaded one, as an attacker would."""
    for major, version in WHEEL_VERSIONS.items():
        postgres = cache / f"postgresql-{version}" / "bin" / "postgres"
        postgres.parent.mkdir(parents=True)
        postgres.write_text(f"#!/bin/sh\necho planted {major}\n")
        postgres.chmod(0o755)


def test_the_cache_is_created_for_this_user_alone(tmp_path: Path) -> None:
    path = cache_dir({CACHE_VARIABLE: str(tmp_path / "new" / "cache")})
    assert path == tmp_path / "new" / "cache"
    status = path.stat()
    assert status.st_uid == os.geteuid()
    assert not status.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if os.geteuid() != 0:  # under root the server's own user must read it
        assert stat.S_IMODE(status.st_mode) == 0o700


@pytest.mark.skipif(os.geteuid() == 0, reason="root's cache is /var/cache/pg-advisory-exporter")
def test_the_default_cache_is_in_the_users_cache_directory(tmp_path: Path) -> None:
    path = cache_dir({"XDG_CACHE_HOME": str(tmp_path)})
    assert path == tmp_path / "pg-advisory-exporter"
    assert stat.S_IMODE(path.stat().st_mode) == 0o700


def test_a_cache_others_can_write_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "shared"
    cache.mkdir()
    _plant_server(cache)
    cache.chmod(0o1777)  # as /tmp is
    with pytest.raises(EmbeddedPostgresError, match=r"others can write to it \(mode 1777\)"):
        cache_dir({CACHE_VARIABLE: str(cache)})
    monkeypatch.setenv(CACHE_VARIABLE, str(cache))
    with pytest.raises(EmbeddedPostgresError, match="refusing the PostgreSQL binary cache"):
        _wheel_bindir(min(WHEEL_VERSIONS))  # the planted server is not run


def test_a_cache_of_another_user_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if os.geteuid() == 0:
        cache = tmp_path / "theirs"
        cache.mkdir(mode=0o755)
        _plant_server(cache)
        os.chown(cache, NOBODY, NOBODY)
    else:
        cache = Path("/")  # root's, and a directory this user cannot have made
    with pytest.raises(EmbeddedPostgresError, match=f"belongs to uid {cache.stat().st_uid}"):
        cache_dir({CACHE_VARIABLE: str(cache)})
    monkeypatch.setenv(CACHE_VARIABLE, str(cache))
    with pytest.raises(EmbeddedPostgresError, match="not to you"):
        _wheel_bindir(min(WHEEL_VERSIONS))


def _three_free_ports() -> int:
    """The first of three free ports in a row, below the kernel's ephemeral ports: nothing
    takes one of those unless it asks for it."""
    for low in range(28000, 32000, 3):
        with contextlib.ExitStack() as stack:
            try:
                for port in range(low, low + 3):
                    stack.enter_context(socket.socket()).bind(("127.0.0.1", port))
            except OSError:
                continue
        return low
    pytest.fail("no three free ports in a row")


def test_ports_come_in_turn_from_the_given_range_skipping_those_in_use() -> None:
    """`make test` runs versions side by side, each with ports of its own."""
    low = _three_free_ports()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", low + 1))
        taken.listen()
        handed_out = [free_port({PORTS_VARIABLE: f"{low}-{low + 2}"}) for _ in range(4)]
        assert set(handed_out) == {low, low + 2}  # never the one in use
        assert handed_out[0] != handed_out[1]
        with pytest.raises(EmbeddedPostgresError, match=PORTS_VARIABLE):
            free_port({PORTS_VARIABLE: f"{low + 1}-{low + 1}"})
