"""One definition per setting: flags, variables, file keys, help and the docs follow from it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import BaseModel
from pydantic_settings import BaseSettings, CliSettingsSource, CliSubCommand, SettingsError
from support import EXAMPLE_DSN, load_config, load_config_file, write_config

from pg_advisory_exporter.cli import main
from pg_advisory_exporter.config.collection import CollectionSettings
from pg_advisory_exporter.config.markers import FileOnly
from pg_advisory_exporter.config.sources import SETTINGS, Setting

CONFIGURATION_DOC = Path(__file__).parent.parent / "docs" / "configuration.md"
# What users' scripts, units and files already use: these must never change.
PUBLISHED = {
    "--dsn": ("PG_ADVISORY_EXPORTER_DSN", "DATA_SOURCE_NAME"),
    "--config.file": ("PG_ADVISORY_EXPORTER_CONFIG_FILE",),
    "--web.listen-address": ("PG_ADVISORY_EXPORTER_WEB_LISTEN_ADDRESS",),
    "--web.telemetry-path": ("PG_ADVISORY_EXPORTER_WEB_TELEMETRY_PATH",),
    "--log.level": ("PG_ADVISORY_EXPORTER_LOG_LEVEL",),
    "--log.format": ("PG_ADVISORY_EXPORTER_LOG_FORMAT",),
    "--collection.statement-timeout": ("PG_ADVISORY_EXPORTER_STATEMENT_TIMEOUT",),
    "--collection.lock-timeout": ("PG_ADVISORY_EXPORTER_LOCK_TIMEOUT",),
    "--collection.connect-timeout": ("PG_ADVISORY_EXPORTER_CONNECT_TIMEOUT",),
    "--collection.min-interval": ("PG_ADVISORY_EXPORTER_MIN_INTERVAL",),
    "--collection.application-name-limit": ("PG_ADVISORY_EXPORTER_APPLICATION_NAME_LIMIT",),
}


# Neither the exporter's variables nor DATA_SOURCE_NAME of the shell that runs the tests.
pytestmark = pytest.mark.usefixtures("clean_environment")


def _collection_settings() -> list[tuple[str, Setting]]:
    by_path = {setting.path: setting for setting in SETTINGS}
    return [
        (name, by_path[("collection", name)])
        for name, field in CollectionSettings.model_fields.items()
        if not any(isinstance(mark, FileOnly) for mark in field.metadata)
    ]


def _help(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *argv: str
) -> dict[str, str]:
    """The options of `--help` and the text of each, joined from argparse's lines."""
    monkeypatch.setenv("COLUMNS", "1000")
    with pytest.raises(SystemExit):
        main([*argv, "--help"])
    options: dict[str, str] = {}
    names: list[str] = []
    for line in capsys.readouterr().out.split("\noptions:\n", 1)[1].splitlines():
        text = line
        if line.startswith("  -"):  # "  -h, --help  show ...", the help maybe on the next line
            spelled, _, text = line.strip().partition("  ")
            names = [name.split()[0] for name in spelled.split(", ")]
        for name in names:
            options[name] = f"{options.get(name, '')} {text.strip()}".strip()
    return options


def test_the_published_flags_and_variables_are_kept() -> None:
    given = {setting.flag: setting.variables for setting in SETTINGS}
    assert {flag: given.get(flag) for flag in PUBLISHED} == PUBLISHED


def test_only_lists_are_file_only() -> None:
    file_only = {
        name
        for name, field in CollectionSettings.model_fields.items()
        if any(isinstance(mark, FileOnly) for mark in field.metadata)
    }
    assert file_only == {"application_name_rewrites", "idle_by_design"}


def test_every_collection_setting_has_a_flag_a_variable_and_a_help_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    helps = _help(monkeypatch, capsys)
    for name, setting in _collection_settings():
        field = CollectionSettings.model_fields[name]
        assert setting.flag == f"--collection.{name.replace('_', '-')}"
        assert setting.variables == (f"PG_ADVISORY_EXPORTER_{name.upper()}",)
        assert field.description, f"{name} has no description for its help line"
        line = helps[setting.flag]
        assert field.description in line
        assert f"default {setting.default};" in line
        assert setting.variables[0] in line


def test_durations_are_shown_as_durations() -> None:
    defaults = {setting.flag: setting.default for setting in SETTINGS}
    assert defaults["--collection.statement-timeout"] == "5s"
    assert defaults["--collection.reconnect-backoff-max"] == "30s"
    assert defaults["--collection.application-name-limit"] == "100"
    assert defaults["--web.listen-address"] == ":9846"
    assert defaults["--dsn"] == ""


@pytest.mark.parametrize(("name", "setting"), _collection_settings())
def test_flag_variable_and_file_key_set_the_same_thing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, setting: Setting
) -> None:
    value = "70"  # a number every setting takes, and none has as its default
    assert setting.default != value

    def loaded(flags: dict[str, object], collection: dict[str, object]) -> object:
        config = load_config(
            tmp_path,
            {"collection": collection, "targets": [{"name": "a", "dsn": EXAMPLE_DSN}]},
            **flags,
        )
        return getattr(config.targets[0].collection, name)

    by_file = loaded({}, {name: value})
    assert by_file == loaded({setting.dest: value}, {})
    monkeypatch.setenv(setting.variables[0], value)
    assert by_file == loaded({}, {})
    assert by_file != getattr(CollectionSettings(), name)


def _flag_table() -> list[list[str]]:
    section = CONFIGURATION_DOC.read_text().split("## Flags and environment variables", 1)[1]
    rows = re.findall(r"^\|(.*)\|$", section.split("\n\n", 2)[1], flags=re.MULTILINE)
    cells = [[cell.strip() for cell in row.split("|")] for row in rows]
    assert cells[0][:3] == ["flag", "environment variable", "default"]
    return cells[2:]  # after the header and its rule


def _code(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def test_the_flag_table_lists_what_the_parser_has(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    parser_flags = set(_help(monkeypatch, capsys)) - {"-h", "--help", "--version"}
    rows = {_code(row[0])[0]: row for row in _flag_table()}
    assert set(rows) == parser_flags
    for setting in SETTINGS:
        row = rows[setting.flag]
        assert tuple(_code(row[1])) == setting.variables, setting.flag
        assert _code(row[2]) == ([setting.default] if setting.default else []), setting.flag


def test_a_targets_own_file_only_settings_load_as_they_validate(tmp_path: Path) -> None:
    rewrite = {"pattern": "(.+)-x", "replacement": r"\1"}
    path = write_config(
        tmp_path,
        {
            "targets": [
                {
                    "name": "a",
                    "dsn": EXAMPLE_DSN,
                    "collection": {"application_name_rewrites": [rewrite]},
                }
            ]
        },
    )
    collection = load_config_file(path).targets[0].collection
    assert [rule.rule().apply("web-x") for rule in collection.application_name_rewrites] == ["web"]


def test_the_dsn_help_says_how_to_keep_the_password_out_of_ps() -> None:
    (dsn,) = (setting for setting in SETTINGS if setting.flag == "--dsn")
    for way in ("ps shows", "PGPASSFILE", "the variable", "password_file"):
        assert way in dsn.help


def test_flags_follow_the_command_where_the_pydantic_settings_cli_refuses_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Why the flags stay argparse's while pydantic-settings reads the variables.

    `pg-advisory-exporter check --dsn ...` is the published form: the settings' flags come
    after a command as well as before it. pydantic-settings' CLI source, given the same
    shape (a --dsn setting and a `check` command), refuses a flag after the command.
    """

    class Check(BaseModel):
        format: str = "text"

    class Command(BaseSettings):
        dsn: str | None = None
        check: CliSubCommand[Check]

    source: CliSettingsSource[object] = CliSettingsSource(
        Command, cli_kebab_case=True, cli_exit_on_error=False
    )
    source(args=["--dsn", EXAMPLE_DSN, "check"])  # before the command: taken
    with pytest.raises(SettingsError, match="unrecognized arguments: --dsn"):
        source(args=["check", "--dsn", EXAMPLE_DSN])
    # Ours reads it there, and names it: a malformed DSN stops before any connection.
    assert main(["check", "--dsn", "postgresql://u@[::1/db"]) == 2
    assert "flag --dsn: malformed DSN" in capsys.readouterr().err
