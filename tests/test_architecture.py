"""docs/architecture.md against the code: every module it names exists (under `exporter/`,
or in the repository for `tests/`, `devtools/` and the like), every `module.py:name` and
`module.py:Class.method` it names resolves in the package, every module of the package has a
line in its modules table, and its diagrams draw the layers of `[tool.importlinter]`. The
checks are functions of the document's text, so that a wrong name is shown to be reported."""

from __future__ import annotations

import importlib
import re
import shutil
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).parent.parent
DOCUMENT = ROOT / "docs" / "architecture.md"
PACKAGE = ROOT / "exporter"
PACKAGE_NAME = "pg_advisory_exporter"
# What the document may name outside the package, by the first part of its path.
OUTSIDE = frozenset({"tests", "devtools", "benchmarks", "grafana", "setup.py"})

# A module by its path under exporter/, and after a colon the name it defines, if one is
# named: `collect/server.py`, `cli.py:main`, `collect/server.py:Server.begin`.
_NAMED = re.compile(
    r"(?<![\w/.-])((?:[A-Za-z_][\w-]*/)*[A-Za-z_]\w*\.py)"
    r"(?::([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*))?"
)
# How the document says it names a module's function: any module, not one of them.
PLACEHOLDER = "module.py"
_MODULES_TABLE = re.compile(r"^## Modules\n(.*?)(?=^## |\Z)", re.DOTALL | re.MULTILINE)
_DIAGRAM = re.compile(r"^```\n(.*?)^```", re.DOTALL | re.MULTILINE)


def named(text: str) -> list[tuple[str, str | None]]:
    """Each module the text names, with the name it names in it (None: the module alone),
    in order, each once."""
    found = ((m.group(1), m.group(2)) for m in _NAMED.finditer(text))
    return list(dict.fromkeys(item for item in found if item[0] != PLACEHOLDER))


def module_name(path: str) -> str:
    """The import name of the package's module at `path`: `collect/__init__.py` is
    pg_advisory_exporter.collect."""
    parts = path.removesuffix(".py").split("/")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([PACKAGE_NAME, *parts])


def _outside(path: str) -> bool:
    """Whether `path` names a file of the repository outside the package."""
    return path.partition("/")[0] in OUTSIDE


def _is_field(owner: object, name: str) -> bool:
    """Whether `name` is an annotated field of a class (a dataclass's or a model's, which
    need not be a class attribute)."""
    return isinstance(owner, type) and any(
        name in vars(cls).get("__annotations__", {}) for cls in owner.__mro__
    )


def unresolved(path: str, name: str) -> str | None:
    """Why `name` (dotted: Class.method) is not defined in the package's module at `path`;
    None when it is."""
    if _outside(path):
        return "only the package's names are looked up"
    if path.endswith("__main__.py"):
        return "__main__ runs the command when imported: name what it calls"
    try:
        found: object = importlib.import_module(module_name(path))
    except ImportError as exc:
        return f"cannot be imported: {exc}"
    parts = name.split(".")
    for i, part in enumerate(parts):
        if hasattr(found, part):
            found = getattr(found, part)
        elif i == len(parts) - 1 and _is_field(found, part):
            return None
        else:
            return f"{'.'.join(parts[:i]) or path} has no {part}"
    return None


def package_modules(package: Path = PACKAGE) -> list[str]:
    """Every module of the package, by its path under the package's folder."""
    return sorted(
        p.relative_to(package).as_posix()
        for p in package.rglob("*.py")
        if "__pycache__" not in p.parts
    )


def table_modules(text: str) -> set[str] | None:
    """The modules that have a line in the modules table (named in a row's first cell);
    None without a table."""
    section = _MODULES_TABLE.search(text)
    if section is None:
        return None
    rows = [line for line in section.group(1).splitlines() if line.startswith("|")]
    return {path for row in rows for path, _ in named(row.split("|")[1])}


def diagrams(text: str) -> list[list[str]]:
    """The layers each diagram draws, top first: each line's text before its description
    (which two spaces or more set apart)."""
    return [
        [re.split(r"\s{2,}", line.strip(), maxsplit=1)[0] for line in block.splitlines()]
        for block in _DIAGRAM.findall(text)
    ]


def layer_contracts(pyproject: Path = ROOT / "pyproject.toml") -> dict[str, list[str]]:
    """The layers of each layers contract, as a diagram spells them (`a | b`)."""
    contracts = tomllib.loads(pyproject.read_text())["tool"]["importlinter"]["contracts"]
    return {
        contract["name"]: [
            " | ".join(part.strip() for part in layer.split("|")) for layer in contract["layers"]
        ]
        for contract in contracts
        if contract["type"] == "layers"
    }


def problems(
    text: str, package: Path = PACKAGE, contracts: Mapping[str, Sequence[str]] | None = None
) -> list[str]:
    """What the document says that the code does not bear out, one line each."""
    found: list[str] = []
    for path, name in named(text):
        where = ROOT / path if _outside(path) else package / path
        shown = path if name is None else f"{path}:{name}"
        if not where.is_file():
            found.append(f"{shown}: no such module")
        elif name is not None and (why := unresolved(path, name)) is not None:
            found.append(f"{shown}: {why}")
    listed = table_modules(text)
    if listed is None:
        found.append("no modules table (a section '## Modules')")
    else:
        missing = [module for module in package_modules(package) if module not in listed]
        found += [f"{module}: no line in the modules table" for module in missing]
    drawn = diagrams(text)
    for contract, layers in (layer_contracts() if contracts is None else contracts).items():
        if list(layers) not in drawn:
            found.append(f"{contract}: no diagram draws its layers, {' / '.join(layers)}")
    return found


def test_the_document_names_what_the_code_has_and_every_module() -> None:
    text = DOCUMENT.read_text()
    assert problems(text) == []
    # The parsing finds what it checks: the table lists the package, the paths name functions.
    assert table_modules(text) == set(package_modules())
    assert len([name for _, name in named(text) if name is not None]) >= 50
    assert len(diagrams(text)) == len(layer_contracts())


def test_a_wrong_module_or_name_is_reported() -> None:
    text = DOCUMENT.read_text()
    begin = "`collect/server.py:Server.begin`"
    assert begin in text
    broken = text.replace(begin, "`collect/server.py:Server.begins`", 1) + (
        "\n`collect/servers.py`, `cli.py:mian`, `collect/server.py:Collection.answering.x`,"
        " `collect/server.py:Collection.snapshot`, `tests/no_such_test.py`,"
        " `tests/test_readme.py:test_the_readme_is_a_front_page`\n"
    )
    assert problems(broken) == [
        "collect/server.py:Server.begins: Server has no begins",
        "collect/servers.py: no such module",
        "cli.py:mian: cli.py has no mian",
        "collect/server.py:Collection.answering.x: Collection.answering has no x",
        "tests/no_such_test.py: no such module",
        "tests/test_readme.py:test_the_readme_is_a_front_page: only the package's names are "
        "looked up",
    ]


def test_a_module_without_a_line_in_the_table_is_reported(tmp_path: Path) -> None:
    package = tmp_path / "exporter"
    shutil.copytree(PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__"))
    (package / "collect" / "newcomer.py").write_text('"""A module nobody wrote a line for."""\n')
    text = DOCUMENT.read_text()
    assert problems(text, package) == ["collect/newcomer.py: no line in the modules table"]
    row = next(line for line in text.splitlines() if line.startswith("| `collect/holds.py` |"))
    assert problems(text.replace(row + "\n", ""), PACKAGE) == [
        "collect/holds.py: no line in the modules table"
    ]


def test_a_diagram_that_differs_from_its_contract_is_reported() -> None:
    text = DOCUMENT.read_text()
    contracts = layer_contracts()
    collection = contracts["Collection layers"]
    assert problems(text, contracts={"Collection layers": [*collection, "newcomer"]}) == [
        f"Collection layers: no diagram draws its layers, {' / '.join(collection)} / newcomer"
    ]
    line = next(line for line in text.splitlines() if line.startswith("scheduling "))
    assert problems(text.replace(line + "\n", "")) == [
        f"Collection layers: no diagram draws its layers, {' / '.join(collection)}"
    ]
