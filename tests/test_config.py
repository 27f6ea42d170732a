"""Configuration: sources, precedence, and errors that name the source and the problem."""

from __future__ import annotations

import logging
import os
import re
import time
import typing
from pathlib import Path

import pytest
from support import (
    EXAMPLE_DSN,
    REFUSED_DSN,
    Cli,
    Config,
    load_config,
    load_config_file,
    write_config,
)

from pg_advisory_exporter.cli import main
from pg_advisory_exporter.config.dsn import (
    MAX_PASSWORD_BYTES,
    password_file_problem,
    with_password,
)
from pg_advisory_exporter.config.loader import load
from pg_advisory_exporter.config.settings import Settings, TargetSettings
from pg_advisory_exporter.config.sources import Given, settings_from
from pg_advisory_exporter.logs import LogfmtFormatter
from pg_advisory_exporter.validation import ConfigError
from pg_advisory_exporter.yaml_file import MAX_FILE_BYTES

# Neither the exporter's variables nor DATA_SOURCE_NAME of the shell that runs the tests.
pytestmark = pytest.mark.usefixtures("clean_environment")


def _error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main([*argv, "--config.check"]) == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (
            {"targets": [{"name": "a", "dsn": EXAMPLE_DSN, "dsnn": EXAMPLE_DSN}]},
            "targets[0] (a).dsnn: unknown field",
        ),
        ({"targets": [{"name": "a"}]}, "targets[0] (a).dsn: required field is missing"),
        ({"targets": []}, "targets: "),
        (
            {
                "collection": {"min_interval": "soon"},
                "targets": [{"name": "a", "dsn": EXAMPLE_DSN}],
            },
            "collection.min_interval: 'soon' is not a duration",
        ),
        (
            {
                "collection": {"application_name_limit": "many"},
                "targets": [{"name": "a", "dsn": EXAMPLE_DSN}],
            },
            "collection.application_name_limit: Input should be a valid integer",
        ),
        (
            {
                "collection": {"application_name_limit": 0},
                "targets": [{"name": "a", "dsn": EXAMPLE_DSN}],
            },
            "collection.application_name_limit: Input should be greater than or equal to 1",
        ),
        (
            {
                "targets": [
                    {
                        "name": "a",
                        "dsn": EXAMPLE_DSN,
                        "collection": {
                            "application_name_rewrites": [{"pattern": "((", "replacement": "x"}]
                        },
                    }
                ]
            },
            "targets[0] (a).collection.application_name_rewrites[0].pattern: bad regular "
            "expression",
        ),
        (
            {"targets": [{"name": "a", "dsn": EXAMPLE_DSN}, {"name": "a", "dsn": EXAMPLE_DSN}]},
            "target name 'a' is used twice: by targets[0] and targets[1]",
        ),
        (
            {"targets": [{"name": "no spaces", "dsn": EXAMPLE_DSN}]},
            "targets[0].name: String should match",
        ),
        (
            {"web": {"listen_address": "9846"}, "targets": [{"name": "a", "dsn": EXAMPLE_DSN}]},
            "web.listen_address: '9846' is not host:port",
        ),
        ("targets: [unclosed", "not valid YAML"),
        ("- just\n- a list\n", "(top level): expected a mapping"),
    ],
)
def test_file_errors_name_the_file_and_the_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | Config, expected: str
) -> None:
    path = write_config(tmp_path, content)
    message = _error(capsys, "--config.file", str(path))
    assert f"{path}: " in message
    assert expected in message


ORDERS = {"name": "orders", "dsn": EXAMPLE_DSN}


@pytest.mark.parametrize(
    ("billing", "expected"),
    [
        ({"dsn": "host=db password=x", "password_file": "/p"}, "targets[1] (billing): give the"),
        ({"dsn": EXAMPLE_DSN, "collection": {"min_interval": "soon"}},
         "targets[1] (billing).collection.min_interval: 'soon' is not a duration"),
        ({"dsn": EXAMPLE_DSN, "keys": [{"name": "k", "key": 1}, {"name": "k", "key": 2}]},
         "targets[1] (billing).keys: "),
        ({"dsn": EXAMPLE_DSN, "poolers": [{"name": "pgb"}]},
         "targets[1] (billing).poolers[0] (pgb): give exactly one of admin_dsn or addresses"),
        ({"dsn": "host=db port=y"}, "targets[1] (billing).dsn: malformed DSN"),
        ({"dsn": EXAMPLE_DSN, "dsnn": 1}, "targets[1] (billing).dsnn: unknown field"),
    ],
)  # fmt: skip
def test_errors_name_a_target_by_its_position_and_its_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], billing: Config, expected: str
) -> None:
    path = write_config(tmp_path, {"targets": [ORDERS, {"name": "billing", **billing}]})
    assert f"{path}: {expected}" in _error(capsys, "--config.file", str(path))


def test_errors_name_a_target_where_the_file_alone_says_which(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A key given twice (found before anything is built), a name or a log that two targets
    share, a registry that clashes with the top level's: each says which target."""
    twice = f"targets:\n  - name: orders\n    dsn: {EXAMPLE_DSN}\n    dsn: host=other\n"
    path = write_config(tmp_path, twice)
    message = _error(capsys, "--config.file", str(path))
    assert f"{path}: targets[0] (orders): key 'dsn' is given twice (lines 3 and 4)" in message
    log = {"path": str(tmp_path), "format": "csvlog"}
    cases: list[tuple[Config, str]] = [
        ({"targets": [ORDERS, {**ORDERS, "dsn": "host=other"}]},
         "targets: target name 'orders' is used twice: by targets[0] and targets[1]"),
        ({"targets": [{**ORDERS, "server_log": log},
                      {"name": "billing", "dsn": EXAMPLE_DSN, "server_log": log}]},
         "targets[1] (billing).server_log: '"),
        ({"keys": [{"name": "leader", "key": 42}],
          "targets": [ORDERS, {"name": "billing", "dsn": EXAMPLE_DSN,
                               "keys": [{"name": "again", "key": 42}]}]},
         "targets[1] (billing).keys: keys 'leader' (key 42) and 'again' (key 42)"),
    ]  # fmt: skip
    for document, expected in cases:
        path = write_config(tmp_path, document)
        assert expected in _error(capsys, "--config.file", str(path)), document


@pytest.mark.parametrize(
    "name",
    ["a b", "x" * 10_000, "evil\nlevel=error msg=forged", 5, None, ["list"], "-leading"],
    ids=["space", "long", "newline", "number", "null", "list", "leading dash"],
)
def test_a_name_no_target_could_have_is_never_repeated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: object
) -> None:
    """An invalid name is reported at its position alone, beside a valid one named: the
    message never carries a megabyte, a line break that forges a log line, or a value that
    is no name."""
    document = {"targets": [{**ORDERS, "oops": 1}, {"name": name, "dsn": "host=db port=y"}]}
    path = write_config(tmp_path, document)
    message = _error(capsys, "--config.file", str(path))
    assert f"{path}: targets[0] (orders).oops: unknown field" in message
    assert f"{path}: targets[1].dsn: malformed DSN" in message
    assert f"{path}: targets[1].name: " in message
    assert "forged" not in message
    assert "x" * 100 not in message


def test_a_key_is_named_as_a_key_may_be_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A key's name may do what a target's may not (start with "_", hold ":", run to 100
    characters): the error names it all the same."""
    name = "_app:leader" + "x" * 80
    document = {"keys": [{"name": name, "key": 1, "oops": 1}], "targets": [ORDERS]}
    path = write_config(tmp_path, document)
    assert f"keys[0] ({name}).oops: unknown field" in _error(capsys, "--config.file", str(path))


def test_malformed_dsn_is_named_without_its_password(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_config(
        tmp_path, {"targets": [{"name": "a", "dsn": "postgresql://u:s3cr%zzet@[::1/db"}]}
    )
    message = _error(capsys, "--config.file", str(path))
    assert "targets[0] (a).dsn: malformed DSN" in message
    assert "s3cr" not in message


def test_an_unreadable_configuration_file_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope.yaml"
    assert "cannot read the configuration file" in _error(capsys, "--config.file", str(missing))


def _unreadable_password_files(folder: Path) -> dict[str, tuple[Path, str]]:
    """Password files that cannot give a password, by kind: each path and why not."""
    large = folder / "large"
    large.write_bytes(b"x" * (MAX_PASSWORD_BYTES + 1))
    binary = folder / "binary"
    binary.write_bytes(b"pass\xffword\n")
    return {
        "missing": (folder / "missing", "No such file or directory"),
        "folder": (folder, "Is a directory"),
        "large": (large, f"larger than {MAX_PASSWORD_BYTES // 1024} KiB: not a password file"),
        "binary": (binary, "is not UTF-8 text (byte 0xff at offset 4)"),
        "device": (Path("/dev/zero"), "larger than"),
    }


@pytest.mark.parametrize("kind", ["missing", "folder", "large", "binary", "device"])
def test_a_password_file_that_cannot_be_read_is_a_warning_not_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    """A Secret not mounted yet (or a wrong path) downs what it is for, not the exporter:
    --config.check says so and exits 0; the configuration loads, every target in it."""
    bad, why = _unreadable_password_files(tmp_path)[kind]
    good = tmp_path / "good"
    good.write_text("pw\n")
    pooler = {"name": "pgb", "admin_dsn": "host=pgb dbname=pgbouncer", "password_file": str(bad)}
    document = {
        "targets": [
            {"name": "orders", "dsn": EXAMPLE_DSN, "password_file": str(good)},
            {"name": "billing", "dsn": EXAMPLE_DSN, "password_file": str(bad),
             "poolers": [pooler]},
        ],
        "auth_modules": {"fleet": {"user": "m", "password_file": str(bad),
                                   "allowed_targets": ["10.0.0.0/8"]}},
    }  # fmt: skip
    path = write_config(tmp_path, document)
    assert main(["--config.file", str(path), "--config.check"]) == 0
    printed = capsys.readouterr().out
    assert "configuration is valid: 2 target(s): orders, billing" in printed
    warnings = [line for line in printed.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 3, printed
    for where, effect in [
        ("targets[1] (billing)", "the target is down"),
        ("targets[1] (billing).poolers[0] (pgb)", "the pooler is down"),
        ("auth_modules.fleet", "its probes fail"),
    ]:
        line = next(w for w in warnings if w.startswith(f"warning: {path}: {where}.password_file"))
        assert str(bad) in line
        assert why in line
        assert line.endswith(f"; {effect} until it can be read")
    config = load_config_file(path)
    assert [t.name for t in config.targets] == ["orders", "billing"]
    assert len(config.warnings) == 3
    with pytest.raises(ValueError, match=re.escape(why)):  # as each connect reads it
        config.targets[1].conninfo()
    assert "password=pw" in config.targets[0].conninfo().replace("'", "")


def test_a_password_file_that_never_answers_is_not_waited_for(tmp_path: Path) -> None:
    """A FIFO with no writer: opened without blocking, it gives an empty password at once
    (which the server then refuses) instead of holding the start or a connection; one whose
    writer has written nothing yet is refused with that reason, at once too."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    started = time.monotonic()
    assert password_file_problem(fifo) is None
    assert "password=''" in with_password("host=db", fifo)
    assert time.monotonic() - started < 1
    # With a writer that has written nothing yet: refused with the reason, at once.
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # lets the writer open
    writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    try:
        why = f"password_file {fifo} has nothing to read yet"
        assert password_file_problem(fifo) == why + " (a pipe, not a file)"
        with pytest.raises(ValueError, match=re.escape(why)):
            with_password("host=db", fifo)
    finally:
        os.close(writer)
        os.close(reader)
    assert time.monotonic() - started < 1


def test_password_in_both_places(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    secret = tmp_path / "secret"
    secret.write_text("pw")
    dsn = "host=db password=inline"
    path = write_config(
        tmp_path, {"targets": [{"name": "a", "dsn": dsn, "password_file": str(secret)}]}
    )
    message = _error(capsys, "--config.file", str(path))
    assert "either in the DSN or in password_file" in message
    assert "inline" not in message


def test_flag_errors_name_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    message = _error(capsys, "--dsn", EXAMPLE_DSN, "--collection.min-interval", "soon")
    assert "flag --collection.min-interval: 'soon' is not a duration" in message
    message = _error(capsys, "--dsn", EXAMPLE_DSN, "--web.listen-address", "everywhere")
    assert "flag --web.listen-address: 'everywhere' is not host:port" in message
    message = _error(capsys, "--dsn", "host=db password=hunter2 port")
    assert "flag --dsn: malformed DSN" in message
    assert "hunter2" not in message


def test_environment_errors_name_the_variable(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATA_SOURCE_NAME", EXAMPLE_DSN)
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
    path = write_config(tmp_path, {"targets": [{"name": "a", "dsn": EXAMPLE_DSN}]})
    assert "both a DSN and --config.file" in _error(
        capsys, "--dsn", EXAMPLE_DSN, "--config.file", str(path)
    )


def test_valid_configuration_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_config(
        tmp_path,
        {"targets": [{"name": "a", "dsn": EXAMPLE_DSN}, {"name": "b", "dsn": EXAMPLE_DSN}]},
    )
    assert main(["--config.file", str(path), "--config.check"]) == 0
    assert "2 target(s): a, b" in capsys.readouterr().out


def test_dsn_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATA_SOURCE_NAME", EXAMPLE_DSN)
    config = load({})
    assert [t.name for t in config.targets] == ["default"]
    assert config.targets[0].dsn == EXAMPLE_DSN
    monkeypatch.setenv("PG_ADVISORY_EXPORTER_DSN", "host=preferred")
    assert load({}).targets[0].dsn == "host=preferred"


def test_flags_override_environment_which_overrides_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_config(
        tmp_path,
        {
            "collection": {"min_interval": "10s", "statement_timeout": "7s"},
            "log": {"level": "debug"},
            "targets": [
                {"name": "a", "dsn": EXAMPLE_DSN},
                {"name": "b", "dsn": EXAMPLE_DSN, "collection": {"min_interval": "1m"}},
            ],
        },
    )

    def settings(flags: dict[str, str]) -> tuple[float, float, float, str]:
        config = load_config_file(path, **flags)
        a, b = (t.collection for t in config.targets)
        return a.min_interval, b.min_interval, a.statement_timeout, config.log.level

    assert settings({}) == (10, 60, 7, "debug")
    monkeypatch.setenv("PG_ADVISORY_EXPORTER_MIN_INTERVAL", "20s")
    assert settings({}) == (20, 60, 7, "debug")
    # A target's own block is the most specific and still wins.
    assert settings({"min_interval": "30s", "log_level": "warning"}) == (30, 60, 7, "warn")


def test_the_real_command_exits_2_on_a_bad_configuration(tmp_path: Path, cli: Cli) -> None:
    path = write_config(tmp_path, {"targets": [{"name": "a", "dsn": EXAMPLE_DSN, "extra": 1}]})
    result = cli("--config.file", str(path))
    assert result.returncode == 2
    assert f"{path}: targets[0] (a).extra: unknown field" in result.stderr


def test_check_exits_non_zero_when_it_cannot_connect(cli: Cli) -> None:
    result = cli("check", "--dsn", REFUSED_DSN)
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


def test_the_settings_reject_what_no_setting_is() -> None:
    source = Given(Settings)
    source.values[("web", "nonsense")] = 1
    source.origins[("web", "nonsense")] = "a test's source"
    with pytest.raises(ConfigError, match=r"^a test's source: unknown field$"):
        settings_from(source)


def _refused(cli: Cli, *argv: str, **environment: str) -> str:
    """The error of `--config.check` through the real command, with these variables added."""
    result = cli(*argv, "--config.check", env=environment)
    assert "Traceback" not in result.stderr
    assert result.returncode == 2, result.stderr
    return result.stderr


ONE_TARGET = f"targets:\n  - name: a\n    dsn: {EXAMPLE_DSN}\n"


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (
            "collection:\n  statement_timeout: inf\n" + ONE_TARGET,
            "collection.statement_timeout: inf is not a finite duration",
        ),
        (
            "collection:\n  lock_timeout: .inf\n" + ONE_TARGET,
            "collection.lock_timeout: inf is not a finite duration",
        ),
        (
            "collection:\n  connect_timeout: .nan\n" + ONE_TARGET,
            "collection.connect_timeout: nan is not a finite duration",
        ),
        (
            "collection:\n  min_interval: 1e12\n" + ONE_TARGET,
            "collection.min_interval: must be at most 1h",
        ),
        (
            "collection:\n  reconnect_backoff_max: 30d\n" + ONE_TARGET,
            "collection.reconnect_backoff_max: must be at most 1h",
        ),
        (
            "collection:\n  statement_timeout: 11m\n" + ONE_TARGET,
            "collection.statement_timeout: must be at most 10m",
        ),
        # PostgreSQL would round this to 0 ms, which turns the timeout off.
        (
            "collection:\n  lock_timeout: 0.0001\n" + ONE_TARGET,
            "collection.lock_timeout: must be at least 1ms",
        ),
        (
            ONE_TARGET + "    collection: {connect_timeout: true}\n",
            "targets[0] (a).collection.connect_timeout: True is not a duration",
        ),
        (
            ONE_TARGET + "    dsn: host=other\n",
            "targets[0] (a): key 'dsn' is given twice (lines 3 and 4)",
        ),
        (
            "web:\n  telemetry_path: /a\nlog: {level: info}\nweb:\n  telemetry_path: /b\n"
            + ONE_TARGET,
            "(top level): key 'web' is given twice (lines 1 and 4)",
        ),
        (
            ONE_TARGET + "    collection:\n      application_name_rewrites:\n"
            "        - {pattern: 'a', replacement: 'b', pattern: 'c'}\n",
            "targets[0] (a).collection.application_name_rewrites[0]: key 'pattern' is given twice",
        ),
        ("a: " + "[" * 50_000 + "]" * 50_000 + "\n" + ONE_TARGET, "nest"),
        ("a: " + "[" * 65 + "]" * 65 + "\n" + ONE_TARGET, "nested more than 64 levels deep"),
        (
            "".join(f"{' ' * i}k{i}:\n" for i in range(2_000)) + "\n" + ONE_TARGET,
            "line 65, column 65: nested more than 64 levels deep",
        ),
        ("a:\n" + "- " * 50_000 + "x\n" + ONE_TARGET, "nested more than 64 levels deep"),
        ("web:\n  telemetry_path: /health\n" + ONE_TARGET, "web.telemetry_path: '/health' is"),
        ("web:\n  telemetry_path: /\n" + ONE_TARGET, "web.telemetry_path: '/' is taken"),
        ("web:\n  telemetry_path: /probe\n" + ONE_TARGET, "'/probe' is taken"),
        ("web:\n  telemetry_path: /-/reload\n" + ONE_TARGET, "'/-/reload' is taken"),
        ("web:\n  telemetry_path: /m?x=1\n" + ONE_TARGET, "'/m?x=1' is not a path"),
        ("web:\n  telemetry_path: '/m#x'\n" + ONE_TARGET, "'/m#x' is not a path"),
        (
            ONE_TARGET + "    collection:\n      application_name_rewrites:\n"
            "        - {pattern: '(?=web)(.+)', replacement: '\\1'}\n",
            "targets[0] (a).collection.application_name_rewrites[0].pattern: bad regular "
            "expression",
        ),
        (
            ONE_TARGET + "    collection:\n      application_name_rewrites:\n"
            "        - {pattern: '(\\w+)-\\1', replacement: '\\1'}\n",
            "targets[0] (a).collection.application_name_rewrites[0].pattern: bad regular "
            "expression",
        ),
        (
            ONE_TARGET + "    collection:\n      application_name_rewrites:\n"
            "        - {pattern: '(.+)-x', replacement: '\\9'}\n",
            "application_name_rewrites[0].replacement: \\9 refers to group 9",
        ),
        (
            ONE_TARGET + "    collection:\n      application_name_rewrites:\n"
            "        - {pattern: '(.+)-x', replacement: '\\g<app>'}\n",
            "application_name_rewrites[0].replacement: \\g<app>: the pattern has no group named",
        ),
    ],
)
def test_the_check_refuses_what_cannot_run(
    tmp_path: Path, content: str, expected: str, cli: Cli
) -> None:
    path = write_config(tmp_path, content)
    message = _refused(cli, "--config.file", str(path))
    assert f"{path}: " in message
    assert expected in message
    # A reload reads the file the same way, and refuses it only on a ConfigError.
    with pytest.raises(ConfigError, match=re.escape(expected)):
        load_config_file(path)


def test_a_file_too_big_is_refused_before_it_is_parsed(tmp_path: Path, cli: Cli) -> None:
    path = tmp_path / "huge.yaml"
    with path.open("w") as file:
        file.write(ONE_TARGET)
        file.write("#" * MAX_FILE_BYTES)
    started = time.monotonic()
    message = _refused(cli, "--config.file", str(path))
    assert f"{path}: larger than 8 MiB" in message
    assert time.monotonic() - started < 10


def test_a_file_that_is_not_utf8_is_named(tmp_path: Path, cli: Cli) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(ONE_TARGET.encode() + "# café\n".encode("latin-1"))
    offset = len(ONE_TARGET) + len("# caf")
    assert f"{path}: not UTF-8 text (byte 0xe9 at offset {offset})" in _refused(
        cli, "--config.file", str(path)
    )


def test_anchors_and_merge_keys_are_not_duplicates(tmp_path: Path) -> None:
    path = write_config(
        tmp_path,
        "collection: &fast {statement_timeout: 1ms, min_interval: 1h}\n"
        f"targets:\n  - {{name: a, dsn: '{EXAMPLE_DSN}', collection: *fast}}\n"
        f"  - {{name: b, dsn: '{EXAMPLE_DSN}', collection: {{<<: *fast, min_interval: 1s}}}}\n",
    )
    config = load_config_file(path)
    a, b = (t.collection for t in config.targets)
    assert (a.statement_timeout, a.min_interval, b.min_interval) == (0.001, 3600, 1)


def test_duration_bounds_apply_to_flags_and_variables(cli: Cli) -> None:
    message = _refused(cli, "--dsn", EXAMPLE_DSN, "--collection.statement-timeout", "1h")
    assert "flag --collection.statement-timeout: must be at most 10m" in message
    message = _refused(cli, "--dsn", EXAMPLE_DSN, "--collection.lock-timeout", "inf")
    assert "flag --collection.lock-timeout: inf is not a finite duration" in message
    message = _refused(cli, PG_ADVISORY_EXPORTER_MIN_INTERVAL="30d", DATA_SOURCE_NAME=EXAMPLE_DSN)
    assert "environment variable PG_ADVISORY_EXPORTER_MIN_INTERVAL: must be at most 1h" in message
    message = _refused(
        cli, PG_ADVISORY_EXPORTER_LOCK_TIMEOUT="0.0001", DATA_SOURCE_NAME=EXAMPLE_DSN
    )
    assert "environment variable PG_ADVISORY_EXPORTER_LOCK_TIMEOUT: must be at least 1ms" in message


def test_telemetry_path_flag_cannot_hide_another_endpoint(cli: Cli) -> None:
    message = _refused(cli, "--dsn", EXAMPLE_DSN, "--web.telemetry-path", "/health")
    assert "flag --web.telemetry-path: '/health' is taken by another endpoint" in message


LEAKY_DSN = "host=db user=monitor password=Leak Part2xQ"


def test_no_piece_of_a_password_in_a_malformed_dsn_message(tmp_path: Path, cli: Cli) -> None:
    path = write_config(tmp_path, {"targets": [{"name": "a", "dsn": LEAKY_DSN}]})
    messages = {
        "flag --dsn": _refused(cli, "--dsn", LEAKY_DSN),
        "environment variable PG_ADVISORY_EXPORTER_DSN": _refused(
            cli, PG_ADVISORY_EXPORTER_DSN=LEAKY_DSN
        ),
        "environment variable DATA_SOURCE_NAME": _refused(cli, DATA_SOURCE_NAME=LEAKY_DSN),
        f"{path}: targets[0] (a).dsn": _refused(cli, "--config.file", str(path)),
    }
    for source, message in messages.items():
        assert f'{source}: malformed DSN: missing "=" after' in message
        assert "password='a b'" in message  # how to write it instead
        assert "Leak" not in message
        assert "Part2xQ" not in message


@pytest.mark.parametrize(
    "dsn",
    [
        'host=db password=L3 Q"Part2xQ',  # the piece libpq quotes holds a quote itself
        "host=db password=Leak Part2xQ=",
        "postgresql://monitor:Leak%zzPart2xQ@db/postgres",
        "postgresql://monitor@db/postgres?password=Leak&Part2xQ",
    ],
)
def test_no_piece_of_a_password_whatever_libpq_quotes(dsn: str) -> None:
    with pytest.raises(ConfigError) as refused:
        load({"dsn": dsn})
    assert "malformed DSN" in str(refused.value)
    assert "Part2xQ" not in str(refused.value)


def test_a_lower_case_variable_is_named_as_it_is_set(cli: Cli) -> None:
    message = _refused(cli, data_source_name=LEAKY_DSN)
    assert "environment variable data_source_name: malformed DSN" in message
    assert "Part2xQ" not in message
    message = _refused(
        cli, DATA_SOURCE_NAME=EXAMPLE_DSN, pg_advisory_exporter_statement_timeout="x"
    )
    assert "environment variable pg_advisory_exporter_statement_timeout: 'x' is not" in message


def test_the_runtime_gets_every_setting_resolved(tmp_path: Path) -> None:
    # The file's model leaves out what its top level or the flags give; the runtime's has it.
    path = write_config(
        tmp_path,
        "catalog: false\nlocks_page: {query_text: true}\ncollection: {min_interval: 1m}\n"
        f"targets:\n  - {{name: a, dsn: '{EXAMPLE_DSN}', locks_page: {{reuse_for: 1s}}}}\n",
    )
    (target,) = load_config_file(path, statement_timeout="2s").targets
    assert (target.collection.min_interval, target.collection.statement_timeout) == (60, 2)
    assert target.catalog is False
    assert (target.locks_page.query_text, target.locks_page.reuse_for) == (True, 1)
    # Only "no password file" and "no server log" may be absent: anything else optional
    # would be left to assert.
    optional = {
        name
        for name, field in TargetSettings.model_fields.items()
        if type(None) in typing.get_args(field.annotation)
    }
    assert optional == {"password_file", "server_log"}


def test_the_default_target_reads_the_server_log_the_flags_give(tmp_path: Path) -> None:
    (target,) = load(
        {"dsn": EXAMPLE_DSN, "server_log_path": str(tmp_path), "server_log_format": "csvlog"}
    ).targets
    assert target.server_log is not None
    assert (target.server_log.path, target.server_log.format) == (tmp_path, "csvlog")
    assert target.server_log.line_prefix == "%m [%p] "
    # Without a path no log is read, whatever else is given.
    (target,) = load({"dsn": EXAMPLE_DSN, "server_log_format": "csvlog"}).targets
    assert target.server_log is None


def test_a_file_gives_each_target_its_own_server_log(tmp_path: Path) -> None:
    document: Config = {
        "targets": [
            {"name": "a", "dsn": EXAMPLE_DSN, "server_log": {"path": "/var/log/a"}},
            {"name": "b", "dsn": EXAMPLE_DSN, "server_log": {"format": "jsonlog"}},
        ]
    }
    a, b = load_config(tmp_path, document).targets
    assert a.server_log is not None
    assert a.server_log.path == Path("/var/log/a")
    assert b.server_log is None
    with pytest.raises(ConfigError, match=r"--server-log.path: .*give each target its own"):
        load_config(tmp_path, document, server_log_path="/var/log/c")


def test_one_server_log_is_read_by_one_target(tmp_path: Path) -> None:
    log = {"path": "/var/log/postgresql", "format": "csvlog"}
    document: Config = {
        "targets": [
            {"name": "a", "dsn": EXAMPLE_DSN, "server_log": log},
            {"name": "b", "dsn": EXAMPLE_DSN, "server_log": {**log, "format": "stderr"}},
        ]
    }
    assert len(load_config(tmp_path, document).targets) == 2  # other files of one folder
    document["targets"].append({"name": "c", "dsn": EXAMPLE_DSN, "server_log": log})
    with pytest.raises(
        ConfigError,
        match=re.escape(
            "targets: targets[2] (c).server_log: '/var/log/postgresql (csvlog)' is used twice: "
            "targets[0] (a) reads it too"
        ),
    ):
        load_config(tmp_path, document)


def test_one_server_log_under_two_spellings_or_in_its_folder_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "log"
    folder.mkdir()
    (tmp_path / "link").symlink_to(folder)

    def targets(*paths: Path) -> Config:
        return {
            "targets": [
                {"name": f"t{n}", "dsn": EXAMPLE_DSN, "server_log": {"path": str(path)}}
                for n, path in enumerate(paths)
            ]
        }

    for second in (tmp_path / "link", folder / ".." / "log"):
        with pytest.raises(
            ConfigError, match=r"targets\[1\] \(t1\).server_log: '.*' is used twice"
        ):
            load_config(tmp_path, targets(folder, second))
    with pytest.raises(ConfigError, match=r"targets\[0\] \(t0\)'s .* are one log: one holds"):
        load_config(tmp_path, targets(folder / "postgresql.log", folder))
    assert len(load_config(tmp_path, targets(folder, tmp_path / "other")).targets) == 2
