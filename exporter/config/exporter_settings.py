"""The exporter's own blocks: how it serves (`WebConfig`), logs and shards (`ShardConfig`)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BeforeValidator, Field, field_validator

from pg_advisory_exporter.endpoints import RESERVED_PATHS
from pg_advisory_exporter.validation import Strict, port_number

from .markers import Spelled

DEFAULT_LISTEN_ADDRESS = ":9846"


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
    # The exporter-toolkit's flags, with its defaults: operators script them for every exporter.
    systemd_socket: bool = Field(
        default=False,
        description="serve on the TCP socket that systemd's socket activation passes "
        "(LISTEN_FDS), not on --web.listen-address",
    )
    max_requests: int = Field(
        default=40,
        ge=0,
        description="scrapes of the metrics path answered at once, the next refused with "
        "503; 0 for no limit",
    )
    disable_exporter_metrics: bool = Field(
        default=False, description="leave out the metrics of the exporter's process (process_*)"
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
