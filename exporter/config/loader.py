"""Loading the configuration: the settings from their sources (config/sources.py), the file's
targets and auth modules over them, checked as a whole and resolved into what the runtime
reads (config/settings.py)."""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from pg_advisory_exporter.config.collection import CollectionSettings
from pg_advisory_exporter.config.dsn import password_file_problem
from pg_advisory_exporter.config.exporter_settings import ShardConfig
from pg_advisory_exporter.config.model import FileConfig
from pg_advisory_exporter.config.settings import (
    AuthModuleSettings,
    Config,
    Settings,
    TargetSettings,
    same_server_notes,
)
from pg_advisory_exporter.config.sources import (
    BY_PATH,
    ENV_PREFIX,
    FileBlocks,
    Flags,
    Variables,
    origin,
    settings_from,
)
from pg_advisory_exporter.config.targets import (
    DEFAULT_TARGET,
    AuthModuleConfig,
    ServerLogSettings,
    TargetConfig,
)
from pg_advisory_exporter.fleet.sharding import Shard, ordinal_of
from pg_advisory_exporter.keys.registry import check_configs
from pg_advisory_exporter.validation import ConfigError, step
from pg_advisory_exporter.yaml_file import read_model


def read_file(path: Path) -> FileConfig:
    """The configuration file, its model checked and what spans its blocks too."""
    file = read_model(
        path, FileConfig, expected="a mapping with a 'targets' list", if_empty=lambda: None
    )
    for i, target in enumerate(file.targets):
        try:
            check_configs(file.keys + target.keys)
        except ValueError as exc:
            raise ConfigError(f"{path}: {step('targets', i, target.name)}.keys: {exc}") from None
    if not file.targets and not file.auth_modules:
        raise ConfigError(
            f"{path}: targets: list at least one server, or give auth_modules for the servers "
            "that probes name"
        )
    for name, module in file.auth_modules.items():
        try:
            check_configs(file.keys + module.keys)
        except ValueError as exc:
            raise ConfigError(f"{path}: auth_modules.{name}.keys: {exc}") from None
    return file


def _given(model: BaseModel) -> dict[str, Any]:
    """The fields that were set, as they are (model_dump would turn models into dicts)."""
    return {name: getattr(model, name) for name in model.model_fields_set}


def _shard(chosen: ShardConfig, origin: Callable[[str], str]) -> Shard:
    """The shard, its index resolved; origin(name) says where a setting came from."""
    index = chosen.index
    if index == "auto":
        try:
            index = ordinal_of(socket.gethostname())
        except ValueError as exc:
            raise ConfigError(f"{origin('index')}: auto: {exc}") from None
    if index >= chosen.total:
        raise ConfigError(
            f"{origin('index')}: there is no shard {index}: {origin('total')} makes "
            f"{chosen.total}, numbered 0 to {chosen.total - 1}"
        )
    return Shard(index=index, total=chosen.total)


def _over_top_level(
    file: FileConfig, defaults: CollectionSettings, own: TargetConfig | AuthModuleConfig
) -> dict[str, Any]:
    """A target's or an auth module's collection settings, keys and catalog: its own, over
    (or, for keys, after) what the file's top level, the variables and the flags give."""
    return {
        "collection": defaults.model_copy(update=_given(own.collection) if own.collection else {}),
        "keys": file.keys + own.keys,
        "catalog": file.catalog if own.catalog is None else own.catalog,
    }


def _sources(flags: Mapping[str, object]) -> tuple[Flags, Variables, FileBlocks]:
    return Flags(Settings, flags), Variables(Settings), FileBlocks(Settings, read_file)


def load(flags: Mapping[str, object]) -> Config:
    """The configuration from the flags given (argparse's results by dest, None where not
    given), the environment and the file they name, merged in that precedence."""
    sources = _sources(flags)
    settings = settings_from(*sources)
    file = _file(settings, sources[2].file)
    given_log = next(
        (
            given
            for name in ServerLogSettings.model_fields
            if (given := origin(sources, ("server_log", name))) is not None
        ),
        None,
    )
    if given_log is not None and sources[2].file is not None:
        raise ConfigError(
            f"{given_log}: the server_log flags and variables are the default target's (with "
            "--dsn); in a configuration file, give each target its own server_log block"
        )

    def shard_origin(name: str) -> str:
        given = origin(sources, ("shard", name))
        return given or f"the default of {BY_PATH['shard', name].flag}"

    defaults = settings.collection  # for every target: a target's own block wins
    return Config(
        web=settings.web,
        log=settings.log,
        targets=tuple(
            TargetSettings(
                name=target.name,
                dsn=target.dsn,
                password_file=target.password_file,
                **_over_top_level(file, defaults, target),
                poolers=target.poolers,
                locks_page=file.locks_page.model_copy(update=_given(target.locks_page)),
                server_log=target.server_log if _reads_log(target.server_log) else None,
            )
            for target in file.targets
        ),
        max_parallel_collections=file.max_parallel_collections,
        config_file=settings.config.file,
        shard=_shard(settings.shard, shard_origin),
        notes=same_server_notes(settings.config.file, file.targets),
        warnings=_unreadable_secrets(settings.config.file, file),
        auth_modules={
            name: AuthModuleSettings(
                name=name,
                user=module.user,
                password_file=module.password_file,
                dbname=module.dbname,
                options=module.options,
                **_over_top_level(file, defaults, module),
                allowed_targets=module.allowed_targets,
            )
            for name, module in file.auth_modules.items()
        },
        discovered_targets=file.discovered_targets,
    )


def _unreadable_secrets(path: Path | None, file: FileConfig) -> tuple[str, ...]:
    """Each password file that cannot be read now, located, and what that does: not an
    error of the configuration (a Secret may be mounted later), but its target, pooler or
    module fails until the file can be read, as when one vanishes while running."""
    holders: list[tuple[str, Path | None, str]] = []
    for i, target in enumerate(file.targets):
        at = step("targets", i, target.name)
        holders.append((at, target.password_file, "the target is down"))
        holders += [
            (step(f"{at}.poolers", j, pooler.name), pooler.password_file, "the pooler is down")
            for j, pooler in enumerate(target.poolers)
        ]
    holders += [
        (f"auth_modules.{name}", module.password_file, "its probes fail")
        for name, module in file.auth_modules.items()
    ]
    return tuple(
        f"{path}: {at}.password_file: {problem}; {effect} until it can be read"
        for at, password_file, effect in holders
        if (problem := password_file_problem(password_file))
    )


def _reads_log(settings: ServerLogSettings | None) -> bool:
    return settings is not None and settings.path is not None


def _file(settings: Settings, read: FileConfig | None) -> FileConfig:
    """The file read, or the one target of the DSN; ConfigError if both or neither."""
    if settings.config.file is not None and settings.dsn is not None:
        raise ConfigError(
            "both a DSN and --config.file were given: list the server in the file's targets, "
            "or leave the file out"
        )
    if read is not None:
        return read
    if settings.dsn is not None:
        target = TargetConfig(name=DEFAULT_TARGET, dsn=settings.dsn, server_log=settings.server_log)
        return FileConfig(targets=(target,))
    raise ConfigError(
        f"no server to watch: give --dsn or --config.file, or set {ENV_PREFIX}DSN or "
        "DATA_SOURCE_NAME"
    )
