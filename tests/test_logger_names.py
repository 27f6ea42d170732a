"""Each log line says where it comes from: every logger of the package is named after its
module (`logger=pg_advisory_exporter.collect.server`), so that a line leads to its code."""

from __future__ import annotations

import re
from pathlib import Path

PACKAGE = Path(__file__).parent.parent / "exporter"


def _sources() -> dict[str, str]:
    return {str(p.relative_to(PACKAGE)): p.read_text() for p in sorted(PACKAGE.rglob("*.py"))}


def test_every_logger_of_the_package_is_named_after_its_module() -> None:
    sources = _sources()
    del sources["logs.py"]  # sets up the root logger's handler, and quiets psycopg's
    loggers = {path: re.findall(r"getLogger\(([^)]*)\)", text) for path, text in sources.items()}
    named = {path: found for path, found in loggers.items() if found}
    assert named, "no module logs"
    assert {path: found for path, found in named.items() if found != ["__name__"]} == {}
