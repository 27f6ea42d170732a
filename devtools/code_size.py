"""`make lint`'s measure of length, where ruff has none (ruff's complexity rules count a
function's branches and statements, not its lines: pyproject.toml): no module of the package
over MODULE_LINES and no function over FUNCTION_LINES, so that each stays readable in one
sitting and a change to it reviewable. A module or function that must be longer says why in
LONGER (by path, or path:qualified.name for a function), with the length it may reach."""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

PACKAGE = Path(__file__).parent.parent / "exporter"
MODULE_LINES = 450
FUNCTION_LINES = 60
# Modules and functions allowed longer, each with the length it may reach and the reason.
LONGER: Mapping[str, tuple[int, str]] = {}


def _functions(tree: ast.Module) -> Iterator[tuple[str, int]]:
    """Each function's qualified name (Class.method, outer.inner) and its length in lines,
    decorators and docstring included."""

    def walk(node: ast.AST, prefix: str) -> Iterator[tuple[str, int]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = prefix + child.name
                if not isinstance(child, ast.ClassDef):
                    first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                    yield name, (child.end_lineno or child.lineno) - first + 1
                yield from walk(child, name + ".")

    return walk(tree, "")


def offenders(package: Path, longer: Mapping[str, tuple[int, str]] = LONGER) -> list[str]:
    """Each module and function of `package` over its limit, as `where: N lines (limit L)`."""
    found = []
    for path in sorted(package.rglob("*.py")):
        name = str(path.relative_to(package))
        text = path.read_text()
        limit = longer.get(name, (MODULE_LINES, ""))[0]
        if (lines := len(text.splitlines())) > limit:
            found.append(f"{name}: {lines} lines (limit {limit})")
        for function, lines in _functions(ast.parse(text, name)):
            where = f"{name}:{function}"
            limit = longer.get(where, (FUNCTION_LINES, ""))[0]
            if lines > limit:
                found.append(f"{where}: {lines} lines (limit {limit})")
    return found


def main() -> int:
    found = offenders(PACKAGE)
    for line in found:
        print(f"exporter/{line}: split it where its concerns part", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
