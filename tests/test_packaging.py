"""What installs, and what a daemon start loads: the project's own import name, no dev code."""

from __future__ import annotations

import ast
import re
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import REFUSED_DSN, LintImports, RunProgram, StartExporter

from pg_advisory_exporter import __version__
from pg_advisory_exporter.revision import SHORT, from_checkout

ROOT = Path(__file__).parent.parent
# The development package (the demo, the throwaway server) and each of its modules, by the
# name an import would give it: none may reach what users install.
DEVELOPMENT = frozenset(
    {"devtools", *(path.stem for path in (ROOT / "devtools").glob("*.py"))} - {"__init__"}
)
# The build context of the image: the package's metadata, build hook and source, nothing else.
IMAGE_SOURCES = frozenset({"pyproject.toml", "setup.py", "README.md", "LICENSE", "exporter/"})


@pytest.fixture(scope="module")
def wheel(
    tmp_path_factory: pytest.TempPathFactory, run_program: RunProgram
) -> Iterator[zipfile.ZipFile]:
    """The wheel pip builds (a subprocess: the tests that read it are integration tests)."""
    directory = tmp_path_factory.mktemp("wheel")
    run_program(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--wheel-dir", directory, ROOT],
        check=True,
    )  # fmt: skip
    [path] = directory.glob("*.whl")
    with zipfile.ZipFile(path) as archive:
        yield archive


def _development_imports(source: str) -> set[str]:
    """The modules of DEVELOPMENT that this source imports, absolutely or relatively."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        found |= {name for name in names if DEVELOPMENT & set(name.split("."))}
    return found


def test_the_wheel_installs_only_the_projects_own_package(wheel: zipfile.ZipFile) -> None:
    name = Path(str(wheel.filename)).name
    top_level = {member.split("/")[0] for member in wheel.namelist()}
    assert top_level == {"pg_advisory_exporter", f"{name.split('-py3')[0]}.dist-info"}
    assert "pg_advisory_exporter/py.typed" in wheel.namelist()


def test_the_wheel_carries_no_development_code(wheel: zipfile.ZipFile) -> None:
    modules = [member for member in wheel.namelist() if member.endswith(".py")]
    assert "pg_advisory_exporter/cli.py" in modules
    assert not [m for m in modules if Path(m).stem in DEVELOPMENT]
    importing = {m: _development_imports(wheel.read(m).decode()) for m in modules}
    assert {m: found for m, found in importing.items() if found} == {}
    # The check sees each way of importing them.
    for source in (
        "import devtools.demo",
        "from devtools.embedded_postgres import free_port",
        "from . import demo",
        "from .embedded_postgres import EmbeddedPostgres",
    ):
        assert _development_imports(source), source
    assert not _development_imports("from . import daemon\nimport psycopg")


# `--version` of the code in FOLDER (argv[1]), failing if another copy was imported.
_VERSION_OF = """
import sys
sys.path.insert(0, sys.argv[1])
import pg_advisory_exporter.cli as cli
assert cli.__file__.startswith(sys.argv[1]), cli.__file__
cli.main(["--version"])
"""


def test_the_wheel_names_its_version_and_the_revision_it_was_built_from(
    wheel: zipfile.ZipFile, tmp_path: Path, run_program: RunProgram
) -> None:
    info = f"pg_advisory_exporter-{__version__}.dist-info"
    metadata = wheel.read(f"{info}/METADATA").decode()
    assert re.search(r"^Version: (.+)$", metadata, re.MULTILINE)[1] == __version__  # type: ignore[index]
    revision = from_checkout(ROOT)
    assert revision
    assert f"REVISION = {revision!r}" in wheel.read("pg_advisory_exporter/_build.py").decode()
    # Installed, outside any checkout: the baked revision, and without it the version alone.
    wheel.extractall(tmp_path)
    commit, dirty, _ = revision.partition("-dirty")
    for expected in (f"{__version__} (revision {commit[:SHORT]}{dirty})", __version__):
        shown = run_program([sys.executable, "-c", _VERSION_OF, tmp_path], cwd=tmp_path)
        assert (shown.returncode, shown.stdout) == (0, f"pg-advisory-exporter {expected}\n")
        (tmp_path / "pg_advisory_exporter" / "_build.py").unlink(missing_ok=True)


def test_the_installed_wheel_keeps_the_layers(
    wheel: zipfile.ZipFile, tmp_path: Path, lint_imports: LintImports
) -> None:
    # The wheel holds the build's _build module, which the source tree has not: the
    # exhaustive contracts must place it there too.
    wheel.extractall(tmp_path)
    assert (tmp_path / "pg_advisory_exporter" / "_build.py").is_file()
    result = lint_imports(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Package layers KEPT" in result.stdout


def test_the_image_is_built_from_the_package_alone() -> None:
    # Each COPY from the build context names only the package's files (COPY --from copies
    # between stages), and .dockerignore keeps everything else out of the context.
    dockerfile = (ROOT / "Dockerfile").read_text()
    copied = {
        source
        for line in re.findall(r"^COPY (?!--from)(.+)$", dockerfile, re.MULTILINE)
        for source in line.split()[:-1]
    }
    assert copied == IMAGE_SOURCES
    ignore = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert ignore[0] == "*"
    assert {line[1:] for line in ignore if line.startswith("!")} == IMAGE_SOURCES


def test_a_daemon_start_loads_no_development_code(
    start_exporter: StartExporter,
) -> None:
    # Python reports every module it imports; the daemon serves before the check runs.
    exporter = start_exporter("--dsn", REFUSED_DSN, env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert exporter.get("/")[0] == 200
    imported = {
        line.rsplit("|", 1)[-1].strip()
        for line in exporter.log().splitlines()
        if line.startswith("import time:")
    }
    assert "pg_advisory_exporter.daemon" in imported
    assert not {"exporter", "devtools"} & imported
    assert "logger=pg_advisory_exporter." in exporter.log()
