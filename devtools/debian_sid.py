"""What Debian 12 lacks for the tests, from Debian's newer suites: PostgreSQL 19 in a Debian
sid root, Prometheus 3 with its promtool, and a Sequel whose Migrator takes an advisory lock.

`python -m devtools.debian_sid [postgres] [prometheus] [sequel]` (all unless named; `make test`
runs it) installs what is missing into the server binary cache (embedded_postgres.cache_dir:
/var/cache/pg-advisory-exporter under root) and prints the versions there. A second run
finds them and does nothing; to pick up newer packages, delete the folders it names.

- PostgreSQL 19's packages need a newer glibc than Debian 12's, so they get a root of their
  own: debootstrap makes a minimal Debian sid root, and apt installs `postgresql-19` into it
  from sid or experimental, whichever has the newer version (19~rc1 in experimental as of
  December 2026, so the release is taken once it arrives). Its servers run there through
  chroot (embedded_postgres.py); making the root and entering it need root, so without root
  this refuses.
- Prometheus 3 and its promtool come from sid's packages, downloaded by apt's own client on
  a state of its own (the machine's apt sources stay as they are) and unpacked, never
  installed: Go programs that run on Debian 12. That needs no root.
- Sequel (ruby-sequel) the same way: Debian 12's 5.63 predates the Migrator's advisory lock
  (5.78); sid's is plain Ruby, which Debian 12's ruby and ruby-pg run (RUBYLIB).

The mirror is the one the machine's apt uses (devtools/debian.py): every Debian mirror
serves sid and experimental beside the stable release.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from devtools.debian import debian_mirror, proc_mounted, remove_root
from devtools.embedded_postgres import SID_MAJORS, cache_dir, sid_root

# A mirror that serves a snapshot of the archive keeps its Release files past their
# Valid-Until date: apt must not refuse them for that.
APT_OPTIONS = ("-o", "Acquire::Check-Valid-Until=false")
PROMETHEUS_MAJOR = "3"
PROMETHEUS_PACKAGES = ("prometheus", "promtool")
SEQUEL_PACKAGE = "ruby-sequel"
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
# Long enough for a slow mirror; debootstrap and apt take about a minute on a fast one.
STEP_TIMEOUT = 1800


class InstallError(RuntimeError):
    """What is missing could not be installed; the message says why and what to do."""


def prometheus_folder() -> Path:
    return cache_dir() / f"prometheus-{PROMETHEUS_MAJOR}"


def prometheus_binary(name: str = "prometheus") -> Path:
    """Prometheus 3's `prometheus` or `promtool`, installed by this module."""
    path = prometheus_folder() / "usr" / "bin" / name
    if not os.access(path, os.X_OK):
        raise InstallError(
            f"Prometheus {PROMETHEUS_MAJOR}'s {name} is not installed at {path}: "
            "run `make test`, or `.venv/bin/python -m devtools.debian_sid prometheus`"
        )
    return path


def sequel_folder() -> Path:
    return cache_dir() / SEQUEL_PACKAGE


def sequel_lib() -> Path:
    """sid's Sequel, installed by this module: the folder to put in RUBYLIB."""
    found = sorted(sequel_folder().glob("usr/share/rubygems-integration/all/gems/sequel-*/lib"))
    if not found:
        raise InstallError(
            f"sid's Sequel is not installed in {sequel_folder()}: run `make test`, or "
            "`.venv/bin/python -m devtools.debian_sid sequel`"
        )
    return found[-1]


def _postgres_packages(major: int) -> tuple[str, ...]:
    return (f"postgresql-{major}", f"postgresql-client-{major}", "libpq5")


def _run(command: Sequence[str | Path], log: Path, cwd: Path | None = None) -> None:
    """Run a step of the install, its output appended to `log`; its tail in the error."""
    with log.open("a") as output:
        output.write(f"\n$ {' '.join(map(str, command))}\n")
        output.flush()
        done = subprocess.run(
            [str(part) for part in command], stdout=output, stderr=subprocess.STDOUT,
            cwd=cwd, check=False, timeout=STEP_TIMEOUT,
        )  # fmt: skip
    if done.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise InstallError(f"{command[0]} failed ({log}):\n{tail}")


@contextlib.contextmanager
def _locked(name: str) -> Iterator[None]:
    """This install alone: two runs of the test command at once would both make the root."""
    with (cache_dir() / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _installed_version(root: Path, package: str) -> str | None:
    query = subprocess.run(
        ["chroot", str(root), "dpkg-query", "-W", "-f", "${Status} ${Version}", package],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    status = query.stdout.split()
    return status[-1] if query.returncode == 0 and "installed" in status[:3] else None


def _configure_apt(root: Path, major: int, mirror: str) -> None:
    """sid and experimental, the server's packages from whichever has the newer version; no
    service started by a package's script, and no cluster made (the tests make their own)."""
    (root / "etc/apt/sources.list").write_text(
        f"deb {mirror} sid main\ndeb {mirror} experimental main\n"
    )
    # experimental's packages have priority 1: taken only when asked for by name. At sid's
    # 500 for these, apt installs the higher version of the two suites.
    (root / "etc/apt/preferences.d").mkdir(parents=True, exist_ok=True)
    (root / f"etc/apt/preferences.d/postgresql-{major}").write_text(
        f"Package: {' '.join(_postgres_packages(major))}\n"
        "Pin: release a=experimental\nPin-Priority: 500\n"
    )
    policy = root / "usr/sbin/policy-rc.d"  # Debian's way to keep services of a chroot down
    policy.write_text("#!/bin/sh\nexit 101\n")
    policy.chmod(0o755)
    clusters = root / "etc/postgresql-common/createcluster.d"
    clusters.mkdir(parents=True, exist_ok=True)
    (clusters / "no-main-cluster.conf").write_text("create_main_cluster = false\n")


def _install_server(root: Path, major: int, mirror: str, log: Path) -> None:
    _configure_apt(root, major, mirror)
    _run(["chroot", root, "apt-get", *APT_OPTIONS, "update", "-qq"], log)
    with proc_mounted(root):  # the packages' scripts need it
        _run(
            ["chroot", root, "env", "DEBIAN_FRONTEND=noninteractive", "apt-get", *APT_OPTIONS,
             "install", "-y", "-qq", "--no-install-recommends", *_postgres_packages(major)],
            log,
        )  # fmt: skip
        _run(["chroot", root, "apt-get", "clean"], log)


def install_postgres(major: int) -> str:
    """A Debian sid root with PostgreSQL `major`'s server; its version, as the server says."""
    if major not in SID_MAJORS:
        raise InstallError(f"PostgreSQL {major} does not come from Debian sid here")
    if os.geteuid() != 0:
        raise InstallError(
            f"PostgreSQL {major} runs in a Debian sid root that debootstrap makes, entered "
            "with chroot: both need root. Run as root (as CI does), or leave it out: "
            "PG_VERSIONS='15 14 16 17 18' make test"
        )
    root = sid_root()
    with _locked(root.name):
        if _installed_version(root, f"postgresql-{major}") is None:
            log = cache_dir() / f"{root.name}.log"
            log.write_text("")
            mirror = debian_mirror()
            if root.exists():  # made for another major version
                _install_server(root, major, mirror, log)
            else:
                # Made aside and renamed when complete: a root that exists is a whole one.
                staging = root.with_name(f"{root.name}.partial")
                if staging.exists() and not remove_root(staging):
                    raise InstallError(f"{staging} has mounts inside: unmount them, delete it")
                _run(
                    ["debootstrap", "--variant=minbase", "--include=ca-certificates", "sid",
                     staging, mirror],
                    log,
                )  # fmt: skip
                _install_server(staging, major, mirror, log)
                staging.rename(root)
    version = subprocess.run(
        ["chroot", str(root), f"/usr/lib/postgresql/{major}/bin/postgres", "--version"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return version.stdout.strip()


def _download(folder: Path, packages: Sequence[str]) -> Path:
    """sid's `packages` (without their dependencies) unpacked into a folder of `folder`."""
    apt = folder / "apt"
    for part in ("lists/partial", "archives/partial"):
        (apt / part).mkdir(parents=True)
    (apt / "sources.list").write_text(f"deb [signed-by={KEYRING}] {debian_mirror()} sid main\n")
    options = [
        *APT_OPTIONS,
        "-o", f"Dir::Etc::SourceList={apt / 'sources.list'}",
        "-o", "Dir::Etc::SourceParts=/dev/null",
        "-o", f"Dir::State::Lists={apt / 'lists'}",
        "-o", f"Dir::Cache::Archives={apt / 'archives'}",
        "-o", "Dir::State::status=/dev/null",  # nothing installed: the packages only
    ]  # fmt: skip
    log = folder / "install.log"
    _run(["apt-get", *options, "update", "-qq"], log)
    _run(["apt-get", *options, "download", *packages], log, cwd=apt / "archives")
    unpacked = folder / "unpacked"
    for deb in sorted((apt / "archives").glob("*.deb")):
        _run(["dpkg-deb", "--extract", deb, unpacked], log)
    shutil.rmtree(apt)
    return unpacked


def _download_prometheus(folder: Path) -> None:
    """sid's packages unpacked into `folder`: usr/bin/prometheus and usr/bin/promtool."""
    unpacked = _download(folder, PROMETHEUS_PACKAGES)
    (folder / "usr/bin").mkdir(parents=True)
    for name in PROMETHEUS_PACKAGES:
        (unpacked / "usr/bin" / name).rename(folder / "usr/bin" / name)
    shutil.rmtree(unpacked)


def _download_sequel(folder: Path) -> None:
    """sid's ruby-sequel unpacked into `folder` (its usr/share/rubygems-integration)."""
    unpacked = _download(folder, [SEQUEL_PACKAGE])
    (unpacked / "usr").rename(folder / "usr")
    shutil.rmtree(unpacked)


def _installed_once(folder: Path, done: Path, download: Callable[[Path], None]) -> None:
    """`download` into `folder` once (`done` then exists): made aside, renamed when whole."""
    with _locked(folder.name):
        if not done.exists():
            staging = Path(tempfile.mkdtemp(prefix=f"{folder.name}.", dir=folder.parent))
            try:
                download(staging)
                staging.chmod(0o755)  # mkdtemp's 0700: the test servers' user runs none of it
                staging.rename(folder)
            finally:
                shutil.rmtree(staging, ignore_errors=True)


def install_prometheus() -> str:
    """Prometheus 3 and promtool from Debian sid; their versions."""
    folder = prometheus_folder()
    _installed_once(folder, folder / "usr/bin/promtool", _download_prometheus)
    versions = [
        subprocess.run(
            [str(prometheus_binary(name)), "--version"], capture_output=True, text=True, check=True
        ).stdout.splitlines()[0]
        for name in PROMETHEUS_PACKAGES
    ]
    for line in versions:  # prometheus, version 3.5.3+ds1 (branch: ...)
        if not line.split("version ", 1)[-1].startswith(f"{PROMETHEUS_MAJOR}."):
            raise InstallError(
                f"Debian sid now has {line}, not Prometheus {PROMETHEUS_MAJOR}: "
                f"update PROMETHEUS_MAJOR in {__file__} and the docs that name the version"
            )
    return "; ".join(versions)


def install_sequel() -> str:
    """Sequel from Debian sid; its version (the gem's folder)."""
    _installed_once(sequel_folder(), sequel_folder(), _download_sequel)
    return sequel_lib().parent.name


TARGETS = ("postgres", "prometheus", "sequel")


def main(argv: Sequence[str]) -> int:
    wanted = set(argv) or set(TARGETS)
    if unknown := wanted - set(TARGETS):
        print(
            f"usage: python -m devtools.debian_sid [postgres] [prometheus] [sequel]; not {unknown}"
        )
        return 2
    try:
        if "prometheus" in wanted:
            started = time.monotonic()
            found = install_prometheus()
            print(f"{found} ({time.monotonic() - started:.0f}s), in {prometheus_folder()}")
        if "sequel" in wanted:
            started = time.monotonic()
            found = install_sequel()
            print(f"{found} ({time.monotonic() - started:.0f}s), in {sequel_folder()}")
        if "postgres" in wanted:
            for major in sorted(SID_MAJORS):
                started = time.monotonic()
                found = install_postgres(major)
                print(f"{found} ({time.monotonic() - started:.0f}s), in {sid_root()}")
    except InstallError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
