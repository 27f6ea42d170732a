"""The settings: every one that a flag, a variable or the file's top level gives (`Settings`,
from the sources of config/sources.py), and what the runtime reads, every one resolved (load()
makes them from the file, the environment and the flags): a target's, an auth module's, and
the whole exporter's."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

from psycopg.conninfo import make_conninfo
from pydantic import Field
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from pg_advisory_exporter.config.collection import CollectionSettings
from pg_advisory_exporter.config.dsn import Dsn, server_of, with_password
from pg_advisory_exporter.config.exporter_settings import LogConfig, ShardConfig, WebConfig
from pg_advisory_exporter.config.model import DEFAULT_PARALLEL_COLLECTIONS
from pg_advisory_exporter.config.targets import (
    DiscoveredTargetsSettings,
    LocksPageSettings,
    PoolerConfig,
    ServerLogSettings,
    TargetConfig,
)
from pg_advisory_exporter.fleet.discovery import AllowList, TargetAddress, parse_allowed
from pg_advisory_exporter.fleet.resolver import IpAddress
from pg_advisory_exporter.fleet.sharding import Shard
from pg_advisory_exporter.keys.catalog import CatalogChoice, selected_idle_by_design
from pg_advisory_exporter.keys.idle_by_design import IdleByDesign
from pg_advisory_exporter.keys.key_config import KeyConfig
from pg_advisory_exporter.validation import Strict, step


class ConfigFileSettings(Strict):
    """Where the file is (--config.file): given by a flag or a variable, never by the file."""

    file: Path | None = Field(
        default=None, description="YAML file with targets and collection settings"
    )


class Settings(BaseSettings):
    """Every setting a flag, a variable or the file's top level gives, merged in that
    precedence by pydantic-settings (settings_customise_sources), defaults last.

    Each field of its blocks is a setting with a flag and a variable (SETTINGS) unless
    marked FileOnly, which only the file sets.
    """

    model_config = SettingsConfigDict(extra="forbid", frozen=True)

    dsn: Dsn | None = Field(
        default=None,
        repr=False,
        description="PostgreSQL connection string of the one server to watch, target name "
        "'default'; leave the password out, since ps shows every argument: use PGPASSFILE, "
        "the variable, or password_file in a configuration file",
    )
    config: ConfigFileSettings = ConfigFileSettings()
    web: WebConfig = WebConfig()
    log: LogConfig = LogConfig()
    collection: CollectionSettings = CollectionSettings()
    shard: ShardConfig = ShardConfig()
    # The default target's (--dsn): in a file, each target has its own.
    server_log: ServerLogSettings = ServerLogSettings()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The flags, then the variables, then the file: load() gives this loading's own.
        # No .env file or secrets folder: the published variables only.
        return _SOURCES.get()


# The sources of the Settings being made (sources.settings_from); none outside of that:
# defaults.
_SOURCES: ContextVar[tuple[PydanticBaseSettingsSource, ...]] = ContextVar("sources", default=())


@contextmanager
def sourced(*sources: PydanticBaseSettingsSource) -> Iterator[None]:
    """Settings made within take their values from these sources, the first winning."""
    token = _SOURCES.set(sources)
    try:
        yield
    finally:
        _SOURCES.reset(token)


class TargetSettings(Strict):
    """One target as the runtime reads it: every setting resolved, none left to look up.

    load() builds it from a TargetConfig and what the file's top level, the variables and
    the flags give; the runtime (target, connection, forensics, check) takes only this.
    """

    name: str
    dsn: str = Field(repr=False)
    password_file: Path | None = None
    collection: CollectionSettings
    keys: tuple[KeyConfig, ...] = ()  # the file's top-level keys, then the target's own
    catalog: CatalogChoice
    poolers: tuple[PoolerConfig, ...] = ()
    locks_page: LocksPageSettings = LocksPageSettings()
    server_log: ServerLogSettings | None = None  # None: the server's log is not read

    @functools.cached_property
    def idle_by_design(self) -> IdleByDesign:
        """The applications idle by design in effect: the target's configured entries, then
        the catalog's it keeps (for the series, /locks and check alike)."""
        return IdleByDesign.of(
            self.collection.idle_by_design, selected_idle_by_design(self.catalog)
        )

    def conninfo(self) -> str:
        """The DSN with the password from password_file, read now so that rotation works."""
        return with_password(self.dsn, self.password_file)


class AuthModuleSettings(Strict):
    """An auth module as the runtime reads it, every setting resolved (load() makes it)."""

    name: str
    user: str
    password_file: Path | None = None
    dbname: str
    options: dict[str, str] = Field(default_factory=dict)
    collection: CollectionSettings
    keys: tuple[KeyConfig, ...] = ()  # the file's top-level keys, then the module's own
    catalog: CatalogChoice
    allowed_targets: tuple[str, ...]

    def allow_list(self) -> AllowList:
        return AllowList([parse_allowed(entry) for entry in self.allowed_targets])

    def target(self, address: TargetAddress, pinned: IpAddress) -> TargetSettings:
        """The settings of a discovered target's server (named HOST:PORT): connected to the
        checked address `pinned` (libpq's hostaddr, so that nothing resolves the name again)
        while TLS verifies the name, and to the module's `dbname` whatever database the
        probe names: pg_locks shows the whole server from any of them, and no database the
        exporter connects to is one that a DROP DATABASE would find in use."""
        dsn = make_conninfo(
            "",
            host=str(address.host),
            hostaddr=str(pinned) if isinstance(address.host, str) else None,
            port=address.port,
            dbname=self.dbname,
            user=self.user,
            **self.options,
        )
        return TargetSettings(
            name=address.server,
            dsn=dsn,
            password_file=self.password_file,
            collection=self.collection,
            keys=self.keys,
            catalog=self.catalog,
        )


@dataclass(frozen=True)
class Config:
    """The settings the daemon runs with, all sources merged."""

    web: WebConfig
    log: LogConfig
    targets: tuple[TargetSettings, ...]
    max_parallel_collections: int = DEFAULT_PARALLEL_COLLECTIONS
    # The file read (--config.file), if any: its reloads are reported in series.
    config_file: Path | None = None
    # The daemon collects only the targets of its shard; `check` reads them all.
    shard: Shard = dataclasses.field(default_factory=Shard)
    auth_modules: Mapping[str, AuthModuleSettings] = dataclasses.field(default_factory=dict)
    discovered_targets: DiscoveredTargetsSettings = dataclasses.field(
        default_factory=DiscoveredTargetsSettings
    )
    # What is valid but worth a word, each located: --config.check prints them, the daemon
    # logs them when it starts and at each reload.
    notes: tuple[str, ...] = ()
    # What the running exporter reports as a target's (or pooler's, or module's) failure,
    # each located (a password file that cannot be read now): --config.check warns of them.
    warnings: tuple[str, ...] = ()


# Targets named in a note about one server, before "and N more".
_NAMED = 5


def same_server_notes(path: Path | None, targets: Sequence[TargetConfig]) -> tuple[str, ...]:
    """One note per server that several targets name (by host and port, as their DSNs
    write them): it is read once, through the first, which answers for the server."""
    groups: dict[str, list[int]] = {}
    for i, target in enumerate(targets):
        groups.setdefault(server_of(target.dsn), []).append(i)
    notes = []
    for server, indexes in groups.items():
        if len(indexes) < 2:
            continue
        first, others = indexes[0], indexes[1:]
        named = ", ".join(f"{step('targets', i, targets[i].name)}.dsn" for i in others[:_NAMED])
        more = f" and {len(others) - _NAMED} more" if len(others) > _NAMED else ""
        notes.append(
            f"{path}: {named}{more}: the same server as target {targets[first].name!r} "
            f"(targets[{first}], {server}): a target reads every database of its server, so "
            f"it is read once, through {targets[first].name!r} and with its settings; the "
            "others answer pg_advisory_up only"
        )
    return tuple(notes)
