"""The release's version in the files that cannot read it, and the parts of `make dist` that
need Python.

The version has one home, `pg_advisory_exporter.__version__` (exporter/__init__.py): the
package's metadata reads it (pyproject.toml), and so do `--version` and build_info. The
chart's Chart.yaml and the Dockerfile's label cannot read it, so `make generate` writes it
into them (`python -m devtools.dist generate`) and the tests fail when either differs. The
chart's own version is the exporter's: both are released together, from one tag.

`python -m devtools.dist version|revision|chart CHART DEST`: the version and the checkout's
revision for the Makefile, and the chart packaged into DEST by the real Helm engine
(`helm package`: .helmignore honoured), then loaded back from the archive and rendered.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from helm_python.chart import Chart, package

from pg_advisory_exporter import __version__
from pg_advisory_exporter.revision import from_checkout

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "deploy" / "helm" / "pg-advisory-exporter"
DOCKERFILE = ROOT / "Dockerfile"

# Each line that carries the version, with the version in its second group.
_CHART_LINES = re.compile(r'^((?:version|appVersion): "?)([^"\n]*)("?)$', re.MULTILINE)
_LABEL = re.compile(r'^(\s*org\.opencontainers\.image\.version=")([^"]*)(")', re.MULTILINE)


def _set(pattern: re.Pattern[str], text: str, version: str, expected: int) -> str:
    written, count = pattern.subn(rf"\g<1>{version}\g<3>", text)
    if count != expected:
        raise ValueError(f"{expected} version lines expected, {count} found")
    return written


def chart_yaml(text: str, version: str = __version__) -> str:
    """Chart.yaml with `version` and `appVersion` set to `version`."""
    return _set(_CHART_LINES, text, version, 2)


def dockerfile(text: str, version: str = __version__) -> str:
    """The Dockerfile with its `org.opencontainers.image.version` label set to `version`."""
    return _set(_LABEL, text, version, 1)


def generate(chart: Path = CHART, docker: Path = DOCKERFILE) -> None:
    (chart / "Chart.yaml").write_text(chart_yaml((chart / "Chart.yaml").read_text()))
    docker.write_text(dockerfile(docker.read_text()))


def package_chart(chart: Path, destination: Path) -> Path:
    """The chart as `helm package` makes it, checked to load and render from the archive."""
    archive = Path(package(chart, destination=destination))
    packaged = Chart.load_archive(archive.read_bytes())
    if packaged.version != __version__ or not packaged.render({}, name="dist", namespace="dist"):
        raise ValueError(f"{archive}: version {packaged.version}, or nothing rendered")
    return archive


def main(argv: list[str]) -> int:
    match argv:
        case ["generate"]:
            generate()
        case ["version"]:
            print(__version__)
        case ["revision"]:
            print(from_checkout(ROOT) or "")
        case ["chart", chart, destination]:
            print(package_chart(Path(chart), Path(destination)))
        case _:
            print(__doc__, file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
