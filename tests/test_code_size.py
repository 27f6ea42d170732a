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


def _function(name: str, lines: int, indent: str = "", kind: str = "def") -> str:
    """A function of exactly `lines` lines: one decorator, its def, and its body."""
    body = "".join(f"{indent}    x = {i}\n" for i in range(lines - 2))
    return f"{indent}@staticmethod\n{indent}{kind} {name}():\n{body}"


def test_each_function_over_its_limit_is_named_where_it_is(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    over = FUNCTION_LINES + 1
    # outer holds inner (within the limit) and deeper (over it), each named by where it is;
    # outer's own length counts both.
    nested = "def outer():\n" + _function("inner", FUNCTION_LINES, "    ")
    (package / "m.py").write_text(
        _function("fits", FUNCTION_LINES)
        + "class Holder:\n"
        + _function("long", over, "    ")
        + _function("waits", over, kind="async def")
        + _function("allowed", 70)
        + nested
        + "    def deeper():\n"
        + "".join(f"        y = {i}\n" for i in range(over - 1))
    )
    limit = f"(limit {FUNCTION_LINES})"
    found = offenders(package, {"m.py:allowed": (70, "one table, read top to bottom")})
    outer_lines = 1 + FUNCTION_LINES + over
    assert found == [
        f"m.py:Holder.long: {over} lines {limit}",
        f"m.py:waits: {over} lines {limit}",
        f"m.py:outer: {outer_lines} lines {limit}",
        f"m.py:outer.deeper: {over} lines {limit}",
    ]
    assert f"m.py:allowed: 70 lines {limit}" in offenders(package, {})
