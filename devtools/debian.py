"""Debian roots made with debootstrap, and the mirror they come from: the container image's
local base (tests/containers.py) and the Debian sid root of PostgreSQL 19
(devtools/debian_sid.py)."""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

DEFAULT_MIRROR = "http://deb.debian.org/debian"
SOURCES = Path("/etc/apt/sources.list.d/debian.sources")  # deb822, Debian 12's own format
ONE_LINE_SOURCES = Path("/etc/apt/sources.list")


def debian_mirror(
    suite: str | None = None, sources: Path = SOURCES, one_line: Path = ONE_LINE_SOURCES
) -> str:
    """The Debian mirror this machine's apt uses, for `suite` (None: for any suite but the
    security archive's, which serves no other), else Debian's own. A mirror that serves one
    suite serves them all: sid and experimental come from where bookworm does."""

    def wanted(uri: str, suites: list[str]) -> bool:
        return suite in suites if suite else "security" not in uri

    if sources.exists():
        for stanza in sources.read_text().split("\n\n"):
            fields = dict(
                line.split(":", 1) for line in stanza.splitlines() if ":" in line and line[0] != "#"
            )
            uris = fields.get("URIs", "").split()
            if uris and wanted(uris[0], fields.get("Suites", "").split()):
                return uris[0]
    if one_line.exists():
        for line in one_line.read_text().splitlines():
            # deb [options] URI SUITE COMPONENTS...
            words = re.sub(r"\[[^]]*\]", "", line.split("#", 1)[0]).split()
            if len(words) >= 3 and words[0] == "deb" and wanted(words[1], words[2:3]):
                return words[1]
    return DEFAULT_MIRROR


def mounts_under(root: Path) -> list[str]:
    """The mount points inside `root`, the deepest first."""
    prefix = f"{root.resolve()}/"
    points = [
        line.split()[1]
        for line in Path("/proc/self/mounts").read_text().splitlines()
        if line.split()[1].startswith(prefix)
    ]
    return sorted(points, reverse=True)


def remove_root(root: Path) -> bool:
    """Delete a Debian root made here; whether it is gone. debootstrap mounts /proc and /sys
    inside it (and /dev on some hosts) and unmounts them when it ends; killed by a timeout, it
    leaves them, and deleting through such a mount would reach the host's files."""
    for mount in mounts_under(root):
        subprocess.run(["umount", "--lazy", mount], check=False, capture_output=True)
    if mounts_under(root):
        return False  # left for a person to look at rather than deleted through a mount
    shutil.rmtree(root, ignore_errors=True)
    return not root.exists()


@contextlib.contextmanager
def proc_mounted(root: Path) -> Iterator[None]:
    """/proc mounted in `root` while the block runs (packages' scripts need it), and never
    after: a root with the host's /proc in it must not be deleted, nor left for someone to."""
    target = root / "proc"
    subprocess.run(["mount", "-t", "proc", "proc", str(target)], check=True, capture_output=True)
    try:
        yield
    finally:
        # A process of the install may still hold it (a daemon a script started): detach it
        # lazily rather than leave it mounted.
        if subprocess.run(["umount", str(target)], check=False, capture_output=True).returncode:
            subprocess.run(["umount", "--lazy", str(target)], check=False, capture_output=True)
