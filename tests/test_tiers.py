"""How tests are classified (tests/conftest.py) and what each run of `make test` selects by
it: a test that uses a server runs on every version unless marked `any_version`; and that a
unit test which starts a process or reaches outside itself fails."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import conftest
import pytest
from _pytest.mark.expression import Expression
from conftest import tiers

MAKEFILE = Path(__file__).parent.parent / "Makefile"
VERSIONS = ("15", "14", "16", "17", "18", "19")


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


# Unit tests planted in a session of their own: those that start a process or reach what they
# did not make fail, however they do it; those that keep to themselves pass. None of them
# leaves the machine even if the guard let it through: the ports they must not reach are
# loopback's, the name they resolve is under .invalid.
PLANTED = """
import multiprocessing
import os
import socket
import subprocess
import sys
import threading

import psycopg
import pytest


def test_runs_a_subprocess():
    subprocess.run(["true"], check=False)


def test_runs_a_shell_command():
    os.system("true")


def test_forks():
    if os.fork() == 0:
        os._exit(0)


def test_spawns_with_multiprocessing():
    process = multiprocessing.get_context("spawn").Process(target=print)
    process.start()
    process.join()


def test_runs_a_subprocess_in_a_thread():
    thread = threading.Thread(target=subprocess.run, args=(["true"],))
    thread.start()
    thread.join()


@pytest.fixture(scope="module")
def built():
    return subprocess.run(["true"], check=False)


def test_uses_a_module_fixture_that_runs_a_program(built):
    pass


def test_connects_to_a_port_it_did_not_bind():
    with socket.socket() as sock:
        sock.connect_ex(("127.0.0.1", 9))


def test_swallows_the_error_of_a_connection_it_may_not_make():
    try:
        socket.create_connection(("127.0.0.1", 9), timeout=1).close()
    except OSError:
        pass


def test_connects_with_psycopg_to_a_port_it_did_not_bind():
    psycopg.connect("host=127.0.0.1 port=9 connect_timeout=1")


def test_resolves_a_host_name():
    socket.getaddrinfo("db.invalid", 5432)


def test_talks_over_a_socket_pair():
    near, far = socket.socketpair()
    with near, far:
        near.sendall(b"x")
        assert far.recv(1) == b"x"


def test_connects_to_its_own_listener():
    with socket.create_server(("127.0.0.1", 0)) as server:
        with socket.create_connection(server.getsockname(), timeout=5):
            server.accept()[0].close()
    socket.getaddrinfo("localhost", 80)


def test_is_refused_by_a_port_it_holds():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5)
        with pytest.raises(psycopg.OperationalError, match="refused"):
            psycopg.connect(f"host=127.0.0.1 port={port} connect_timeout=5")


def test_takes_the_program_through_a_fixture(run_program):
    assert run_program(["true"]).returncode == 0
"""


def test_a_unit_test_that_starts_a_process_or_reaches_out_fails(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    planted = pytester.makepyfile(test_planted=PLANTED)
    # The suite's hooks and fixtures, and no installed plugin: neither a timer nor an order of
    # their own inside, nor one that whatever an earlier test put on sys.path registers (the
    # CRD models' cloudcoil, after tests/test_chart.py).
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    recorder = pytester.inline_run("-m", "unit", "-p", "no:cacheprovider", plugins=[conftest])
    reports = [r for r in recorder.getreports("pytest_runtest_logreport") if r.when != "teardown"]
    failed = {r.nodeid.split("::")[-1]: r.longreprtext for r in reports if r.failed}
    passed = {r.nodeid.split("::")[-1] for r in reports if r.when == "call" and r.passed}
    assert sorted(failed) == [
        "test_connects_to_a_port_it_did_not_bind",
        "test_connects_with_psycopg_to_a_port_it_did_not_bind",
        "test_forks",
        "test_resolves_a_host_name",
        "test_runs_a_shell_command",
        "test_runs_a_subprocess",
        "test_runs_a_subprocess_in_a_thread",
        "test_spawns_with_multiprocessing",
        "test_swallows_the_error_of_a_connection_it_may_not_make",
        "test_uses_a_module_fixture_that_runs_a_program",
    ]
    assert passed == {
        "test_connects_to_its_own_listener",
        "test_is_refused_by_a_port_it_holds",
        "test_talks_over_a_socket_pair",
    }
    for name, text in failed.items():
        assert f"test_planted.py::{name} is a unit test (`make unit`) but " in text, text
    assert "started a process (subprocess: ['true']) at " in failed["test_runs_a_subprocess"]
    # Where it did it, and what to do instead.
    line = planted.read_text().splitlines().index('    subprocess.run(["true"], check=False)') + 1
    assert f"test_planted.py:{line}. A unit test starts no process: take the program through " \
        "a fixture of PROGRAM_FIXTURES" in failed["test_runs_a_subprocess"]  # fmt: skip
    assert "started a process (os.system: 'true')" in failed["test_runs_a_shell_command"]
    assert "started a process (os.fork" in failed["test_forks"]
    assert (
        "connected to ('127.0.0.1', 9)"
        in failed["test_swallows_the_error_of_a_connection_it_may_not_make"]
    )
    assert (
        "connected with psycopg to ('127.0.0.1', 9)"
        in failed["test_connects_with_psycopg_to_a_port_it_did_not_bind"]
    )
    assert "resolved the host name 'db.invalid'" in failed["test_resolves_a_host_name"]
    # The test that takes its program through run_program is an integration test.
    [deselected] = [call.items for call in recorder.getcalls("pytest_deselected")]
    assert [item.name for item in deselected] == ["test_takes_the_program_through_a_fixture"]


def test_a_unit_test_reaches_only_loopback_sockets_of_its_own() -> None:
    # What the planted tests cannot try without leaving the machine if the rule were wrong.
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        for own in (("127.0.0.1", port), ("127.0.0.2", port), ("localhost", port),
                    ("::1", port, 0, 0), ("::ffff:127.0.0.1", port, 0, 0)):  # fmt: skip
            assert conftest._own(socket.AF_INET6 if ":" in own[0] else socket.AF_INET, own)
        for other in ("10.0.0.1", "192.0.2.1", "db.example", "0.0.0.0"):
            assert not conftest._own(socket.AF_INET, (other, port)), other
        assert not conftest._own(socket.AF_INET, ("127.0.0.1", port + 1 if port < 65535 else 1))
    assert not conftest._own(socket.AF_INET, ("127.0.0.1", port))  # closed: another's now
    assert not conftest._own(socket.AF_UNIX, "/var/run/postgresql/.s.PGSQL.5432")
