"""A guard on size: no module of the package over 600 lines, no function over 80, so that
each stays readable in one sitting and a change to it stays reviewable."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).parent.parent / "exporter"
MODULE_LINES = 600
FUNCTION_LINES = 80  # from `def` to its last line (end_lineno - lineno + 1), decorators aside


def _functions(node: ast.AST, prefix: str = "") -> Iterator[tuple[str, int]]:
    """Every function and method below `node`, nested ones included, by qualified name, with
    its length in lines."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
            assert child.end_lineno is not None
            yield f"{prefix}{child.name}", child.end_lineno - child.lineno + 1
            yield from _functions(child, f"{prefix}{child.name}.")
        elif isinstance(child, ast.ClassDef):
            yield from _functions(child, f"{prefix}{child.name}.")
        else:
            yield from _functions(child, prefix)


def _offenders(package: Path) -> list[str]:
    found = []
    for path in sorted(package.rglob("*.py")):
        source = path.read_text()
        name = path.relative_to(package.parent)
        if (lines := len(source.splitlines())) > MODULE_LINES:
            found.append(f"{name}: {lines} lines")
        found += [
            f"{name}: {function}, {lines} lines"
            for function, lines in _functions(ast.parse(source))
            if lines > FUNCTION_LINES
        ]
    return found


def _statements(count: int, indent: str) -> str:
    return "".join(f"{indent}x{i} = {i}\n" for i in range(count))


def test_the_measure_counts_modules_and_every_kind_of_function(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    # At the limits exactly: a module of 600 lines, a function of 80.
    fits = "def fits():\n" + _statements(FUNCTION_LINES - 1, "    ")
    (package / "fits.py").write_text(fits + "\n" * (MODULE_LINES - FUNCTION_LINES))
    # One line over each: a method, a function nested in it, an async function, the module.
    over = (
        "class Page:\n"
        "    def render(self):\n"
        "        def inner():\n"
        + _statements(FUNCTION_LINES, "            ")
        + "        return inner\n"
        "async def fetch():\n" + _statements(FUNCTION_LINES, "    ")
    )
    padding = MODULE_LINES + 1 - len(over.splitlines())
    (package / "over.py").write_text(over + "\n" * padding)
    assert _offenders(package) == [
        f"pkg/over.py: {MODULE_LINES + 1} lines",
        f"pkg/over.py: Page.render, {FUNCTION_LINES + 3} lines",
        f"pkg/over.py: Page.render.inner, {FUNCTION_LINES + 1} lines",
        f"pkg/over.py: fetch, {FUNCTION_LINES + 1} lines",
    ]


def test_no_module_or_function_of_the_package_is_too_long() -> None:
    offenders = _offenders(PACKAGE)
    assert not offenders, (
        f"over {MODULE_LINES} lines a module or {FUNCTION_LINES} a function:\n"
        + "\n".join(offenders)
    )
