"""Where each setting comes from, carried by pydantic-settings: `Settings` (config/settings.py)
defines every setting once (a field of a block), and its sources, the flags, the environment
(the published names and their aliases) and the file's top level, in that precedence, are
merged and validated by pydantic-settings; an error names the flag, the variable or the place
in the file it came from.

The flags are parsed by argparse (cli.py) and given here as they came: pydantic-settings' own
command line source refuses a flag after the command (`check --dsn ...`, as the docs show)
and would spell `--web.config.file` as `--web.config-file` (docs/architecture.md).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import AliasChoices, BaseModel, Field, ValidationError, create_model
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from pg_advisory_exporter.config.markers import FileOnly, Spelled
from pg_advisory_exporter.config.model import FileConfig
from pg_advisory_exporter.config.settings import Settings, sourced
from pg_advisory_exporter.durations import PARSE_DURATION, format_duration
from pg_advisory_exporter.validation import ConfigError, describe_error, location

ENV_PREFIX = "PG_ADVISORY_EXPORTER_"


# How a block's variables are named after the prefix. The collection's have no block name
# in them (PG_ADVISORY_EXPORTER_MIN_INTERVAL), as they were first published.
_VARIABLE_INFIX = {
    "config": "config_",
    "web": "web_",
    "log": "log_",
    "collection": "",
    "shard": "shard_",
    "server_log": "server_log_",
}
# postgres_exporter's variable, so that its deployments keep working.
_DSN_VARIABLES = (f"{ENV_PREFIX}DSN", "DATA_SOURCE_NAME")


@dataclass(frozen=True)
class Setting:
    """One setting of Settings; its flag, variables and help follow from its field."""

    block: str | None  # the Settings block, which is also the file's; None for the DSN
    name: str  # the field in that block
    field: FieldInfo

    @property
    def path(self) -> tuple[str, ...]:
        return (self.name,) if self.block is None else (self.block, self.name)

    @property
    def flag(self) -> str:
        """--dsn, --config.file, --collection.min-interval."""
        spelled = next((m.flag for m in self.field.metadata if isinstance(m, Spelled)), None)
        return spelled or "--" + ".".join(self.path).replace("_", "-")

    @property
    def dest(self) -> str:
        """The key in argparse's results: the variable without the prefix."""
        return self.name if self.block is None else _VARIABLE_INFIX[self.block] + self.name

    @property
    def variables(self) -> tuple[str, ...]:
        """The variables that set it, the first one winning when several are set."""
        own = f"{ENV_PREFIX}{self.dest.upper()}"
        return _DSN_VARIABLES if own == _DSN_VARIABLES[0] else (own,)

    @property
    def switch(self) -> bool:
        """A flag that takes no value (--web.enable-lifecycle); its variable takes true/false."""
        return self.field.annotation is bool

    @property
    def default(self) -> str:
        """The default as a person writes it ("5s", ":9846", "off"); empty when there is none."""
        value = self.field.default
        if value is None:
            return ""
        if self.switch:
            return "on" if value else "off"
        return format_duration(value) if PARSE_DURATION in self.field.metadata else str(value)

    @property
    def help(self) -> str:
        default = f"default {self.default}; " if self.default else ""
        return f"{self.field.description} ({default}variable {' or '.join(self.variables)})"


def _settings() -> tuple[Setting, ...]:
    found: list[Setting] = []
    for name, field in Settings.model_fields.items():
        block = field.annotation
        if not (isinstance(block, type) and issubclass(block, BaseModel)):
            found.append(Setting(None, name, field))
            continue
        found.extend(
            Setting(name, inner, info)
            for inner, info in block.model_fields.items()
            if not any(isinstance(mark, FileOnly) for mark in info.metadata)
        )
    return tuple(found)


# In the order --help and docs/configuration.md list them.
SETTINGS = _settings()
BY_DEST = {setting.dest: setting for setting in SETTINGS}
BY_PATH = {setting.path: setting for setting in SETTINGS}

SettingPath = tuple[str, ...]  # ("web", "listen_address"), or ("dsn",)


def _nested(values: Mapping[SettingPath, Any]) -> dict[str, Any]:
    """{("web", "listen_address"): v} as {"web": {"listen_address": v}}."""
    nested: dict[str, Any] = {}
    for path, value in values.items():
        *blocks, name = path
        inner = nested
        for block in blocks:
            inner = inner.setdefault(block, {})
        inner[name] = value
    return nested


class Given(PydanticBaseSettingsSource):
    """A source of Settings: the values one place gives, by setting, and where each came from
    (what an error about it names)."""

    def __init__(self, settings_cls: type[BaseSettings]) -> None:
        super().__init__(settings_cls)
        self.values: dict[SettingPath, Any] = {}
        self.origins: dict[SettingPath, str] = {}

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # __call__ gives them all at once

    def __call__(self) -> dict[str, Any]:
        return _nested(self.values)

    def origin(self, loc: tuple[int | str, ...]) -> str | None:
        """Where the value at `loc` (a validation error's) came from, if it came from here."""
        return next(
            (origin for path, origin in self.origins.items() if loc[: len(path)] == path), None
        )


class Flags(Given):
    """The flags that were given, by argparse's dest (the others are None there)."""

    def __init__(self, settings_cls: type[BaseSettings], given: Mapping[str, object]) -> None:
        super().__init__(settings_cls)
        for dest, value in given.items():
            if value is not None:
                setting = BY_DEST[dest]
                self.values[setting.path] = value
                self.origins[setting.path] = f"flag {setting.flag}"


class _Environment(BaseSettings):
    """The variables of SETTINGS as text, one field each (see _VARIABLES): pydantic-settings
    finds them in any case, as they always were read, and takes the first of several names
    that is set (PG_ADVISORY_EXPORTER_DSN before DATA_SOURCE_NAME)."""

    model_config = SettingsConfigDict(case_sensitive=False, extra="ignore", frozen=True)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (env_settings,)


_VARIABLE_FIELDS: dict[str, Any] = {
    setting.dest: (
        str | None,
        Field(default=None, validation_alias=AliasChoices(*setting.variables)),
    )
    for setting in SETTINGS
}
_VARIABLES = create_model("_Variables", __base__=_Environment, **_VARIABLE_FIELDS)


def _spelled(setting: Setting) -> str:
    """The variable that gave a setting, as it is set: an error names what the user wrote.

    Of two spellings of one name, the later one in the environment is the one
    pydantic-settings read.
    """
    spellings = ([key for key in os.environ if key.upper() == name] for name in setting.variables)
    return next((keys[-1] for keys in spellings if keys), setting.variables[0])


class Variables(Given):
    """The PG_ADVISORY_EXPORTER_* variables and DATA_SOURCE_NAME that are set, as text."""

    def __init__(self, settings_cls: type[BaseSettings]) -> None:
        super().__init__(settings_cls)
        variables = _VARIABLES()
        for dest in variables.model_fields_set:
            setting = BY_DEST[dest]
            self.values[setting.path] = getattr(variables, dest)
            self.origins[setting.path] = f"environment variable {_spelled(setting)}"


class FileBlocks(Given):
    """The file's top-level blocks (web, log, collection, shard), as far as it gives them:
    read from the file that the flags or variables name (pydantic-settings' current state
    of the sources before it), with `read`, which checks the whole file."""

    def __init__(
        self, settings_cls: type[BaseSettings], read: Callable[[Path], FileConfig]
    ) -> None:
        super().__init__(settings_cls)
        self._read = read
        self.path: Path | None = None
        self.file: FileConfig | None = None

    def __call__(self) -> dict[str, Any]:
        before = self.current_state
        named = before.get("config", {}).get("file")
        if named is None or before.get("dsn") is not None:  # no file, or refused by load()
            return {}
        self.path = Path(named)
        self.file = file = self._read(self.path)
        for block in ("web", "log", "collection", "shard"):
            given = getattr(file, block)
            for name in given.model_fields_set:
                self.values[block, name] = getattr(given, name)
                self.origins[block, name] = f"{self.path}: {block}.{name}"
        return super().__call__()


def settings_from(*sources: Given) -> Settings:
    """The settings from these sources, the first winning; ConfigError names where each bad
    value came from."""
    with sourced(*sources):
        try:
            return Settings()
        except ValidationError as exc:
            raise ConfigError("\n".join(_located(e, sources) for e in exc.errors())) from None


def origin(sources: Iterable[Given], loc: tuple[int | str, ...]) -> str | None:
    """Where the value at `loc` came from: the first source, in precedence, that gave it."""
    return next((found for source in sources if (found := source.origin(loc)) is not None), None)


def _located(error: Mapping[str, Any], sources: tuple[Given, ...]) -> str:
    loc = tuple(error["loc"])
    return f"{origin(sources, loc) or location(loc)}: {describe_error(error)}"
