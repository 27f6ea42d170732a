"""The source revision the running code was built from, for `--version`.

A wheel or image carries it in `_build.py`, which setup.py's build hook writes from
`VCS_REF` (the image's build argument) or from the checkout it builds (`from_checkout`);
code run from a checkout reads that checkout. Nothing else knows it: then it is None, and
`--version` names the version alone. The metric contract has no revision (build_info's
labels stay `version`, `python_version`: docs/development.md says why).

This module imports nothing of the package: setup.py loads it by its path, before the
package is installed, so that the revision is found one way at build time and at run time.
"""

from __future__ import annotations

import importlib
import subprocess
from pathlib import Path

# The checkout that the source folder exporter/ sits in, when the code runs from one.
_SOURCE_ROOT = Path(__file__).resolve().parent.parent
# Shown in `--version`: as many hex digits as GitHub shows, enough to be unique.
SHORT = 12


def from_checkout(root: Path) -> str | None:
    """The commit checked out at `root`, suffixed `-dirty` when tracked files differ from it;
    None where `root` is not itself the top of a git checkout or git is missing (a folder
    inside some other checkout, such as a virtualenv in this one, is not the code's)."""
    if not (root / ".git").exists():  # a file in a worktree, a folder in a clone
        return None

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, check=True, timeout=30
        ).stdout.strip()

    try:
        head = git("rev-parse", "HEAD")
        changed = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head}-dirty" if changed else head


def revision() -> str | None:
    """The revision baked in at build time, else the checkout's the code runs from, else
    None."""
    try:
        baked: str = importlib.import_module(f"{__package__}._build").REVISION
    except ImportError:
        return from_checkout(_SOURCE_ROOT)
    return baked


def describe(version: str) -> str:
    """`0.4.0 (revision 5e51c08a1b2c)`, or the version alone where the revision is unknown."""
    found = revision()
    if found is None:
        return version
    commit, dirty, _ = found.partition("-dirty")
    return f"{version} (revision {commit[:SHORT]}{dirty})"
