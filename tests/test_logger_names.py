"""Log lines keep the logger names they were published under (`logger=...` in each line),
wherever the code that logs has moved: users' log queries and filters name them."""

from __future__ import annotations

import re
from pathlib import Path

from pg_advisory_exporter.logs import PUBLISHED

PACKAGE = Path(__file__).parent.parent / "exporter"


def _sources() -> dict[str, str]:
    return {str(p.relative_to(PACKAGE)): p.read_text() for p in sorted(PACKAGE.rglob("*.py"))}


def test_every_logger_of_the_package_has_a_published_name_and_each_is_used() -> None:
    named = {
        name: path
        for path, text in _sources().items()
        for name in re.findall(r'logs\.named\("([a-z_]+)"\)', text)
    }
    assert set(named) == PUBLISHED
    # A logger named after its module would change its name whenever the module moves.
    by_module = [path for path, text in _sources().items() if "getLogger(__name__)" in text]
    assert by_module == []
