"""The layers are a contract: import-linter (run by `make lint`) keeps them, and an import
that runs upwards or across independent siblings breaks it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from support import LintImports

ROOT = Path(__file__).parent.parent


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """The package's source under its import name, in a folder of its own."""
    shutil.copytree(
        ROOT / "exporter",
        tmp_path / "pg_advisory_exporter",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    return tmp_path


@pytest.mark.parametrize(
    ("module", "planted", "broken"),
    [
        # The collection reaching up into the HTTP surface.
        ("collect/snapshot.py", "from pg_advisory_exporter.http import app", "Package layers"),
        # keys and fleet are independent siblings.
        ("keys/catalog.py", "from pg_advisory_exporter.fleet import sharding", "Package layers"),
        # The words under the pooler reads, as they once were the other way round.
        ("collect/vocabulary.py", "from . import poolers", "Collection layers"),
        # The server log's records under the prefix; the server log under the configuration.
        ("serverlog/prefix.py", "from . import records", "Server log layers"),
        ("serverlog/records.py", "from pg_advisory_exporter.config import model", "Package layers"),
        # The package importing the development tools.
        ("report.py", "import devtools.demo", "No development tools"),
    ],
)
def test_a_planted_import_breaks_its_contract(
    copy: Path, lint_imports: LintImports, module: str, planted: str, broken: str
) -> None:
    kept = lint_imports(copy)
    assert kept.returncode == 0, kept.stdout + kept.stderr
    assert "0 broken" in kept.stdout
    path = copy / "pg_advisory_exporter" / module
    path.write_text(path.read_text() + f"\n{planted}  # noqa\n")
    result = lint_imports(copy)
    assert result.returncode == 1, result.stdout
    assert f"{broken} BROKEN" in result.stdout, result.stdout
