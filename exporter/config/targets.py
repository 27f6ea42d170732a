"""What the exporter reads: targets with their poolers, /locks page and server log; auth modules."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator

from pg_advisory_exporter.durations import PARSE_DURATION, duration_within
from pg_advisory_exporter.fleet.discovery import DBNAME_PATTERN, parse_allowed
from pg_advisory_exporter.keys.catalog import CatalogChoice
from pg_advisory_exporter.keys.key_config import KeyConfig
from pg_advisory_exporter.validation import NAME_PATTERN, Strict

from .collection import CollectionSettings, Interval
from .dsn import Dsn, check_password_source, with_password

DEFAULT_TARGET = "default"  # the name of the target that --dsn alone makes

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

    name: str = Field(pattern=NAME_PATTERN)
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
    # The caller a statement's comments name (its controller and action, its file and line)
    # is code, not data, and so on by default; off, not a character of the query is read.
    callers: bool = True
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

    name: str = Field(pattern=NAME_PATTERN)
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
