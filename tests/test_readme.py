"""The README is a front page and `docs/` holds the depth: the configuration examples are valid
configurations, every link leads to a file (and heading) of this repository, and no text
refers to a document that is not in it."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from support import PG_MAJOR, load_yaml

from devtools.embedded_postgres import SID_MAJORS, EmbeddedPostgres
from pg_advisory_exporter.config.model import FileConfig
from pg_advisory_exporter.keys.registry import check_configs

ROOT = Path(__file__).parent.parent
README = ROOT / "README.md"
DOCUMENTS = [README, ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
# A newcomer reads the front page in one sitting; what goes deeper belongs in docs/.
README_MAX_LINES = 300
# Where the project's text is: documents, code, tests, the chart, the mixin, rules and build
# files.
TEXT_ROOTS = [
    "exporter", "tests", "devtools", "benchmarks", "grafana", "deploy", "alerts",
    "pg-advisory-exporter-mixin", ".ci",
]  # fmt: skip
TEXT_FILES = ["Makefile", "Dockerfile", "pyproject.toml"]
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".json", ".tpl", ".libsonnet", ".txt", ""}
# Documents the project was written from, which are not in the repository.
OUTSIDE = re.compile(
    r"\.\./shared|/work[/]shared|postgres[-]facts|seed\sarticle|\bthe\sseed\b", re.I
)


def _prose(path: Path) -> str:
    """The document without its fenced code blocks, where `#` and `](` mean something else."""
    return re.sub(r"^```.*?^```", "", path.read_text(), flags=re.DOTALL | re.MULTILINE)


def _anchors(path: Path) -> set[str]:
    """GitHub's anchors for the headings of a document: lower case, punctuation dropped,
    spaces made hyphens, and a number after a repeated one."""
    anchors: set[str] = set()
    for heading in re.findall(r"^#+ (.+)$", _prose(path), flags=re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        n = 0
        while (anchor := slug if n == 0 else f"{slug}-{n}") in anchors:
            n += 1
        anchors.add(anchor)
    return anchors


def _yaml_blocks() -> list[str]:
    return [
        block
        for path in DOCUMENTS
        for block in re.findall(r"```yaml\n(.*?)```", path.read_text(), flags=re.DOTALL)
    ]


def test_the_file_example_is_valid(tmp_path: Path) -> None:
    configs = [load_yaml(block) for block in _yaml_blocks()]
    files = [c for c in configs if "targets" in c]
    assert len(files) >= 2, "the README and docs/configuration.md each have a file example"
    secret = tmp_path / "secret"
    secret.write_text("pw")
    for data in files:
        # The example's secret files exist only in production.
        for owner in [
            *data["targets"],
            *(p for t in data["targets"] for p in t.get("poolers", ())),
            *data.get("auth_modules", {}).values(),
        ]:
            if "password_file" in owner:
                owner["password_file"] = str(secret)
        FileConfig.model_validate(data)


def test_the_registry_example_is_valid() -> None:
    registries = [c["keys"] for c in map(yaml.safe_load, _yaml_blocks()) if c.get("keys")]
    assert registries, "no document has a key registry example"
    for keys in registries:
        config = FileConfig.model_validate(
            {"keys": keys, "targets": [{"name": "a", "dsn": "host=db"}]}
        )
        check_configs(config.keys)


def test_the_readme_is_a_front_page() -> None:
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines: move depth into docs/"


def test_the_readme_names_the_server_the_tests_run(pg: EmbeddedPostgres) -> None:
    """Its major version among those supported; for one from Debian sid, which installs
    whatever Debian has newest (a release candidate, then the release), its exact version."""
    with pg.connect() as conn:
        row = conn.execute("SHOW server_version").fetchone()
    assert row is not None
    section = README.read_text().split("\n## Supported PostgreSQL versions\n", 1)[1]
    section = section.split("\n## ", 1)[0]
    assert re.search(rf"\b{PG_MAJOR}\b", section.split(";", 1)[0]), section
    if PG_MAJOR in SID_MAJORS:
        assert f"`{row[0]}`" in section, f"the README does not name the tested {row[0]}"


def test_the_readme_links_every_document() -> None:
    linked = set(re.findall(r"\]\((?:docs/)?([^)#]+\.md)", README.read_text()))
    assert {path.name for path in DOCUMENTS if path != README} <= linked


def test_every_link_leads_into_the_repository() -> None:
    links = [
        (document, link)
        for document in DOCUMENTS
        for link in re.findall(r"\]\(([^)\s]+)\)", _prose(document))
        if not re.match(r"[a-z]+:", link)  # a web address
    ]
    assert len(links) > len(DOCUMENTS)
    for document, link in links:
        where = f"{document.relative_to(ROOT)}: {link}"
        path, _, anchor = link.partition("#")
        target = (document.parent / path).resolve() if path else document
        assert target.is_relative_to(ROOT.resolve()), f"{where} leaves the repository"
        assert target.is_file(), f"{where} is no file"
        if anchor:
            assert anchor in _anchors(target), f"{where} names no heading"


def test_no_text_refers_to_a_document_outside_the_repository() -> None:
    files = [*DOCUMENTS, *(ROOT / name for name in TEXT_FILES)]
    for folder in TEXT_ROOTS:
        files += [
            p
            for p in (ROOT / folder).rglob("*")
            if p.is_file() and p.suffix in TEXT_SUFFIXES and "__pycache__" not in p.parts
        ]
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in files
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert not found, "\n".join(found)
