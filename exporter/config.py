"""Configuration from a YAML file, the environment and flags, validated with named sources.

Precedence: flags override environment variables, which override the file. Each source is
validated on its own, so an error names where the bad value came from: the file and the
path inside it, the variable, or the flag.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from .appnames import RewriteRule
from .registry import KeyConfig, check_configs
from .schema import Duration, Strict

DEFAULT_LISTEN_ADDRESS = ":9846"
DEFAULT_TARGET = "default"
DEFAULT_PARALLEL_COLLECTIONS = 16
ENV_PREFIX = "PG_ADVISORY_EXPORTER_"


class ConfigError(Exception):
    """A configuration that cannot be used; the message names the source and the problem."""


class RewriteRuleConfig(Strict):
    """One application_name rewrite: a regular expression and its replacement."""

    pattern: str
    replacement: str

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, pattern: str) -> str:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"bad regular expression {pattern!r}: {exc}") from None
        return pattern

    def rule(self) -> RewriteRule:
        return RewriteRule(re.compile(self.pattern), self.replacement)


class CollectionSettings(Strict):
    """How one server is read; set for all targets, and overridable per target."""

    statement_timeout: Duration = 5.0
    lock_timeout: Duration = 1.0
    connect_timeout: Duration = 3.0
    min_interval: Duration = 5.0
    reconnect_backoff_max: Duration = 30.0
    application_name_limit: int = Field(default=100, ge=1)
    application_name_rewrites: tuple[RewriteRuleConfig, ...] = ()

    @property
    def scrape_wait(self) -> float:
        """How long a scrape waits for a collection before it reports the target down."""
        return self.connect_timeout + self.statement_timeout + 1.0


def _password_in(dsn: str) -> str | None:
    """The password written in a DSN, found without trusting the DSN to parse."""
    uri = re.match(r"^[a-z]+://[^/@:]*:([^@/]*)@", dsn)
    if uri:
        return uri.group(1)
    keyword = re.search(r"password\s*=\s*('(?:[^'\\]|\\.)*'?|\S+)", dsn)
    return keyword.group(1).strip("'") if keyword else None


def redact(message: str, dsn: str) -> str:
    """Remove a DSN and its password from a message (libpq may quote either back)."""
    password = _password_in(dsn)
    message = message.replace(dsn, "<dsn>")
    if password:
        message = message.replace(password, "<password>")
    return message


def _dsn_parameters(dsn: str) -> dict[str, Any]:
    try:
        params = conninfo_to_dict(dsn)
    except Exception as exc:  # psycopg raises ProgrammingError; its text may quote the DSN
        raise ValueError(f"malformed DSN: {redact(str(exc), dsn)}") from None
    port = params.get("port")
    if port is not None and not all(p.isdigit() for p in str(port).split(",")):
        raise ValueError(f"malformed DSN: port {port!r} is not a number")
    return params


def _check_dsn(dsn: str) -> str:
    _dsn_parameters(dsn)
    return dsn


def split_listen_address(address: str) -> tuple[str, int]:
    """("", 9846) from ":9846", ("127.0.0.1", 9846) from "127.0.0.1:9846", IPv6 in brackets."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{address!r} is not host:port (for example :9846 or 127.0.0.1:9846)")
    return host.strip("[]"), int(port)


def _check_listen_address(address: str) -> str:
    split_listen_address(address)
    return address


Dsn = Annotated[str, AfterValidator(_check_dsn)]
ListenAddress = Annotated[str, AfterValidator(_check_listen_address)]
TelemetryPath = Annotated[str, Field(pattern=r"^/\S*$")]
LogLevel = Literal["debug", "info", "warn", "error"]
LogFormat = Literal["logfmt", "json"]


def read_password_file(path: Path) -> str:
    try:
        return path.read_text().rstrip("\r\n")
    except OSError as exc:
        raise ValueError(f"cannot read password_file {path}: {exc.strerror}") from None


class TargetConfig(Strict):
    """One PostgreSQL server to watch."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
    dsn: Dsn = Field(repr=False)
    password_file: Path | None = None
    collection: CollectionSettings | None = None
    keys: tuple[KeyConfig, ...] = ()  # after load(): the file's global keys, then these

    @model_validator(mode="after")
    def _one_password_source(self) -> TargetConfig:
        if self.password_file is None:
            return self
        if _dsn_parameters(self.dsn).get("password"):
            raise ValueError("give the password either in the DSN or in password_file, not both")
        read_password_file(self.password_file)
        return self

    def conninfo(self) -> str:
        """The DSN with the password from password_file, read now so that rotation works."""
        if self.password_file is None:
            return self.dsn
        return make_conninfo(self.dsn, password=read_password_file(self.password_file))


class WebConfig(Strict):
    listen_address: ListenAddress = DEFAULT_LISTEN_ADDRESS
    telemetry_path: TelemetryPath = "/metrics"


class LogConfig(Strict):
    level: LogLevel = "info"
    format: LogFormat = "logfmt"


class FileConfig(Strict):
    """The YAML file."""

    web: WebConfig = WebConfig()
    log: LogConfig = LogConfig()
    collection: CollectionSettings = CollectionSettings()
    keys: tuple[KeyConfig, ...] = ()  # the key registry of every target
    max_parallel_collections: int = Field(default=DEFAULT_PARALLEL_COLLECTIONS, ge=1)
    targets: tuple[TargetConfig, ...] = Field(min_length=1)

    @field_validator("keys")
    @classmethod
    def _keys_unique(cls, keys: tuple[KeyConfig, ...]) -> tuple[KeyConfig, ...]:
        check_configs(keys)
        return keys

    @field_validator("targets")
    @classmethod
    def _unique_names(cls, targets: tuple[TargetConfig, ...]) -> tuple[TargetConfig, ...]:
        seen: set[str] = set()
        for target in targets:
            if target.name in seen:
                raise ValueError(f"target name {target.name!r} is used twice")
            seen.add(target.name)
        return targets


_COLLECTION_OVERRIDES = (
    "statement_timeout",
    "lock_timeout",
    "connect_timeout",
    "min_interval",
    "application_name_limit",
)


class Overrides(BaseModel):
    """Settings that a flag or an environment variable may set; unset ones are None."""

    model_config = ConfigDict(extra="forbid")

    dsn: Dsn | None = Field(default=None, repr=False)
    config_file: Path | None = None
    web_listen_address: ListenAddress | None = None
    web_telemetry_path: TelemetryPath | None = None
    log_level: LogLevel | None = None
    log_format: LogFormat | None = None
    statement_timeout: Duration | None = None
    lock_timeout: Duration | None = None
    connect_timeout: Duration | None = None
    min_interval: Duration | None = None
    application_name_limit: int | None = Field(default=None, ge=1)

    @field_validator("log_level", mode="before")
    @classmethod
    def _warning_is_warn(cls, value: object) -> object:
        return "warn" if value == "warning" else value


_DSN_VARIABLES = (f"{ENV_PREFIX}DSN", "DATA_SOURCE_NAME")


class EnvOverrides(BaseSettings, Overrides):
    """The same settings from PG_ADVISORY_EXPORTER_* variables (and DATA_SOURCE_NAME)."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore")

    dsn: Dsn | None = Field(
        default=None,
        repr=False,
        validation_alias=AliasChoices(*_DSN_VARIABLES),
    )


@dataclass(frozen=True)
class Config:
    """The settings the daemon runs with, all sources merged."""

    web: WebConfig
    log: LogConfig
    targets: tuple[TargetConfig, ...]  # each with its collection settings and keys filled in
    max_parallel_collections: int = DEFAULT_PARALLEL_COLLECTIONS


def location(loc: Sequence[int | str]) -> str:
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or "(top level)"


def describe_error(error: Mapping[str, Any]) -> str:
    if error["type"] == "extra_forbidden":
        return "unknown field"
    if error["type"] == "missing":
        return "required field is missing"
    return str(error["msg"]).removeprefix("Value error, ")


FLAG_NAMES = {
    "dsn": "--dsn",
    "config_file": "--config.file",
    "web_listen_address": "--web.listen-address",
    "web_telemetry_path": "--web.telemetry-path",
    "log_level": "--log.level",
    "log_format": "--log.format",
    "statement_timeout": "--collection.statement-timeout",
    "lock_timeout": "--collection.lock-timeout",
    "connect_timeout": "--collection.connect-timeout",
    "min_interval": "--collection.min-interval",
    "application_name_limit": "--collection.application-name-limit",
}


def read_flags(values: Mapping[str, object]) -> Overrides:
    """Validate the flags that were given (argparse leaves the others as None)."""
    try:
        return Overrides.model_validate({k: v for k, v in values.items() if v is not None})
    except ValidationError as exc:
        raise ConfigError(
            "\n".join(
                f"flag {FLAG_NAMES[str(e['loc'][0])]}: {describe_error(e)}" for e in exc.errors()
            )
        ) from None


def read_environment() -> Overrides:
    """Validate the PG_ADVISORY_EXPORTER_* variables and DATA_SOURCE_NAME that are set."""
    try:
        env = EnvOverrides()
    except ValidationError as exc:
        lines = []
        for error in exc.errors():
            field = str(error["loc"][0])
            if field in _DSN_VARIABLES:  # the error names the first alias, not the one set
                field = next(name for name in _DSN_VARIABLES if name in os.environ)
            name = field if field.isupper() else f"{ENV_PREFIX}{field.upper()}"
            lines.append(f"environment variable {name}: {describe_error(error)}")
        raise ConfigError("\n".join(lines)) from None
    return Overrides.model_validate(env.model_dump(exclude_unset=True))


def _read_file(path: Path) -> FileConfig:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the configuration file: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: (top level): expected a mapping with a 'targets' list")
    try:
        file = FileConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(
            "\n".join(f"{path}: {location(e['loc'])}: {describe_error(e)}" for e in exc.errors())
        ) from None
    for i, target in enumerate(file.targets):
        try:
            check_configs(file.keys + target.keys)
        except ValueError as exc:
            raise ConfigError(f"{path}: targets[{i}].keys: {exc}") from None
    return file


def _given(values: Mapping[str, object]) -> dict[str, object]:
    return {key: value for key, value in values.items() if value is not None}


def load(flags: Overrides, env: Overrides) -> Config:
    """Merge the file (if any), the environment and the flags into one Config."""
    chosen = env.model_copy(update=_given(flags.model_dump()))
    if chosen.config_file is not None and chosen.dsn is not None:
        raise ConfigError(
            "both a DSN and --config.file were given: list the server in the file's targets, "
            "or leave the file out"
        )
    if chosen.config_file is not None:
        file = _read_file(chosen.config_file)
    elif chosen.dsn is not None:
        file = FileConfig(targets=(TargetConfig(name=DEFAULT_TARGET, dsn=chosen.dsn),))
    else:
        raise ConfigError(
            "no server to watch: give --dsn or --config.file, "
            f"or set {ENV_PREFIX}DSN or DATA_SOURCE_NAME"
        )
    web = file.web.model_copy(
        update=_given(
            {
                "listen_address": chosen.web_listen_address,
                "telemetry_path": chosen.web_telemetry_path,
            }
        )
    )
    log = file.log.model_copy(
        update=_given({"level": chosen.log_level, "format": chosen.log_format})
    )
    # Flags and variables set the defaults for every target; a target's own block wins.
    defaults = file.collection.model_copy(
        update=_given({name: getattr(chosen, name) for name in _COLLECTION_OVERRIDES})
    )
    targets = tuple(
        target.model_copy(
            update={
                "collection": defaults.model_copy(
                    update=target.collection.model_dump(exclude_unset=True)
                    if target.collection
                    else {}
                ),
                "keys": file.keys + target.keys,
            }
        )
        for target in file.targets
    )
    return Config(
        web=web,
        log=log,
        targets=targets,
        max_parallel_collections=file.max_parallel_collections,
    )
