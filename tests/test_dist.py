"""`make dist` as a release runs it: every file it publishes, its checksum, and the version
and revision inside each (the wheel's metadata, the sdist's PKG-INFO, the packaged chart's
Chart.yaml, the image archive's labels)."""

from __future__ import annotations

import hashlib
import json
import shlex
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import pytest
from containers import ROOT, Podman
from helm_python.chart import Chart
from support import RunProgram, load_yaml

from devtools.dist import CHART
from pg_advisory_exporter import __version__
from pg_advisory_exporter.revision import from_checkout

# The image fixture builds the image first (minutes, shared with tests/test_image.py); make
# dist then saves it rather than building it twice.
pytestmark = pytest.mark.timeout(900)

WHEEL = f"pg_advisory_exporter-{__version__}-py3-none-any.whl"
SDIST = f"pg_advisory_exporter-{__version__}.tar.gz"
CHART_ARCHIVE = f"pg-advisory-exporter-{__version__}.tgz"
IMAGE_ARCHIVE = f"pg-advisory-exporter-{__version__}-image.tar"


def _field(text: str, name: str) -> str:
    [value] = [line.split(": ", 1)[1] for line in text.splitlines() if line.startswith(f"{name}: ")]
    return value


def _member(path: Path, name: str) -> str:
    with tarfile.open(path) as archive:
        member = archive.extractfile(name)
        assert member is not None, f"{name} is not a file in {path.name}"
        return member.read().decode()


def _oci_config(archive: tarfile.TarFile) -> tuple[dict[str, Any], dict[str, str]]:
    """The image's configuration and its manifest's annotations, from an OCI layout."""

    def blob(digest: str) -> Any:
        member = archive.extractfile(f"blobs/{digest.replace(':', '/')}")
        assert member is not None
        return json.load(member)

    index_file = archive.extractfile("index.json")
    assert index_file is not None
    [manifest] = json.load(index_file)["manifests"]
    return blob(blob(manifest["digest"])["config"]["digest"]), manifest.get("annotations", {})


def test_make_dist_publishes_each_part_of_this_version_with_its_checksum(
    podman: Podman, image: str, run_program: RunProgram, tmp_path: Path
) -> None:
    dist = tmp_path / "dist"
    made = run_program(
        ["make", "--no-print-directory", "dist", f"DIST={dist}", f"DIST_IMAGE={image}",
         f"CONTAINER_TOOL={shlex.join(podman.command())}"],
        cwd=ROOT, env=podman.env, timeout=600,
    )  # fmt: skip
    assert made.returncode == 0, made.stdout + made.stderr
    sizes = {path.name: path.stat().st_size for path in sorted(dist.iterdir())}
    print("\n".join(f"{size:>12,}  {name}" for name, size in sizes.items()))
    assert set(sizes) == {WHEEL, SDIST, CHART_ARCHIVE, IMAGE_ARCHIVE, "SHA256SUMS"}

    lines = (dist / "SHA256SUMS").read_text().splitlines()
    sums = {name: digest for digest, name in (line.split("  ", 1) for line in lines)}
    assert sums == {
        name: hashlib.sha256((dist / name).read_bytes()).hexdigest()
        for name in sizes
        if name != "SHA256SUMS"
    }

    revision = from_checkout(ROOT)
    assert revision
    baked = f"REVISION = {revision!r}"
    with zipfile.ZipFile(dist / WHEEL) as wheel:
        info = f"pg_advisory_exporter-{__version__}.dist-info"
        assert _field(wheel.read(f"{info}/METADATA").decode(), "Version") == __version__
        assert baked in wheel.read("pg_advisory_exporter/_build.py").decode()
    top = f"pg_advisory_exporter-{__version__}"
    assert _field(_member(dist / SDIST, f"{top}/PKG-INFO"), "Version") == __version__
    assert baked in _member(dist / SDIST, f"{top}/exporter/_build.py")  # for a wheel of it

    with tarfile.open(dist / CHART_ARCHIVE) as chart:
        names = set(chart.getnames())
    chart_yaml = load_yaml(_member(dist / CHART_ARCHIVE, "pg-advisory-exporter/Chart.yaml"))
    assert (chart_yaml["version"], chart_yaml["appVersion"]) == (__version__, __version__)
    # The chart folder's tracked files and nothing else (.helmignore keeps the rest out).
    tracked = run_program(["git", "ls-files", "."], cwd=CHART, check=True).stdout.split()
    assert names == {f"pg-advisory-exporter/{name}" for name in tracked}
    packaged = Chart.load_archive((dist / CHART_ARCHIVE).read_bytes())
    assert packaged.render({}, name="dist", namespace="dist")

    with tarfile.open(dist / IMAGE_ARCHIVE) as archive:
        config, annotations = _oci_config(archive)
    labels = config["config"]["Labels"]
    assert labels["org.opencontainers.image.version"] == __version__
    assert labels["org.opencontainers.image.revision"] == revision
    assert annotations["org.opencontainers.image.ref.name"].endswith(__version__)
