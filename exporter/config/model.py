"""The configuration file's model: every block and field a file may hold, each field with its
default and description (the flags, variables and help of those that have them follow from
the field: config/sources.py), validated with the errors a person can act on."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from pg_advisory_exporter.durations import PARSE_DURATION, duration_within
from pg_advisory_exporter.endpoints import RESERVED_PATHS
from pg_advisory_exporter.fleet.discovery import (
    DBNAME_PATTERN,
    parse_allowed,
)
from pg_advisory_exporter.keys.appnames import RewriteRule, compile_pattern, parse_template
from pg_advisory_exporter.keys.catalog import CatalogChoice
from pg_advisory_exporter.keys.registry import KeyConfig, check_configs
from pg_advisory_exporter.validation import Strict, port_number, step

from .dsn import Dsn, check_password_source, with_password

DEFAULT_LISTEN_ADDRESS = ":9846"
DEFAULT_TARGET = "default"
DEFAULT_PARALLEL_COLLECTIONS = 16


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


def _rarely(seconds: float) -> float:
    # pg_stat_statements' texts can be megabytes: read them at least a minute apart.
    if 0 < seconds < 60:
        raise ValueError("must be 0 (never) or at least 1m")
    return seconds


Rarely = Annotated[float, PARSE_DURATION, duration_within(0.0, 86400.0), AfterValidator(_rarely)]


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
    statements_interval: Rarely = Field(
        default=600.0,
        description="how often pg_stat_statements is read for risky lock statements (0: never)",
    )
    application_name_limit: int = Field(
        default=100, ge=1, description="most distinct application_name values per target"
    )
    application_name_rewrites: Annotated[tuple[RewriteRuleConfig, ...], FileOnly()] = Field(
        default=(), description="rewrites of application_name before it becomes a label"
    )

    @property
    def collection_deadline(self) -> float:
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


ServerLogFormat = Literal["jsonlog", "csvlog", "stderr"]


class ServerLogSettings(Strict):
    """Where the server's own log is and how it is written (`server_log`; `log` is the
    exporter's own logging): read to count what happens between two scrapes."""

    path: Path | None = Field(
        default=None,
        description="the server's log file, or its log_directory, whose newest file of the "
        "format is followed (no log is read without it)",
    )
    format: ServerLogFormat = Field(
        default="stderr", description="the server's log_destination: jsonlog, csvlog or stderr"
    )
    line_prefix: str = Field(
        default="%m [%p] ",
        description="the server's log_line_prefix, for the stderr format: database, "
        "application and process are read where it gives them (%d, %a, %p)",
    )


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
    server_log: ServerLogSettings | None = None  # the server's own log, if it is read

    @model_validator(mode="after")
    def _one_password_source(self) -> TargetConfig:
        check_password_source(self.dsn, self.password_file)
        return self

    @field_validator("poolers")
    @classmethod
    def _unique_poolers(cls, poolers: tuple[PoolerConfig, ...]) -> tuple[PoolerConfig, ...]:
        _check_unique("pooler name", [pooler.name for pooler in poolers])
        return poolers


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
            raise ValueError(f"{what} {name!r} is used twice")
        seen.add(name)


def _check_logs(logs: Sequence[tuple[str, Path, str]]) -> None:
    """Two targets counting one log would count each event twice: one log of a format read
    by two targets (each given as `targets[i] (name)`), under two spellings (a symbolic
    link, `..`), or as a file and the directory that holds it, is refused."""
    seen: list[tuple[str, Path, Path, str]] = []
    for target, path, log_format in logs:
        resolved = path.resolve()
        for earlier_target, earlier, earlier_resolved, earlier_format in seen:
            if log_format != earlier_format:
                continue
            if resolved == earlier_resolved:
                raise ValueError(
                    f"{target}.server_log: '{path} ({log_format})' is used twice: "
                    f"{earlier_target} reads it too"
                )
            if resolved.is_relative_to(earlier_resolved) or earlier_resolved.is_relative_to(
                resolved
            ):
                raise ValueError(
                    f"{target}.server_log: '{path} ({log_format})' and {earlier_target}'s "
                    f"'{earlier}' are one log: one holds the other"
                )
        seen.append((target, path, resolved, log_format))


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
        first: dict[str, int] = {}
        for i, target in enumerate(targets):
            if target.name in first:
                raise ValueError(
                    f"target name {target.name!r} is used twice: by "
                    f"targets[{first[target.name]}] and targets[{i}]"
                )
            first[target.name] = i
        _check_logs(
            [
                (step("targets", i, target.name), target.server_log.path, target.server_log.format)
                for i, target in enumerate(targets)
                if target.server_log is not None and target.server_log.path is not None
            ]
        )
        return targets
