"""Configuration from a YAML file, the environment and flags, validated with named sources.

Precedence: flags override environment variables, which override the file. Each source is
validated on its own, so an error names where the bad value came from: the file and the
path inside it, the variable, or the flag.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from psycopg.conninfo import make_conninfo
from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    BeforeValidator,
    Field,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from pg_advisory_exporter.endpoints import RESERVED_PATHS
from pg_advisory_exporter.fleet.discovery import (
    DBNAME_PATTERN,
    AllowList,
    TargetAddress,
    parse_allowed,
)
from pg_advisory_exporter.fleet.resolver import IpAddress
from pg_advisory_exporter.fleet.sharding import Shard, ordinal_of
from pg_advisory_exporter.keys.appnames import RewriteRule, compile_pattern, parse_template
from pg_advisory_exporter.keys.catalog import CatalogChoice
from pg_advisory_exporter.keys.registry import KeyConfig, check_configs
from pg_advisory_exporter.schema import (
    PARSE_DURATION,
    ConfigError,
    Strict,
    describe_error,
    duration_within,
    format_duration,
    port_number,
)
from pg_advisory_exporter.yaml_file import read_model

from .dsn import Dsn, check_password_source, server_of, with_password

DEFAULT_LISTEN_ADDRESS = ":9846"
DEFAULT_TARGET = "default"
DEFAULT_PARALLEL_COLLECTIONS = 16
ENV_PREFIX = "PG_ADVISORY_EXPORTER_"


class RewriteRuleConfig(Strict):
    """One application_name rewrite: an RE2 pattern and its replacement."""

    pattern: str
    replacement: str

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, pattern: str) -> str:
        compile_pattern(pattern)
        return pattern

    @field_validator("replacement")
    @classmethod
    def _groups_exist(cls, replacement: str, info: ValidationInfo) -> str:
        if "pattern" in info.data:  # else the pattern's own error is reported
            parse_template(replacement, compile_pattern(info.data["pattern"]))
        return replacement

    def rule(self) -> RewriteRule:
        return RewriteRule.compile(self.pattern, self.replacement)


# PostgreSQL takes timeouts in whole milliseconds, and 0 turns one off: 1ms is the least.
# The most: a timeout longer than a scrape could ever wait is a typo, and a collection is
# reused for min_interval, so days of it would serve one collection forever.
_LEAST = 0.001
Timeout = Annotated[float, PARSE_DURATION, duration_within(_LEAST, 600.0)]
Interval = Annotated[float, PARSE_DURATION, duration_within(_LEAST, 3600.0)]


class FileOnly:
    """Marks a field that only the file sets: a list of rules has no flag or variable form."""


@dataclass(frozen=True)
class Spelled:
    """Marks a setting whose flag is spelled as the Go exporters spell it (--web.config.file)."""

    flag: str


class CollectionSettings(Strict):
    """How one server is read; set for all targets, and overridable per target.

    Each field is also a flag (--collection.min-interval) and an environment variable
    (PG_ADVISORY_EXPORTER_MIN_INTERVAL), unless it is marked FileOnly: see SETTINGS.
    """

    statement_timeout: Timeout = Field(
        default=5.0, description="server-side limit on one collection"
    )
    lock_timeout: Timeout = Field(
        default=1.0, description="server-side limit on waiting for a catalog lock"
    )
    connect_timeout: Timeout = Field(default=3.0, description="limit on opening a connection")
    min_interval: Interval = Field(
        default=5.0, description="scrapes within this time of the last collection reuse it"
    )
    reconnect_backoff_max: Interval = Field(
        default=30.0,
        description="longest wait between attempts to reach a server that is down",
    )
    application_name_limit: int = Field(
        default=100, ge=1, description="most distinct application_name values per target"
    )
    application_name_rewrites: Annotated[tuple[RewriteRuleConfig, ...], FileOnly()] = Field(
        default=(), description="rewrites of application_name before it becomes a label"
    )

    @property
    def scrape_wait(self) -> float:
        """How long a scrape waits for a collection before it reports the target down."""
        return self.connect_timeout + self.statement_timeout + 1.0


def split_listen_address(address: str) -> tuple[str, int]:
    """("", 9846) from ":9846", ("127.0.0.1", 9846) from "127.0.0.1:9846", IPv6 in brackets."""
    host, sep, port = address.rpartition(":")
    if not sep or not re.fullmatch(r"[0-9]+", port):
        raise ValueError(f"{address!r} is not host:port (for example :9846 or 127.0.0.1:9846)")
    try:
        return host.strip("[]"), port_number(port, lowest=0)
    except ValueError as exc:
        raise ValueError(f"{address!r}: {exc} (0 picks a free port)") from None


def _check_listen_address(address: str) -> str:
    split_listen_address(address)
    return address


def _check_telemetry_path(path: str) -> str:
    # The server routes on the path alone: a query or a fragment in it would never match.
    if not re.fullmatch(r"/[^\s?#]*", path):
        raise ValueError(f"{path!r} is not a path (it starts with / and has no spaces, ? or #)")
    if path in RESERVED_PATHS:
        raise ValueError(f"{path!r} is taken by another endpoint of the exporter")
    return path


ListenAddress = Annotated[str, AfterValidator(_check_listen_address)]
TelemetryPath = Annotated[str, AfterValidator(_check_telemetry_path)]
LogLevel = Literal["debug", "info", "warn", "error"]
LogFormat = Literal["logfmt", "json"]


def _check_external_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(
            f"{url!r} is not an absolute http or https URL (for example "
            "https://exporter.example.com/)"
        )
    if parts.query or parts.fragment:
        raise ValueError(f"{url!r}: the external URL takes no query or fragment")
    return url.rstrip("/")


ExternalUrl = Annotated[str, AfterValidator(_check_external_url)]

_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
_HOST_NAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$"
)


def _check_address(address: str) -> str:
    try:
        ipaddress.ip_network(address, strict=False)
    except ValueError:
        if "/" in address or not _HOST_NAME.match(address) or address.replace(".", "").isdigit():
            raise ValueError(
                f"{address!r} is not an IP address, a CIDR (10.0.0.0/24) or a host name"
            ) from None
    return address


PoolerAddress = Annotated[str, AfterValidator(_check_address)]
PoolMode = Literal["session", "transaction", "statement"]


class PoolerConfig(Strict):
    """A connection pooler (PgBouncer) in front of a target, known by its admin console or,
    where that cannot be reached, by the addresses its server connections come from."""

    name: str = Field(pattern=_NAME)
    # A DSN to the pooler's admin console (its `pgbouncer` database), for a stats_users role.
    admin_dsn: Dsn | None = Field(default=None, repr=False)
    password_file: Path | None = None
    # Hosts or CIDRs matched against pg_stat_activity.client_addr, with the mode of the
    # pools behind them: what the console would have said.
    addresses: tuple[PoolerAddress, ...] = ()
    pool_mode: PoolMode | None = None

    @model_validator(mode="after")
    def _one_source(self) -> PoolerConfig:
        if (self.admin_dsn is None) == (not self.addresses):
            raise ValueError("give exactly one of admin_dsn or addresses")
        if self.admin_dsn is not None:
            if self.pool_mode is not None:
                raise ValueError(
                    "pool_mode goes with addresses: the admin console says each pool's mode"
                )
            check_password_source(self.admin_dsn, self.password_file)
        else:
            if self.pool_mode is None:
                raise ValueError(
                    "addresses need pool_mode (session, transaction or statement): the mode "
                    "of the pools whose server connections come from them"
                )
            if self.password_file is not None:
                raise ValueError("password_file goes with admin_dsn")
        return self

    def conninfo(self) -> str:
        assert self.admin_dsn is not None
        return with_password(self.admin_dsn, self.password_file)


class LocksPageSettings(Strict):
    """The /locks page and `check` of one target: set for all targets, overridable per target."""

    # Query text is personal data in many shops: shown only where a target turns it on.
    query_text: bool = False
    query_text_length: int = Field(default=200, ge=1, le=100_000)
    # A request within this time of the last answer gets that answer: no second read.
    reuse_for: Interval = 5.0


class TargetConfig(Strict):
    """One PostgreSQL server to watch, as the file gives it: what it leaves out comes from
    the file's top level, the variables and the flags (load() makes a TargetSettings)."""

    name: str = Field(pattern=_NAME)
    dsn: Dsn = Field(repr=False)
    password_file: Path | None = None
    # Only the fields given count, over the file's top-level block and the flags.
    collection: CollectionSettings | None = None
    keys: tuple[KeyConfig, ...] = ()  # added to the file's top-level keys
    # The built-in catalog's entries to merge into the registry (catalog.py); not set: the
    # file's top-level `catalog`.
    catalog: CatalogChoice | None = None
    poolers: tuple[PoolerConfig, ...] = ()
    # Only the fields given count, over the file's top-level locks_page.
    locks_page: LocksPageSettings = LocksPageSettings()

    @model_validator(mode="after")
    def _one_password_source(self) -> TargetConfig:
        check_password_source(self.dsn, self.password_file)
        return self

    @field_validator("poolers")
    @classmethod
    def _unique_poolers(cls, poolers: tuple[PoolerConfig, ...]) -> tuple[PoolerConfig, ...]:
        _check_unique("pooler", [pooler.name for pooler in poolers])
        return poolers


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

    def conninfo(self) -> str:
        """The DSN with the password from password_file, read now so that rotation works."""
        return with_password(self.dsn, self.password_file)


def _check_allowed(entry: str) -> str:
    parse_allowed(entry)
    return entry


AllowedTargetEntry = Annotated[str, AfterValidator(_check_allowed)]
# The libpq parameters an auth module may set: how to secure and authenticate the
# connection. Where to connect comes from the probe's checked address, and the session's
# settings (timeouts, application_name, keepalives) from the exporter, never from here.
AUTH_MODULE_OPTIONS = frozenset(
    {
        "sslmode",
        "sslrootcert",
        "sslcert",
        "sslkey",
        "sslcrl",
        "sslcrldir",
        "sslsni",
        "ssl_min_protocol_version",
        "ssl_max_protocol_version",
        "channel_binding",
        "require_auth",
        "gssencmode",
        "krbsrvname",
    }
)
_DBNAME = rf"^{DBNAME_PATTERN}$"


class AuthModuleConfig(Strict):
    """Credentials and settings for the servers that probes name
    (/probe?target=HOST[:PORT][/DBNAME]&auth_module=NAME), as the file gives them."""

    user: str = Field(min_length=1)
    password_file: Path | None = None
    dbname: str = Field(default="postgres", pattern=_DBNAME)  # where the target names none
    options: dict[str, str] = Field(default_factory=dict)  # of AUTH_MODULE_OPTIONS
    # Only the fields given count, over the file's top-level block and the flags.
    collection: CollectionSettings | None = None
    keys: tuple[KeyConfig, ...] = ()  # added to the file's top-level keys
    catalog: CatalogChoice | None = None  # not set: the file's top-level `catalog`
    # Without it, a module would be an open proxy with the monitoring role's password.
    allowed_targets: tuple[AllowedTargetEntry, ...] = Field(default=(), validate_default=True)

    @field_validator("options")
    @classmethod
    def _known_options(cls, options: dict[str, str]) -> dict[str, str]:
        unknown = sorted(set(options) - AUTH_MODULE_OPTIONS)
        if unknown:
            raise ValueError(
                f"{', '.join(unknown)}: an auth module's options are only "
                f"{', '.join(sorted(AUTH_MODULE_OPTIONS))} (the address comes from the "
                "probe; user and password_file have fields of their own)"
            )
        return options

    @field_validator("allowed_targets")
    @classmethod
    def _some_allowed(cls, entries: tuple[str, ...]) -> tuple[str, ...]:
        if not entries:
            raise ValueError(
                "an auth module needs allowed_targets: the networks (10.0.0.0/8) and host "
                "names (*.db.internal), with optional ports, that probes may name"
            )
        return entries

    @model_validator(mode="after")
    def _password_file_readable(self) -> AuthModuleConfig:
        check_password_source("", self.password_file)
        return self


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


class DiscoveredTargetsSettings(Strict):
    """Limits on the targets that probes name through an auth module."""

    # A target not probed for this long is closed and forgotten.
    idle_after: Annotated[float, PARSE_DURATION, duration_within(0.1, 7 * 86400.0)] = 600.0
    # The most kept at once; a probe of a new one past it is refused (503).
    max: int = Field(default=10_000, ge=1)


def _check_unique(what: str, names: Sequence[str]) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ValueError(f"{what} name {name!r} is used twice")
        seen.add(name)


class WebConfig(Strict):
    listen_address: ListenAddress = Field(
        default=DEFAULT_LISTEN_ADDRESS, description="host:port to serve on"
    )
    telemetry_path: TelemetryPath = Field(
        default="/metrics", description="path under which to expose metrics"
    )
    enable_lifecycle: bool = Field(
        default=False, description="serve POST /-/reload (SIGHUP reloads either way)"
    )
    external_url: ExternalUrl | None = Field(
        default=None,
        description="the URL under which users reach the exporter (behind a proxy, its "
        "public one): alert descriptions link to its /locks page",
    )
    config_file: Annotated[Path | None, Spelled("--web.config.file")] = Field(
        default=None,
        description="web configuration file in the exporter-toolkit format: TLS, basic auth "
        "users and response headers for every endpoint, read again when it changes",
    )


class LogConfig(Strict):
    level: LogLevel = Field(default="info", description="debug, info, warn or error")
    format: LogFormat = Field(default="logfmt", description="logfmt or json")

    @field_validator("level", mode="before")
    @classmethod
    def _warning_is_warn(cls, value: object) -> object:
        return "warn" if value == "warning" else value


def _shard_index(value: object) -> object:
    """A number from 0, or auto; a flag's or a variable's text is read as one."""
    if value == "auto":
        return value
    if isinstance(value, str) and re.fullmatch(r"[0-9]+", value.strip()):
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise ValueError(f"{value!r} is not a shard index (0, 1, 2 ...) or auto")


ShardIndex = Annotated[int | Literal["auto"], BeforeValidator(_shard_index)]


class ShardConfig(Strict):
    """Which part of the configured targets this replica collects (sharding.py)."""

    total: int = Field(
        default=1, ge=1, description="replicas that split the configured targets between them"
    )
    index: ShardIndex = Field(
        default=0,
        description="this replica's shard, 0 to total - 1, or auto: the trailing -N of the "
        "host name (a StatefulSet's pod name)",
    )


class FileConfig(Strict):
    """The YAML file."""

    web: WebConfig = WebConfig()
    log: LogConfig = LogConfig()
    collection: CollectionSettings = CollectionSettings()
    keys: tuple[KeyConfig, ...] = ()  # the key registry of every target
    # Well-known keys (catalog.py) named for every target unless it says otherwise: true
    # for the default entries, false for none, or the names of the entries to keep. Only
    # the file sets it: a choice of names has no flag or variable form.
    catalog: CatalogChoice = True
    locks_page: LocksPageSettings = LocksPageSettings()  # of every target; only the file
    max_parallel_collections: int = Field(default=DEFAULT_PARALLEL_COLLECTIONS, ge=1)
    shard: ShardConfig = ShardConfig()
    targets: tuple[TargetConfig, ...] = ()
    # Servers that probes name (/probe?target=HOST&auth_module=NAME), by module name.
    auth_modules: dict[Annotated[str, Field(pattern=_NAME)], AuthModuleConfig] = Field(
        default_factory=dict
    )
    discovered_targets: DiscoveredTargetsSettings = DiscoveredTargetsSettings()

    @field_validator("keys")
    @classmethod
    def _keys_unique(cls, keys: tuple[KeyConfig, ...]) -> tuple[KeyConfig, ...]:
        check_configs(keys)
        return keys

    @field_validator("targets")
    @classmethod
    def _unique_names(cls, targets: tuple[TargetConfig, ...]) -> tuple[TargetConfig, ...]:
        _check_unique("target", [target.name for target in targets])
        return targets


class ConfigFileSettings(Strict):
    """Where the file is (--config.file): given by a flag or a variable, never by the file."""

    file: Path | None = Field(
        default=None, description="YAML file with targets and collection settings"
    )


class Overrides(Strict):
    """What flags or environment variables give; only the fields that were set count.

    Every field of its blocks is a setting with a flag and a variable: see SETTINGS.
    """

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


# How a block's variables are named after the prefix. The collection's have no block name
# in them (PG_ADVISORY_EXPORTER_MIN_INTERVAL), as they were first published.
_VARIABLE_INFIX = {
    "config": "config_",
    "web": "web_",
    "log": "log_",
    "collection": "",
    "shard": "shard_",
}
# postgres_exporter's variable, so that its deployments keep working.
_DSN_VARIABLES = (f"{ENV_PREFIX}DSN", "DATA_SOURCE_NAME")


@dataclass(frozen=True)
class Setting:
    """One setting of Overrides; its flag, variables and help follow from its field."""

    block: str | None  # the Overrides block, which is also the file's; None for the DSN
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
        """The key in argparse's results and read_flags(): the variable without the prefix."""
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
    for name, field in Overrides.model_fields.items():
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
_BY_DEST = {setting.dest: setting for setting in SETTINGS}
_BY_PATH = {setting.path: setting for setting in SETTINGS}


@dataclass(frozen=True)
class Config:
    """The settings the daemon runs with, all sources merged."""

    web: WebConfig
    log: LogConfig
    targets: tuple[TargetSettings, ...]
    max_parallel_collections: int = DEFAULT_PARALLEL_COLLECTIONS
    # The daemon collects only the targets of its shard; `check` reads them all.
    shard: Shard = dataclasses.field(default_factory=Shard)
    auth_modules: Mapping[str, AuthModuleSettings] = dataclasses.field(default_factory=dict)
    discovered_targets: DiscoveredTargetsSettings = dataclasses.field(
        default_factory=DiscoveredTargetsSettings
    )
    # What is valid but worth a word, each located: --config.check prints them, the daemon
    # logs them when it starts and at each reload.
    notes: tuple[str, ...] = ()


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
        named = ", ".join(f"targets[{i}].dsn ({targets[i].name})" for i in others[:_NAMED])
        more = f" and {len(others) - _NAMED} more" if len(others) > _NAMED else ""
        notes.append(
            f"{path}: {named}{more}: the same server as target {targets[first].name!r} "
            f"(targets[{first}], {server}): a target reads every database of its server, so "
            f"it is read once, through {targets[first].name!r} and with its settings; the "
            "others answer pg_advisory_up only"
        )
    return tuple(notes)


def _validate(values: Mapping[str, object], sources: Mapping[str, str]) -> Overrides:
    """Overrides from values by dest; sources name where each came from, for errors."""
    blocks: dict[str, Any] = {}
    for dest, value in values.items():
        setting = _BY_DEST[dest]
        if setting.block is None:
            blocks[setting.name] = value
        else:
            blocks.setdefault(setting.block, {})[setting.name] = value
    try:
        return Overrides.model_validate(blocks)
    except ValidationError as exc:
        raise ConfigError(
            "\n".join(
                f"{sources[_BY_PATH[tuple(map(str, e['loc'][:2]))].dest]}: {describe_error(e)}"
                for e in exc.errors()
            )
        ) from None


def read_flags(values: Mapping[str, object]) -> Overrides:
    """Validate the flags that were given, by dest (argparse leaves the others as None)."""
    given = {dest: value for dest, value in values.items() if value is not None}
    return _validate(given, {dest: f"flag {_BY_DEST[dest].flag}" for dest in given})


class _Environment(BaseSettings):
    """The variables of SETTINGS as text, one field each (see _VARIABLES).

    pydantic-settings finds them in any case, as they always were read, and takes the first
    of several names that is set (PG_ADVISORY_EXPORTER_DSN before DATA_SOURCE_NAME).
    Overrides validates the text as it does a flag's, so the errors of both read alike.
    """

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
        return (env_settings,)  # no .env file or secrets folder: the published variables only


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


def read_environment() -> Overrides:
    """Validate the PG_ADVISORY_EXPORTER_* variables and DATA_SOURCE_NAME that are set."""
    variables = _VARIABLES()
    values = {dest: getattr(variables, dest) for dest in variables.model_fields_set}
    sources = {dest: f"environment variable {_spelled(_BY_DEST[dest])}" for dest in values}
    return _validate(values, sources)


def _read_file(path: Path) -> FileConfig:
    file = read_model(
        path, FileConfig, expected="a mapping with a 'targets' list", if_empty=lambda: None
    )
    for i, target in enumerate(file.targets):
        try:
            check_configs(file.keys + target.keys)
        except ValueError as exc:
            raise ConfigError(f"{path}: targets[{i}].keys: {exc}") from None
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


def _chosen(flags: Overrides, env: Overrides, block: str) -> dict[str, Any]:
    """A block's settings given by variables or flags, the flags winning."""
    return {**_given(getattr(env, block)), **_given(getattr(flags, block))}


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


def load(flags: Overrides, env: Overrides) -> Config:
    """Merge the file (if any), the environment and the flags into one Config."""
    dsn: str | None = {**_given(env), **_given(flags)}.get("dsn")
    config_file: Path | None = _chosen(flags, env, "config").get("file")
    if config_file is not None and dsn is not None:
        raise ConfigError(
            "both a DSN and --config.file were given: list the server in the file's targets, "
            "or leave the file out"
        )
    if config_file is not None:
        file = _read_file(config_file)
    elif dsn is not None:
        file = FileConfig(targets=(TargetConfig(name=DEFAULT_TARGET, dsn=dsn),))
    else:
        raise ConfigError(
            "no server to watch: give --dsn or --config.file, "
            f"or set {ENV_PREFIX}DSN or DATA_SOURCE_NAME"
        )
    web = file.web.model_copy(update=_chosen(flags, env, "web"))
    log = file.log.model_copy(update=_chosen(flags, env, "log"))

    def shard_origin(name: str) -> str:
        setting = _BY_PATH[("shard", name)]
        if name in flags.shard.model_fields_set:
            return f"flag {setting.flag}"
        if name in env.shard.model_fields_set:
            return f"environment variable {_spelled(setting)}"
        if name in file.shard.model_fields_set:
            return f"{config_file}: shard.{name}"
        return f"the default of {setting.flag}"

    shard = _shard(file.shard.model_copy(update=_chosen(flags, env, "shard")), shard_origin)
    # Flags and variables set the defaults for every target; a target's own block wins.
    defaults = file.collection.model_copy(update=_chosen(flags, env, "collection"))
    targets = tuple(
        TargetSettings(
            name=target.name,
            dsn=target.dsn,
            password_file=target.password_file,
            **_over_top_level(file, defaults, target),
            poolers=target.poolers,
            locks_page=file.locks_page.model_copy(update=_given(target.locks_page)),
        )
        for target in file.targets
    )
    auth_modules = {
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
    }
    return Config(
        web=web,
        log=log,
        targets=targets,
        max_parallel_collections=file.max_parallel_collections,
        shard=shard,
        notes=same_server_notes(config_file, file.targets),
        auth_modules=auth_modules,
        discovered_targets=file.discovered_targets,
    )
