"""The web configuration read (`read_web_config`) into what the server enforces (`WebSettings`).

The file's format and checks are in web_config_file.py, its TLS context is made by
tls_context.py; web_access.py enforces the result and reloads it when a file changes.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pg_advisory_exporter.validation import ConfigError
from pg_advisory_exporter.yaml_file import read_model

from .tls_context import ssl_context
from .web_config_file import WebConfigFile


@dataclass(frozen=True)
class WebSettings:
    """A loaded web configuration: what the HTTP server enforces."""

    path: Path
    tls: ssl.SSLContext | None
    users: Mapping[str, bytes] = field(default_factory=dict)  # name: bcrypt hash
    headers: tuple[tuple[str, str], ...] = ()
    files: tuple[Path, ...] = ()  # every file read: a change to one of them reloads
    allowed_sans: frozenset[str] = frozenset()  # empty: every verified client certificate
    rate_limit: tuple[float, int] | None = None  # the bucket's interval (seconds) and burst

    @property
    def summary(self) -> str:
        """What it enforces, for --config.check and the log."""
        if self.tls is None:
            tls = "TLS off"
        else:
            tls = {
                ssl.CERT_NONE: "TLS on",
                ssl.CERT_OPTIONAL: "TLS on, client certificates verified if given",
                ssl.CERT_REQUIRED: "TLS on, client certificates required",
            }[self.tls.verify_mode]
        if self.allowed_sans:
            tls += f" with one of {len(self.allowed_sans)} allowed SAN(s)"
        summary = f"{tls}, {len(self.users)} basic auth user(s), {len(self.headers)} header(s)"
        if self.rate_limit is not None:
            interval, burst = self.rate_limit
            summary += f", rate limit of {burst} request(s) then one per {interval:g}s"
        return summary


def read_web_config(path: Path, *, allow_empty: bool = True) -> WebSettings:
    """Read and check the file and every file it names; ConfigError says where and why.

    An empty file is a configuration without TLS, users or headers, as for promtool; a
    reload refuses it (`allow_empty=False`): it is what a file being rewritten in place
    looks like until the writer is done.
    """

    def empty() -> object:
        if not allow_empty:
            raise ConfigError(
                f"{path}: the file is empty; write the new one beside it and rename it over it"
            )
        return {}

    config = read_model(path, WebConfigFile, what="web configuration file", if_empty=empty)
    folder = path.parent
    tls = config.tls_server_config
    files = [path]
    context = None
    if tls.enabled:
        context = ssl_context(tls, folder, str(path))
        names = (tls.cert_file, tls.key_file, tls.client_ca_file)
        files += [folder / name for name in names if name]  # an absolute name stays so
    return WebSettings(
        path=path,
        tls=context,
        users={user: hashed.encode() for user, hashed in config.basic_auth_users.items()},
        headers=tuple(config.http_server_config.headers.items()),
        files=tuple(files),
        allowed_sans=frozenset(tls.client_allowed_sans or ()),
        rate_limit=config.rate_limit.bucket,
    )
