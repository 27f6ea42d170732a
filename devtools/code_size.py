"""`make lint`'s measure of a module's length, which ruff does not take (ruff's complexity and
size rules take a function's: pyproject.toml): no module of the package over MODULE_LINES,
so that each stays readable in one sitting and a change to it reviewable; a module that must
be longer says why in LONGER."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

PACKAGE = Path(__file__).parent.parent / "exporter"
MODULE_LINES = 450
# Modules allowed longer, each with the reason (and the length it may reach).
LONGER: Mapping[str, tuple[int, str]] = {}


def offenders(package: Path, longer: Mapping[str, tuple[int, str]] = LONGER) -> list[str]:
    """Each module of `package` over its limit, as `path: N lines (limit L)`."""
    found = []
    for path in sorted(package.rglob("*.py")):
        name = str(path.relative_to(package))
        limit = longer.get(name, (MODULE_LINES, ""))[0]
        if (lines := len(path.read_text().splitlines())) > limit:
            found.append(f"{name}: {lines} lines (limit {limit})")
    return found


def main() -> int:
    found = offenders(PACKAGE)
    for line in found:
        print(f"exporter/{line}: split it where its concerns part", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
