"""Every YAML file the exporter reads gets the same refusals: the configuration, the web
configuration and the alert thresholds."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from support import Cli

from pg_advisory_exporter.rules import thresholds_from
from pg_advisory_exporter.schema import ConfigError
from pg_advisory_exporter.yaml_file import MAX_EXPANDED_NODES, read_yaml

DSN = "postgresql://monitor@db.example:5432/postgres"
# Seven levels of ten aliases each: ten million values written in seven short lines.
ALIAS_BOMB = "".join(
    f"l{level}: &l{level} [{', '.join([f'*l{level - 1}' if level else 'x'] * 10)}]\n"
    for level in range(7)
)

# The command that reads each kind of file, and a valid document to put a mistake next to.
READERS: dict[str, tuple[Callable[[Path], list[str]], str]] = {
    "configuration": (
        lambda path: ["--config.file", str(path), "--config.check"],
        f"targets:\n  - name: a\n    dsn: {DSN}\n",
    ),
    "web configuration": (
        lambda path: ["--dsn", DSN, "--web.config.file", str(path), "--config.check"],
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
        (ALIAS_BOMB, "aliases expand the document to "),
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
    # The root mapping, its 7 keys and 11 + 111 + ... + 11,111,111 values under them.
    assert str(refused.value) == (
        f"{path}: aliases expand the document to 12,345,685 values, "
        f"more than {MAX_EXPANDED_NODES:,}"
    )


def test_shared_settings_by_alias_are_read(tmp_path: Path) -> None:
    # What aliases are for: a block written once and named by every target.
    path = tmp_path / "config.yaml"
    targets = "".join(f"  - {{name: t{i}, dsn: '{DSN}', collection: *fast}}\n" for i in range(3))
    path.write_text(f"fast: &fast {{min_interval: 1s}}\ntargets:\n{targets}")
    document = read_yaml(path)
    assert isinstance(document, dict)
    assert [t["collection"] for t in document["targets"]] == [{"min_interval": "1s"}] * 3
