"""The layers are a contract: import-linter (run by `make lint`) keeps them, and an import
that runs upwards or across independent siblings breaks it."""

from __future__ import annotations

import re
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


# Imports that run upwards or across independent siblings, each in a module of the copy,
# and the contract that each breaks, with the import as import-linter reports it.
PLANTED = [
    # The collection reaching up into the HTTP surface.
    ("collect/snapshot.py", "from pg_advisory_exporter.http import app", "Package layers",
     "collect.snapshot -> pg_advisory_exporter.http.app"),
    # keys and fleet are independent siblings.
    ("keys/catalog.py", "from pg_advisory_exporter.fleet import sharding", "Package layers",
     "keys.catalog -> pg_advisory_exporter.fleet.sharding"),
    # The words under the pooler reads, as they once were the other way round.
    ("collect/vocabulary.py", "from . import poolers", "Collection layers",
     "collect.vocabulary -> pg_advisory_exporter.collect.poolers"),
    # The server log's records under the prefix; the server log under the configuration.
    ("serverlog/prefix.py", "from . import records", "Server log layers",
     "serverlog.prefix -> pg_advisory_exporter.serverlog.records"),
    ("serverlog/records.py", "from pg_advisory_exporter.config import model", "Package layers",
     "serverlog.records -> pg_advisory_exporter.config.model"),
    # The socket systemd passes reaching up into the app; a scrape's collectors across into
    # the discovered targets, an independent sibling.
    ("http/socket_activation.py", "from . import app", "HTTP layers",
     "http.socket_activation -> pg_advisory_exporter.http.app"),
    ("http/collector.py", "from . import discovered", "HTTP layers",
     "http.collector -> pg_advisory_exporter.http.discovered"),
    # application_name rewriting reaching up into the key registry; one alert group into
    # another.
    ("keys/appnames.py", "from . import registry", "Key layers",
     "keys.appnames -> pg_advisory_exporter.keys.registry"),
    ("alerting/lock_table.py", "from . import server_log", "Alerting layers",
     "alerting.lock_table -> pg_advisory_exporter.alerting.server_log"),
    # The package importing the development tools.
    ("report.py", "import devtools.demo", "No development tools", "report -> devtools"),
]  # fmt: skip


def test_each_planted_import_breaks_its_contract(copy: Path, lint_imports: LintImports) -> None:
    """One run over a copy with every import above planted: each is reported, under its
    contract. (`make lint` runs the contracts on the tree itself, where all are kept.)"""
    for module, planted, _, _ in PLANTED:
        path = copy / "pg_advisory_exporter" / module
        path.write_text(path.read_text() + f"\n{planted}  # noqa\n")
    result = lint_imports(copy)
    assert result.returncode == 1, result.stdout + result.stderr
    sections = _broken_contracts(result.stdout)
    for _, _, contract, reported in PLANTED:
        assert f"pg_advisory_exporter.{reported}" in sections.get(contract, ""), result.stdout


def _broken_contracts(report: str) -> dict[str, str]:
    """import-linter's report of each broken contract, by the contract's name (each under its
    name, underlined)."""
    broken = report.split("Broken contracts\n", 1)[1]
    parts = re.split(r"^(.+)\n-+\n", broken, flags=re.MULTILINE)[1:]
    return dict(zip(parts[::2], parts[1::2], strict=True))
