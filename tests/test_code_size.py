"""`make lint`'s measure of a module's length (devtools/code_size.py): it counts every line,
and it names each module over its limit, a longer one allowed only with its reason."""

from __future__ import annotations

from pathlib import Path

from devtools.code_size import MODULE_LINES, offenders


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
