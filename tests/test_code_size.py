"""`make lint`'s measure of length (devtools/code_size.py): it counts every line of a module
and of a function (decorators included, nested ones named by where they are), and it names
each over its limit, a longer one allowed only with its reason."""

from __future__ import annotations

from pathlib import Path

from devtools.code_size import FUNCTION_LINES, MODULE_LINES, offenders


def test_each_module_over_its_limit_is_named(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "inner").mkdir(parents=True)
    (package / "fits.py").write_text("x = 1\n" * MODULE_LINES)
    (package / "inner" / "over.py").write_text("x = 1\n" * (MODULE_LINES + 1))
    (package / "allowed.py").write_text("\n" * 600)
    assert offenders(package, {"allowed.py": (600, "a table of entries")}) == [
        f"inner/over.py: {MODULE_LINES + 1} lines (limit {MODULE_LINES})"
    ]
    assert offenders(package, {"allowed.py": (599, "a table of entries")}) == [
        "allowed.py: 600 lines (limit 599)",
        f"inner/over.py: {MODULE_LINES + 1} lines (limit {MODULE_LINES})",
    ]


def _function(name: str, lines: int, indent: str = "") -> str:
    """A function of exactly `lines` lines: its def, one decorator, and its body."""
    body = "".join(f"{indent}    x = {i}\n" for i in range(lines - 2))
    return f"{indent}@staticmethod\n{indent}def {name}():\n{body}"


def test_each_function_over_its_limit_is_named_where_it_is(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "m.py").write_text(
        _function("fits", FUNCTION_LINES)
        + "class Holder:\n"
        + _function("long", FUNCTION_LINES + 1, "    ")
        + _function("allowed", 70)
    )
    assert offenders(package, {"m.py:allowed": (70, "one table, read top to bottom")}) == [
        f"m.py:Holder.long: {FUNCTION_LINES + 1} lines (limit {FUNCTION_LINES})"
    ]
    assert offenders(package, {}) == [
        "m.py:Holder.long: 61 lines (limit 60)",
        "m.py:allowed: 70 lines (limit 60)",
    ]
