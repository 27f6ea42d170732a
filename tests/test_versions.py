"""One version, `pg_advisory_exporter.__version__`, everywhere it is shown: Chart.yaml and the
Dockerfile's label (written from it by `make generate`), the CHANGELOG's newest release,
`--version` with the source revision, and build_info. The built wheel, sdist, chart and
image are checked in tests/test_dist.py and tests/test_image.py."""

from __future__ import annotations

import re
from datetime import date
from pathlib import Path
from typing import NamedTuple

import pytest
from support import REFUSED_DSN, Cli, StartExporter, load_yaml

from devtools import dist
from pg_advisory_exporter import __version__
from pg_advisory_exporter.revision import SHORT, from_checkout

ROOT = Path(__file__).parent.parent
CHANGELOG = ROOT / "CHANGELOG.md"
_SECTION = re.compile(r"^## (.+)$", re.MULTILINE)
_RELEASE = re.compile(r"(\d+)\.(\d+)\.(\d+) - (\d{4}-\d{2}-\d{2})")
_CONTRACT = re.compile(r"Metric contract: version (\d+)\b")


class Release(NamedTuple):
    version: tuple[int, int, int]
    day: date
    contract: int


def releases(text: str) -> list[Release]:
    """The CHANGELOG's releases, newest first; fails the test on a section out of form."""
    parts = _SECTION.split(text)[1:]
    titles, bodies = parts[::2], parts[1::2]
    assert titles[0] == "Unreleased", "the first section collects what is not released yet"
    found = []
    for title, body in zip(titles[1:], bodies[1:], strict=True):
        release = _RELEASE.fullmatch(title)
        assert release, f"## {title}: a release is `## X.Y.Z - YYYY-MM-DD`"
        contract = _CONTRACT.match(body.strip())
        assert contract, f"## {title}: its first line names the metric contract's version"
        *numbers, day = release.groups()
        found.append(Release(tuple(map(int, numbers)), date.fromisoformat(day), int(contract[1])))  # type: ignore[arg-type]
    return found


def newest_release() -> str:
    return ".".join(map(str, releases(CHANGELOG.read_text())[0].version))


def test_the_changelog_is_in_dated_releases_the_newest_this_version() -> None:
    found = releases(CHANGELOG.read_text())
    assert newest_release() == __version__
    # Newest first: versions down, dates and the contract's version never up.
    assert [r.version for r in found] == sorted({r.version for r in found}, reverse=True)
    assert [r.day for r in found] == sorted((r.day for r in found), reverse=True)
    assert [r.contract for r in found] == sorted((r.contract for r in found), reverse=True)
    assert found[-1].contract == 1
    # The check can fail: an undated release, a missing contract line.
    for broken in ("## Unreleased\n\n## 1.0.0\n", "## Unreleased\n\n## 1.0.0 - 2026-01-01\nx\n"):
        with pytest.raises(AssertionError):
            releases(broken)


def test_chart_yaml_and_the_dockerfile_are_written_from_the_version() -> None:
    chart_yaml = (dist.CHART / "Chart.yaml").read_text()
    dockerfile = dist.DOCKERFILE.read_text()
    # Fresh: `make generate` would change nothing.
    assert dist.chart_yaml(chart_yaml) == chart_yaml
    assert dist.dockerfile(dockerfile) == dockerfile
    chart = load_yaml(chart_yaml)
    assert (chart["version"], chart["appVersion"]) == (__version__, __version__)
    label = re.findall(r'org\.opencontainers\.image\.version="([^"]*)"', dockerfile)
    assert label == [__version__]
    # Another version is written where each of them is.
    written = load_yaml(dist.chart_yaml(chart_yaml, "9.8.7"))
    assert (written["version"], written["appVersion"]) == ("9.8.7", "9.8.7")
    assert 'org.opencontainers.image.version="9.8.7"' in dist.dockerfile(dockerfile, "9.8.7")


def test_version_names_the_checkouts_revision(cli: Cli) -> None:
    revision = from_checkout(ROOT)
    assert revision, "the tests run from a git checkout"
    commit, dirty, _ = revision.partition("-dirty")
    assert re.fullmatch(r"[0-9a-f]{40}", commit)
    result = cli("--version", check=True)
    assert result.stdout == (
        f"pg-advisory-exporter {__version__} (revision {commit[:SHORT]}{dirty})\n"
    )


def test_build_info_reports_the_released_version(start_exporter: StartExporter) -> None:
    exporter = start_exporter("--dsn", REFUSED_DSN)
    [(labels, value)] = exporter.scrape().find("pg_advisory_exporter_build_info")
    assert (labels["version"], value) == (newest_release(), 1)
    # The revision is in --version and the image's label, not in the metric contract.
    assert set(labels) == {"version", "python_version"}
