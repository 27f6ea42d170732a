"""The web configuration file (--web.config.file), in the exporter-toolkit format.

The same keys and meaning as every Go exporter (node_exporter, postgres_exporter) and
Prometheus itself, so one file and `promtool check web-config` serve them all: TLS, basic
auth users (bcrypt hashes) and extra response headers. Relative paths are relative to the
file's folder. What Python's ssl module cannot honour is refused with the key named, never
ignored: a file that asks for a protection we would not give must not start.
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

from pydantic import (
    AfterValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from pg_advisory_exporter.schema import ConfigError, Strict
from pg_advisory_exporter.yaml_file import read_model

# exporter-toolkit's names (Go's tls.CipherSuites()) and OpenSSL's for the same suites.
# The TLS 1.3 ones have no OpenSSL name here: Go ignores them in a configuration (TLS 1.3
# suites are not configurable there), and so do we.
CIPHER_SUITES: Mapping[str, str | None] = {
    "TLS_AES_128_GCM_SHA256": None,
    "TLS_AES_256_GCM_SHA384": None,
    "TLS_CHACHA20_POLY1305_SHA256": None,
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
}
TLS_VERSIONS: Mapping[str, ssl.TLSVersion] = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
CLIENT_AUTH_TYPES: Mapping[str, ssl.VerifyMode] = {
    "": ssl.CERT_NONE,
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
# Go asks for a client certificate and takes it unverified; Python's ssl verifies every
# certificate it asks for, against client_ca_file.
UNVERIFIED_CLIENT_AUTH = ("RequestClientCert", "RequireAnyClientCert", "RequireClientCert")
# exporter-toolkit's list: only these, and some only with these values, so that every
# exporter of the ecosystem answers alike.
HEADERS: Mapping[str, tuple[str, ...]] = {
    "Strict-Transport-Security": (),
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": (),
    "Content-Security-Policy": (),
}
# What golang.org/x/crypto/bcrypt takes for a hash (version 2 with a variant letter, a cost
# of 4 to 31, then 53 characters of salt and hash), narrowed to the variants pyca's bcrypt
# checks: $2$ alone is Go's only extra, and no tool has written it for twenty years.
_BCRYPT = re.compile(r"\$2[abxy]\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}")
_MAKE_A_HASH = (
    "make one with: htpasswd -nBC 12 '' | tr -d ':\\n', or "
    "python3 -c 'import bcrypt, getpass; "
    "print(bcrypt.hashpw(getpass.getpass().encode(), bcrypt.gensalt(12)).decode())'"
)


def _bcrypt_hash(value: str) -> str:
    # The value is never quoted back: a password pasted here by mistake stays out of the
    # terminal and the logs.
    if not _BCRYPT.fullmatch(value):
        raise ValueError(f"not a bcrypt hash; {_MAKE_A_HASH}")
    return value


BcryptHash = Annotated[str, AfterValidator(_bcrypt_hash)]


class _Block(Strict):
    # yaml.v2 reads a number where a string is due as its text (cert_file: 12 is "12").
    model_config = ConfigDict(extra="forbid", frozen=True, coerce_numbers_to_str=True)

    @model_validator(mode="before")
    @classmethod
    def _null_is_empty(cls, value: object) -> object:
        # `tls_server_config:` with nothing under it is a block with every default in Go.
        return {} if value is None else value


class TlsServerConfig(_Block):
    cert_file: str = ""
    key_file: str = ""
    client_auth_type: str = ""
    client_ca_file: str = ""
    cipher_suites: tuple[str, ...] = ()
    curve_preferences: tuple[str, ...] = ()
    min_version: str = "TLS12"
    max_version: str = "TLS13"
    prefer_server_cipher_suites: bool = True

    @field_validator("cipher_suites")
    @classmethod
    def _known_suites(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        for name in names:
            if name not in CIPHER_SUITES:
                raise ValueError(f"unknown cipher: {name} (known: {', '.join(CIPHER_SUITES)})")
        return names

    @field_validator("curve_preferences")
    @classmethod
    def _no_curves(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        if names:
            raise ValueError(
                "not supported by this exporter: Python's ssl module cannot set a list of "
                "curves; leave it out to use OpenSSL's (X25519 and the NIST curves)"
            )
        return names

    @field_validator("min_version", "max_version")
    @classmethod
    def _known_version(cls, name: str) -> str:
        if name not in TLS_VERSIONS:
            raise ValueError(f"unknown TLS version: {name} (use {', '.join(TLS_VERSIONS)})")
        return name

    @field_validator("client_auth_type")
    @classmethod
    def _known_client_auth(cls, name: str) -> str:
        if name in UNVERIFIED_CLIENT_AUTH:
            raise ValueError(
                f"{name} is not supported by this exporter: Python's ssl module verifies "
                "every client certificate it asks for; use VerifyClientCertIfGiven or "
                "RequireAndVerifyClientCert with client_ca_file"
            )
        if name not in CLIENT_AUTH_TYPES:
            known = ", ".join(n for n in CLIENT_AUTH_TYPES if n)
            raise ValueError(f"invalid client_auth_type: {name} (use {known})")
        return name

    @model_validator(mode="after")
    def _complete(self) -> TlsServerConfig:
        if not self.enabled:
            return self
        if not self.cert_file:
            raise ValueError("missing cert_file")
        if not self.key_file:
            raise ValueError("missing key_file")
        if self.client_ca_file and CLIENT_AUTH_TYPES[self.client_auth_type] == ssl.CERT_NONE:
            raise ValueError(
                "client_ca_file is set without a client_auth_type that checks certificates "
                "(VerifyClientCertIfGiven or RequireAndVerifyClientCert)"
            )
        return self

    @property
    def enabled(self) -> bool:
        """As in Go: any of these four turns TLS on (and then both files are required)."""
        return any((self.cert_file, self.key_file, self.client_auth_type, self.client_ca_file))


class HttpServerConfig(_Block):
    http2: bool = True  # accepted for compatibility; the server speaks HTTP/1.1 only
    headers: dict[str, str] = Field(default_factory=dict)

    @field_validator("headers")
    @classmethod
    def _allowed_headers(cls, headers: dict[str, str]) -> dict[str, str]:
        for name, value in headers.items():
            if name not in HEADERS:
                raise ValueError(
                    f"HTTP header {name!r} can not be configured (allowed: {', '.join(HEADERS)})"
                )
            allowed = HEADERS[name]
            if allowed and value not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}, not {value!r}")
        return headers


class WebConfigFile(_Block):
    """The file, as exporter-toolkit reads it."""

    tls_server_config: TlsServerConfig = TlsServerConfig()
    http_server_config: HttpServerConfig = HttpServerConfig()
    basic_auth_users: dict[str, BcryptHash] = Field(default_factory=dict)


@dataclass(frozen=True)
class WebSettings:
    """A loaded web configuration: what the HTTP server enforces."""

    path: Path
    tls: ssl.SSLContext | None
    users: Mapping[str, bytes] = field(default_factory=dict)  # name: bcrypt hash
    headers: tuple[tuple[str, str], ...] = ()
    files: tuple[Path, ...] = ()  # every file read: a change to one of them reloads

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
        return f"{tls}, {len(self.users)} basic auth user(s), {len(self.headers)} header(s)"


def _ssl_context(config: TlsServerConfig, folder: Path, source: str) -> ssl.SSLContext:
    def error(key: str, problem: str) -> ConfigError:
        return ConfigError(f"{source}: tls_server_config.{key}: {problem}")

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(folder / config.cert_file, folder / config.key_file)
    except OSError as exc:  # ssl.SSLError is one
        problem = exc.strerror or str(exc)
        raise error("cert_file", f"cannot load the certificate and key: {problem}") from None
    context.minimum_version = TLS_VERSIONS[config.min_version]
    context.maximum_version = TLS_VERSIONS[config.max_version]
    if config.prefer_server_cipher_suites:
        context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    if config.cipher_suites:
        names = [CIPHER_SUITES[n] for n in config.cipher_suites]
        openssl_names = [n for n in names if n is not None]
        if not openssl_names:
            # Only TLS 1.3 suites listed: Go then completes no TLS 1.2 handshake.
            context.minimum_version = ssl.TLSVersion.TLSv1_3
        else:
            try:
                context.set_ciphers(":".join(openssl_names))
            except ssl.SSLError:
                raise error("cipher_suites", "this Python's OpenSSL offers none of them") from None
    context.verify_mode = CLIENT_AUTH_TYPES[config.client_auth_type]
    if context.verify_mode != ssl.CERT_NONE:
        if config.client_ca_file:
            try:
                context.load_verify_locations(folder / config.client_ca_file)
            except OSError as exc:
                problem = exc.strerror or str(exc)
                raise error("client_ca_file", f"cannot load: {problem}") from None
        else:
            context.load_default_certs(ssl.Purpose.CLIENT_AUTH)  # Go uses the system's too
    return context


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
        context = _ssl_context(tls, folder, str(path))
        names = (tls.cert_file, tls.key_file, tls.client_ca_file)
        files += [folder / name for name in names if name]  # an absolute name stays so
    return WebSettings(
        path=path,
        tls=context,
        users={user: hashed.encode() for user, hashed in config.basic_auth_users.items()},
        headers=tuple(config.http_server_config.headers.items()),
        files=tuple(files),
    )
