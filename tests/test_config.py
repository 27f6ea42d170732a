"""Configuration: sources, precedence, and errors that name the source and the problem."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.cli import main
from exporter.config import Overrides, load, read_environment, read_flags
from exporter.embedded_postgres import free_port
from exporter.logs import LogfmtFormatter
from exporter.schema import parse_duration

DSN = "postgresql://monitor@db.example:5432/postgres"


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "DATA_SOURCE_NAME",
        "PG_ADVISORY_EXPORTER_DSN",
        "PG_ADVISORY_EXPORTER_MIN_INTERVAL",
    ):
        monkeypatch.delenv(name, raising=False)


def _write(tmp_path: Path, content: Any) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(content if isinstance(content, str) else yaml.safe_dump(content))
    return path


def _error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main([*argv, "--config.check"]) == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ({"targets": [{"name": "a", "dsn": DSN, "dsnn": DSN}]}, "targets[0].dsnn: unknown field"),
        ({"targets": [{"name": "a"}]}, "targets[0].dsn: required field is missing"),
        ({"targets": []}, "targets: "),
        (
            {"collection": {"min_interval": "soon"}, "targets": [{"name": "a", "dsn": DSN}]},
            "collection.min_interval: 'soon' is not a duration",
        ),
        (
            {
                "collection": {"application_name_limit": "many"},
                "targets": [{"name": "a", "dsn": DSN}],
            },
            "collection.application_name_limit: Input should be a valid integer",
        ),
        (
            {"collection": {"application_name_limit": 0}, "targets": [{"name": "a", "dsn": DSN}]},
            "collection.application_name_limit: Input should be greater than or equal to 1",
        ),
        (
            {
                "targets": [
                    {
                        "name": "a",
                        "dsn": DSN,
                        "collection": {
                            "application_name_rewrites": [{"pattern": "((", "replacement": "x"}]
                        },
                    }
                ]
            },
            "targets[0].collection.application_name_rewrites[0].pattern: bad regular expression",
        ),
        (
            {"targets": [{"name": "a", "dsn": DSN}, {"name": "a", "dsn": DSN}]},
            "target name 'a' is used twice",
        ),
        ({"targets": [{"name": "no spaces", "dsn": DSN}]}, "targets[0].name: String should match"),
        (
            {"web": {"listen_address": "9846"}, "targets": [{"name": "a", "dsn": DSN}]},
            "web.listen_address: '9846' is not host:port",
        ),
        ("targets: [unclosed", "not valid YAML"),
        ("- just\n- a list\n", "(top level): expected a mapping"),
    ],
)
def test_file_errors_name_the_file_and_the_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: Any, expected: str
) -> None:
    path = _write(tmp_path, content)
    message = _error(capsys, "--config.file", str(path))
    assert f"{path}: " in message
    assert expected in message


def test_malformed_dsn_is_named_without_its_password(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, {"targets": [{"name": "a", "dsn": "postgresql://u:s3cr%zzet@[::1/db"}]})
    message = _error(capsys, "--config.file", str(path))
    assert "targets[0].dsn: malformed DSN" in message
    assert "s3cr" not in message


def test_unreadable_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.yaml"
    assert "cannot read the configuration file" in _error(capsys, "--config.file", str(missing))
    path = _write(tmp_path, {"targets": [{"name": "a", "dsn": DSN, "password_file": str(missing)}]})
    message = _error(capsys, "--config.file", str(path))
    assert f"targets[0]: cannot read password_file {missing}" in message


def test_password_in_both_places(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    secret = tmp_path / "secret"
    secret.write_text("pw")
    dsn = "host=db password=inline"
    path = _write(tmp_path, {"targets": [{"name": "a", "dsn": dsn, "password_file": str(secret)}]})
    message = _error(capsys, "--config.file", str(path))
    assert "either in the DSN or in password_file" in message
    assert "inline" not in message


def test_flag_errors_name_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    message = _error(capsys, "--dsn", DSN, "--collection.min-interval", "soon")
    assert "flag --collection.min-interval: 'soon' is not a duration" in message
    message = _error(capsys, "--dsn", DSN, "--web.listen-address", "everywhere")
    assert "flag --web.listen-address: 'everywhere' is not host:port" in message
    message = _error(capsys, "--dsn", "host=db password=hunter2 port")
    assert "flag --dsn: malformed DSN" in message
    assert "hunter2" not in message


def test_environment_errors_name_the_variable(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATA_SOURCE_NAME", DSN)
    monkeypatch.setenv("PG_ADVISORY_EXPORTER_MIN_INTERVAL", "soon")
    message = _error(capsys)
    assert "environment variable PG_ADVISORY_EXPORTER_MIN_INTERVAL: 'soon' is not" in message
    monkeypatch.delenv("PG_ADVISORY_EXPORTER_MIN_INTERVAL")
    monkeypatch.setenv("DATA_SOURCE_NAME", "postgresql://u:s3cret@[::1/db")
    message = _error(capsys)
    assert "environment variable DATA_SOURCE_NAME: malformed DSN" in message
    assert "s3cret" not in message


def test_nothing_to_watch(capsys: pytest.CaptureFixture[str]) -> None:
    assert "no server to watch" in _error(capsys)


def test_dsn_and_file_together(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, {"targets": [{"name": "a", "dsn": DSN}]})
    assert "both a DSN and --config.file" in _error(
        capsys, "--dsn", DSN, "--config.file", str(path)
    )


def test_valid_configuration_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, {"targets": [{"name": "a", "dsn": DSN}, {"name": "b", "dsn": DSN}]})
    assert main(["--config.file", str(path), "--config.check"]) == 0
    assert "2 target(s): a, b" in capsys.readouterr().out


def test_dsn_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATA_SOURCE_NAME", DSN)
    config = load(read_flags({}), read_environment())
    assert [t.name for t in config.targets] == ["default"]
    assert config.targets[0].dsn == DSN
    monkeypatch.setenv("PG_ADVISORY_EXPORTER_DSN", "host=preferred")
    assert load(read_flags({}), read_environment()).targets[0].dsn == "host=preferred"


def test_flags_override_environment_which_overrides_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _write(
        tmp_path,
        {
            "collection": {"min_interval": "10s", "statement_timeout": "7s"},
            "log": {"level": "debug"},
            "targets": [
                {"name": "a", "dsn": DSN},
                {"name": "b", "dsn": DSN, "collection": {"min_interval": "1m"}},
            ],
        },
    )

    def settings(flags: dict[str, str]) -> tuple[float, float, float, str]:
        config = load(read_flags({"config_file": str(path), **flags}), read_environment())
        a, b = (t.collection for t in config.targets)
        assert a is not None
        assert b is not None
        return a.min_interval, b.min_interval, a.statement_timeout, config.log.level

    assert settings({}) == (10, 60, 7, "debug")
    monkeypatch.setenv("PG_ADVISORY_EXPORTER_MIN_INTERVAL", "20s")
    assert settings({}) == (20, 60, 7, "debug")
    # A target's own block is the most specific and still wins.
    assert settings({"min_interval": "30s", "log_level": "warning"}) == (30, 60, 7, "warn")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("5s", 5), ("500ms", 0.5), ("1m30s", 90), ("2h", 7200), ("1.5", 1.5), (3, 3)],
)
def test_durations(text: str | int, seconds: float) -> None:
    assert parse_duration(text) == seconds


def test_the_real_command_exits_2_on_a_bad_configuration(tmp_path: Path) -> None:
    path = _write(tmp_path, {"targets": [{"name": "a", "dsn": DSN, "extra": 1}]})
    result = subprocess.run(
        [sys.executable, "-m", "exporter", "--config.file", str(path)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert f"{path}: targets[0].extra: unknown field" in result.stderr


def test_check_exits_non_zero_when_it_cannot_connect() -> None:
    dsn = f"host=127.0.0.1 port={free_port()} user=x dbname=x connect_timeout=2"
    result = subprocess.run(
        [sys.executable, "-m", "exporter", "check", "--dsn", dsn],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 1
    assert "cannot collect" in result.stdout
    assert "Connection refused" in result.stdout


def test_logfmt_quotes_hostile_values() -> None:
    record = logging.makeLogRecord(
        {"msg": "collection failed", "levelno": logging.ERROR, "error": 'a "b"\nc=d'}
    )
    line = LogfmtFormatter().format(record)
    assert "\n" not in line
    assert 'error="a \\"b\\"\\nc=d"' in line
    assert 'msg="collection failed"' in line


def test_overrides_reject_unknown_settings() -> None:
    with pytest.raises(ValueError, match="Extra inputs"):
        Overrides.model_validate({"nonsense": 1})
