"""How tests are classified (tests/conftest.py) and what each run of `make test` selects by
it: a test that uses a server runs on every version unless marked `any_version`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from _pytest.mark.expression import Expression
from conftest import tiers

MAKEFILE = Path(__file__).parent.parent / "Makefile"
VERSIONS = ("15", "14", "16", "17", "18")


def _runs() -> dict[str, str]:
    """The marker expression of each run, from the Makefile's variables."""
    found = dict(re.findall(r"^(WITHOUT_SERVER|FIRST_VERSION|OTHER_VERSIONS) := (.+)$",
                            MAKEFILE.read_text(), re.MULTILINE))  # fmt: skip
    assert set(found) == {"WITHOUT_SERVER", "FIRST_VERSION", "OTHER_VERSIONS"}
    return found


def _runs_taking(fixtures: set[str], marks: set[str]) -> list[str]:
    """The runs of `make test` that take a test with these fixtures and markers."""
    found = tiers(fixtures, marks)

    def carries(mark: str, /, **_: str | int | bool | None) -> bool:
        return mark in found

    runs = _runs()
    selected = [
        ("without a server", runs["WITHOUT_SERVER"]),
        *((version, runs["OTHER_VERSIONS"]) for version in VERSIONS[1:]),
        (VERSIONS[0], runs["FIRST_VERSION"]),
    ]
    return sorted(
        name for name, expression in selected if Expression.compile(expression).evaluate(carries)
    )


@pytest.mark.parametrize(
    ("fixtures", "marks", "expected"),
    [
        # The safe default: a server through any fixture, and no marker, is every version.
        ({"pg", "session"}, set(), {"pg", "integration"}),
        ({"exporter", "monitor_dsn", "pg", "start_exporter"}, set(), {"pg", "integration"}),
        ({"own_server"}, set(), {"pg", "integration"}),
        ({"fleet"}, {"slow"}, {"pg", "integration", "slow"}),
        ({"tmp_path"}, {"pg"}, {"pg", "integration"}),  # starts a server without a fixture
        ({"pg"}, {"any_version"}, {"pg", "integration", "any_version"}),
        ({"start_exporter", "tmp_path"}, set(), {"integration"}),
        ({"cli"}, set(), {"integration"}),
        ({"run_program", "tmp_path"}, set(), {"integration"}),  # any other program
        ({"tmp_path"}, set(), {"unit"}),
        (set(), set(), {"unit"}),
    ],
)
def test_markers_come_from_fixtures_and_the_markers_given(
    fixtures: set[str], marks: set[str], expected: set[str]
) -> None:
    assert tiers(fixtures, marks) == expected


@pytest.mark.parametrize(
    ("fixtures", "marks", "expected"),
    [
        ({"pg"}, set(), sorted(VERSIONS)),
        ({"exporter", "pg", "start_exporter"}, {"slow"}, sorted(VERSIONS)),
        ({"tmp_path"}, {"pg"}, sorted(VERSIONS)),
        ({"pg"}, {"any_version"}, [VERSIONS[0]]),
        ({"tmp_path"}, {"pg", "any_version"}, [VERSIONS[0]]),
        ({"start_exporter"}, set(), ["without a server"]),
        ({"tmp_path"}, set(), ["without a server"]),
        ({"tmp_path"}, {"any_version"}, ["without a server"]),  # needs no server: still run
    ],
)
def test_each_test_runs_where_its_outcome_can_differ_and_at_least_once(
    fixtures: set[str], marks: set[str], expected: list[str]
) -> None:
    assert _runs_taking(fixtures, marks) == expected


def test_the_versions_are_the_makefiles() -> None:
    match = re.search(r"^PG_VERSIONS \?= (.+)$", MAKEFILE.read_text(), re.MULTILINE)
    assert match is not None
    assert tuple(match.group(1).split()) == VERSIONS
