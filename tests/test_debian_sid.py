"""What Debian 12 lacks, from Debian sid: the mirror it comes from, a refusal without root
that says what to do, and /proc never left mounted in a root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from devtools import debian_sid
from devtools.debian import debian_mirror, mounts_under, proc_mounted
from devtools.debian_sid import InstallError, install_postgres, prometheus_binary, sequel_lib
from devtools.embedded_postgres import (
    CACHE_VARIABLE,
    EmbeddedPostgres,
    EmbeddedPostgresError,
    find_server_binaries,
)

DEB822 = """\
Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main

Types: deb
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main
"""
ONE_LINE = """\
# deb http://commented.example/debian bookworm main
deb [arch=amd64 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://security.example/debian-security bookworm-security main
deb http://one.example/debian bookworm main
"""  # noqa: E501


def test_the_mirror_is_the_one_apt_uses_not_the_security_archive(tmp_path: Path) -> None:
    deb822, one_line, missing = tmp_path / "d.sources", tmp_path / "s.list", tmp_path / "none"
    deb822.write_text(DEB822)
    one_line.write_text(ONE_LINE)
    assert debian_mirror(None, deb822, missing) == "http://mirror.example/debian"
    assert debian_mirror("bookworm", deb822, missing) == "http://mirror.example/debian"
    assert debian_mirror(None, missing, one_line) == "http://one.example/debian"
    assert debian_mirror("trixie", deb822, one_line) == "http://deb.debian.org/debian"


@pytest.fixture
def not_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """As a user who is not root, with a binary cache of its own."""
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(os, "getegid", lambda: 1000)
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    monkeypatch.setenv(CACHE_VARIABLE, str(cache))
    monkeypatch.setattr("devtools.embedded_postgres._check_private", lambda path: None)


def test_without_root_postgresql_19_is_refused_saying_how_to_do_without(not_root: None) -> None:
    with pytest.raises(InstallError) as refused:
        install_postgres(19)
    assert "need root" in str(refused.value)
    assert "PG_VERSIONS='15 14 16 17 18' make test" in str(refused.value)


def test_a_19_not_installed_names_the_command_that_installs_it(not_root: None) -> None:
    with pytest.raises(EmbeddedPostgresError, match=r"python -m devtools\.debian_sid postgres"):
        find_server_binaries(19)
    with pytest.raises(InstallError, match=r"python -m devtools\.debian_sid prometheus"):
        prometheus_binary("promtool")
    with pytest.raises(InstallError, match=r"python -m devtools\.debian_sid sequel"):
        sequel_lib()


def test_sequel_is_found_by_its_gems_folder(not_root: None, tmp_path: Path) -> None:
    gems = tmp_path / "cache" / "ruby-sequel" / "usr/share/rubygems-integration/all/gems"
    (gems / "sequel-5.109.0" / "lib").mkdir(parents=True)
    assert sequel_lib() == gems / "sequel-5.109.0" / "lib"


def test_a_server_in_the_sid_root_needs_root(not_root: None, tmp_path: Path) -> None:
    bindir = tmp_path / "cache" / "debian-sid" / "usr" / "lib" / "postgresql" / "19" / "bin"
    bindir.mkdir(parents=True)
    (bindir / "postgres").touch()
    with pytest.raises(EmbeddedPostgresError, match="through chroot, which needs root"):
        EmbeddedPostgres(major=19)


def test_the_newer_of_sid_and_experimental_is_installed(tmp_path: Path) -> None:
    for folder in ("etc/apt", "usr/sbin"):
        (tmp_path / folder).mkdir(parents=True)
    debian_sid._configure_apt(tmp_path, 19, "http://mirror.example/debian")
    assert (tmp_path / "etc/apt/sources.list").read_text().splitlines() == [
        "deb http://mirror.example/debian sid main",
        "deb http://mirror.example/debian experimental main",
    ]
    # Pinned as sid is (500), experimental's are taken when their version is the higher.
    assert (tmp_path / "etc/apt/preferences.d/postgresql-19").read_text() == (
        "Package: postgresql-19 postgresql-client-19 libpq5\n"
        "Pin: release a=experimental\nPin-Priority: 500\n"
    )
    policy = tmp_path / "usr/sbin/policy-rc.d"
    assert policy.read_text().endswith("exit 101\n")  # no service of the root started
    assert os.access(policy, os.X_OK)


@pytest.mark.integration  # mounts: root only, and not the unit tier's
@pytest.mark.skipif(os.geteuid() != 0, reason="mounting /proc needs root")
def test_proc_is_unmounted_however_the_install_ends(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    with proc_mounted(tmp_path):
        assert mounts_under(tmp_path) == [str(tmp_path.resolve() / "proc")]
        assert (tmp_path / "proc" / "self").exists()
    assert mounts_under(tmp_path) == []
    with pytest.raises(RuntimeError), proc_mounted(tmp_path):
        raise RuntimeError("a package's script failed")
    assert mounts_under(tmp_path) == []
