"""Messages that say what is wrong, and the deadlocks of real databases only."""

from __future__ import annotations

import ast
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from support import REFUSED_DSN, RunProgram

from devtools.demo import check_command, config_file_text, demo_config
from devtools.embedded_postgres import EmbeddedPostgres
from pg_advisory_exporter.alerting.rules import Thresholds
from pg_advisory_exporter.cli import main
from pg_advisory_exporter.collect import snapshot
from pg_advisory_exporter.collect.databases import read_databases
from pg_advisory_exporter.collect.snapshot import grant_read_all_stats, read_snapshot
from pg_advisory_exporter.config.exporter_settings import WebConfig
from pg_advisory_exporter.config.loader import load
from pg_advisory_exporter.validation import ConfigError

# Neither the exporter's variables nor DATA_SOURCE_NAME of the shell that runs the tests.
pytestmark = pytest.mark.usefixtures("clean_environment")


def test_the_grant_that_a_missing_privilege_asks_for_is_written_in_one_place() -> None:
    package = Path(snapshot.__file__).resolve().parent.parent
    written = {
        f"{path.relative_to(package)}:{node.lineno}"
        for path in sorted(package.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and "GRANT pg_read_all_stats" in str(node.value)
    }
    assert len(written) == 1, written
    assert grant_read_all_stats("monitor") == 'GRANT pg_read_all_stats TO "monitor"'


def test_the_grant_names_any_role_as_postgresql_reads_it(pg: EmbeddedPostgres) -> None:
    role = 'Ops "monitor"'
    assert grant_read_all_stats(role) == 'GRANT pg_read_all_stats TO "Ops ""monitor"""'
    with pg.connect() as conn:
        conn.execute('CREATE ROLE "Ops ""monitor"""')
        try:
            conn.execute(grant_read_all_stats(role).encode())  # composed text: as bytes
            granted = conn.execute(
                "SELECT pg_has_role(%s, 'pg_read_all_stats', 'USAGE')", (role,)
            ).fetchone()
            assert granted == (True,)
        finally:
            conn.execute('DROP ROLE "Ops ""monitor"""')


def test_a_misspelt_scheme_is_named() -> None:
    with pytest.raises(ConfigError) as refused:
        load({"dsn": "postgresq://u@h/db"})
    message = str(refused.value)
    assert "flag --dsn: malformed DSN: unknown scheme 'postgresq://'" in message
    assert "postgresql:// or postgres://" in message
    assert 'missing "="' not in message
    for dsn in ("postgres://u@h/db", "postgresql://u@h/db", "host=h dbname=a://b"):
        assert load({"dsn": dsn}).targets[0].dsn == dsn


def test_a_port_out_of_range_is_named() -> None:
    with pytest.raises(ConfigError) as refused:
        load({"web_listen_address": ":70000", "dsn": "host=h"})
    message = str(refused.value)
    range_ = "the port must be a number from 0 to 65535"
    assert f"flag --web.listen-address: ':70000': {range_}" in message
    assert "not host:port" not in message
    config = load({"web_listen_address": ":65535", "dsn": "host=h"})
    assert config.web.listen_address == ":65535"


def test_an_unknown_threshold_lists_the_thresholds(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rules", "--set", "bogus=1"]) == 2
    message = capsys.readouterr().err
    assert "flag --set bogus: unknown field" in message
    for name in Thresholds.model_fields:
        assert name in message


def test_check_lists_only_the_flags_it_uses(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "1000")
    with pytest.raises(SystemExit):
        main(["check", "--help"])
    text = capsys.readouterr().out
    assert "--web." not in text
    for flag in ("--dsn", "--config.file", "--log.level", "--collection.min-interval"):
        assert flag in text


def test_the_demo_prints_a_check_command_that_works_as_printed(
    tmp_path: Path, run_program: RunProgram
) -> None:
    config = demo_config(WebConfig(), REFUSED_DSN)
    path = tmp_path / "exporter.yaml"
    path.write_text(config_file_text(config))
    # The command reads the same targets as the demo's exporter: its keys and rewrites.
    loaded = load({"config_file": str(path)})
    assert loaded.targets == config.targets
    command = shlex.split(check_command(path))
    assert command[3:] == ["check", "--config.file", str(path)]
    # Outside the virtualenv, from anywhere: nothing of it is looked up on PATH.
    validate = [*command[:3], "--config.check", *command[3:]]
    result = run_program(validate, timeout=60, cwd=tmp_path, env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    assert "1 target(s): demo" in result.stdout


TEMPLATE = "advisory_exporter_template"


@pytest.fixture
def user_template(pg: EmbeddedPostgres) -> Iterator[str]:
    """A template database of the user's own, beside template0 and template1."""
    with pg.connect() as conn:
        conn.execute(f"CREATE DATABASE {TEMPLATE} IS_TEMPLATE true")
    try:
        yield TEMPLATE
    finally:
        with pg.connect() as conn:
            conn.execute(f"ALTER DATABASE {TEMPLATE} IS_TEMPLATE false")
            conn.execute(f"DROP DATABASE {TEMPLATE}")


def test_deadlocks_are_counted_for_databases_but_not_templates(
    monitor_dsn: str, user_template: str
) -> None:
    conn: psycopg.Connection[Any]
    with psycopg.connect(monitor_dsn, autocommit=True) as conn:
        deadlocks = read_snapshot(conn, databases=read_databases(conn)).deadlocks
    assert {"postgres", "billing"} <= deadlocks.keys()
    assert not {"template0", "template1", user_template} & deadlocks.keys()
