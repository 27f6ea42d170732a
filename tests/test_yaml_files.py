"""Every YAML file the exporter reads gets the same refusals: the configuration, the web
configuration and the alert thresholds."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from support import EXAMPLE_DSN, Cli, cli_command

from pg_advisory_exporter.alerting.rules import thresholds_from
from pg_advisory_exporter.validation import ConfigError
from pg_advisory_exporter.yaml_file import EXPANSION_FACTOR, EXPANSION_FLOOR, read_yaml

# Seven levels of ten aliases each: ten million values written in seven short lines.
ALIAS_BOMB = "".join(
    f"l{level}: &l{level} [{', '.join([f'*l{level - 1}' if level else 'x'] * 10)}]\n"
    for level in range(7)
)

# The command that reads each kind of file, and a valid document to put a mistake next to.
READERS: dict[str, tuple[Callable[[Path], list[str]], str]] = {
    "configuration": (
        lambda path: ["--config.file", str(path), "--config.check"],
        f"targets:\n  - name: a\n    dsn: {EXAMPLE_DSN}\n",
    ),
    "web configuration": (
        lambda path: ["--dsn", EXAMPLE_DSN, "--web.config.file", str(path), "--config.check"],
        "basic_auth_users: {}\n",
    ),
    "thresholds": (
        lambda path: ["rules", "--thresholds", str(path)],
        "leaked_lock_after: 30m\n",
    ),
}


@pytest.mark.parametrize(
    ("mistake", "message"),
    [
        ("waiters: 1\nwaiters: 2\n", "(top level): key 'waiters' is given twice (lines 1 and 2)"),
        (ALIAS_BOMB, "line 7, column 10: aliases expand the "),
        ("loop: &loop [*loop]\n", "line 1, column 7: an alias names a node holding it"),
        (
            "deep: " + "[" * 65 + "]" * 65 + "\n",
            "line 1, column 70: nested more than 64 levels deep",
        ),
    ],
    ids=["duplicate key", "alias bomb", "alias loop", "too deep"],
)
@pytest.mark.parametrize("kind", READERS)
def test_every_file_is_refused_the_same_way_with_its_location(
    tmp_path: Path, cli: Cli, kind: str, mistake: str, message: str
) -> None:
    arguments, valid = READERS[kind]
    path = tmp_path / "file.yaml"
    path.write_text(mistake + valid)  # first, so that its line numbers are the file's
    result = cli(*arguments(path))
    assert "Traceback" not in result.stderr
    assert result.returncode == 2, result.stderr
    assert f"{path}: {message}" in result.stderr


def test_a_threshold_given_twice_is_refused_not_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "thresholds.yaml"
    path.write_text("lock_table_warning: 0.5\nwaiters: 3\nlock_table_warning: 0.9\n")
    with pytest.raises(ConfigError) as refused:
        thresholds_from(path, [])
    assert str(refused.value) == (
        f"{path}: (top level): key 'lock_table_warning' is given twice (lines 1 and 3)"
    )


def test_an_alias_bomb_in_the_thresholds_is_refused_before_it_is_built(tmp_path: Path) -> None:
    path = tmp_path / "thresholds.yaml"
    path.write_text(ALIAS_BOMB)
    with pytest.raises(ConfigError) as refused:
        thresholds_from(path, [])
    # Written: the root mapping, 7 keys, 7 lists of 10. The document: the root, its 7 keys
    # and 11 + 111 + ... + 11,111,111 values under them; the last line's aliases repeat most.
    assert str(refused.value) == (
        f"{path}: line 7, column 10: aliases expand the 85 values written to 12,345,685, "
        f"more than {EXPANSION_FLOOR:,} (the larger of {EXPANSION_FACTOR} times those written "
        f"and {EXPANSION_FLOOR:,}); the alias here repeats 1,111,111"
    )


# Runs a command and prints the peak resident memory of it (and its children) in KiB.
_PEAK_RSS = (
    "import resource, subprocess, sys\n"
    "done = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    "sys.stderr.write(done.stderr)\n"
    "sys.exit(done.returncode)\n"
)


@pytest.mark.integration  # runs the command
@pytest.mark.parametrize("uses", [2_000, 20_000])
def test_one_target_named_thousands_of_times_is_refused_in_little_memory(
    tmp_path: Path, uses: int
) -> None:
    # One mapping of 200 keys, named `uses` times: 18 KB took 580 MB to refuse, and 143 KB
    # (20,000 uses) would take gigabytes but for a limit on the document's whole size.
    keys = "".join(f"  setting_{i}: value-number-{i}\n" for i in range(200))
    path = tmp_path / "config.yaml"
    path.write_text("base: &target\n" + keys + "targets:\n" + "  - *target\n" * uses)
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            _PEAK_RSS,
            *cli_command("--config.check", "--config.file", str(path)),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    seconds = time.monotonic() - started
    assert done.returncode == 2, done.stderr
    assert f"{path}: line 203, column 5: aliases expand the " in done.stderr
    assert len(done.stderr.splitlines()) == 1  # refused before any value is validated
    # The command's own imports take about 55 MB.
    assert int(done.stdout) < 100 * 1024, f"peak {int(done.stdout) // 1024} MB"
    assert seconds < 10


@pytest.mark.parametrize("targets", [3, 5_000])
def test_shared_settings_by_alias_are_read(tmp_path: Path, targets: int) -> None:
    # What aliases are for: a block written once and named by every target of a fleet.
    path = tmp_path / "config.yaml"
    fast = (
        "{min_interval: 1s, statement_timeout: 2s, connect_timeout: 1s, reconnect_backoff_max: 30s}"
    )
    named = "".join(
        f"  - {{name: t{i}, dsn: '{EXAMPLE_DSN}', collection: *fast}}\n" for i in range(targets)
    )
    path.write_text(f"fast: &fast {fast}\ntargets:\n{named}")
    document = read_yaml(path)
    assert isinstance(document, dict)
    assert [t["collection"]["min_interval"] for t in document["targets"]] == ["1s"] * targets
