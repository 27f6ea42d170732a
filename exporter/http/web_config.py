"""The web configuration file (--web.config.file), in the exporter-toolkit format.

The same keys and meaning as every Go exporter (node_exporter, postgres_exporter) and
Prometheus itself, so one file and `promtool check web-config` serve them all: TLS (with
certificates in files or inline, and the SANs a client certificate must have), basic auth
users (bcrypt hashes), extra response headers and a rate limit. Relative paths are relative
to the file's folder. What Python's ssl module cannot honour is refused with the key named,
never ignored: a file that asks for a protection we would not give must not start.
"""

from __future__ import annotations

import contextlib
import os
import re
import ssl
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Annotated

from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    StrictInt,
    ValidationInfo,
    field_validator,
    model_validator,
)

from pg_advisory_exporter.validation import ConfigError, Strict
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

# An inline certificate chain, key or CA bundle longer than this is a mistake: Mozilla's
# whole CA bundle is about 220 KiB. The file itself is capped at 8 MiB (yaml_file.py).
MAX_INLINE_PEM = 1024 * 1024
# Go's time.ParseDuration, which yaml.v2 applies to exporter-toolkit's rate_limit.interval:
# numbers with a fraction if any and a unit each, in any order, or a bare 0.
_GO_UNITS = {"ns": "1e-9", "us": "1e-6", "µs": "1e-6", "μs": "1e-6", "ms": "1e-3", "s": "1",
             "m": "60", "h": "3600"}  # fmt: skip
_GO_PART = re.compile(rf"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)({'|'.join(_GO_UNITS)})")
_GO_DURATION = re.compile(rf"[-+]?(?:(?:{_GO_PART.pattern})+|0)")
_GO_LONGEST = Decimal(2**63 - 1) / 10**9  # an int64 of nanoseconds, about 292 years
_GO_EXAMPLES = "write it as Go does: 500ms, 1s, 1m30s, 1h"


def _go_duration(value: object) -> float:
    """Seconds from a duration as exporter-toolkit reads one (Go's "1m30s", "1.5s"), never
    negative: Go takes a negative interval as no limit at all, surely not what was meant."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        if value == 0:
            return 0.0
        # yaml.v2 reads a bare number into a time.Duration as nanoseconds.
        raise ValueError(f"{value} has no unit, which Go reads as nanoseconds; {_GO_EXAMPLES}")
    if not isinstance(value, str) or not _GO_DURATION.fullmatch(value):
        raise ValueError(f"{value!r} is not a duration; {_GO_EXAMPLES}")
    seconds = sum(
        (Decimal(number) * Decimal(_GO_UNITS[unit]) for number, unit in _GO_PART.findall(value)),
        Decimal(0),
    )
    if value.startswith("-") and seconds:
        raise ValueError("must not be negative (0 turns the rate limit off)")
    if seconds > _GO_LONGEST:
        raise ValueError(f"{value!r} is longer than Go's longest duration (about 292 years)")
    return float(seconds)


class _Block(Strict):
    # yaml.v2 reads a number where a string is due as its text (cert_file: 12 is "12").
    model_config = ConfigDict(extra="forbid", frozen=True, coerce_numbers_to_str=True)

    @model_validator(mode="before")
    @classmethod
    def _null_is_empty(cls, value: object) -> object:
        # `tls_server_config:` with nothing under it is a block with every default in Go.
        return {} if value is None else value


class TlsServerConfig(_Block):
    # The files before their inline forms, which are checked against them.
    cert_file: str = ""
    key_file: str = ""
    client_auth_type: str = ""
    client_ca_file: str = ""
    cert: str = ""
    key: SecretStr = SecretStr("")  # a Secret in Go: never logged, never in a message
    client_ca: str = ""
    client_allowed_sans: tuple[str, ...] | None = None
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

    @field_validator("cert", "key", "client_ca")
    @classmethod
    def _inline_or_file(cls, value: str | SecretStr, info: ValidationInfo) -> str | SecretStr:
        # Go takes the file and ignores the text when both are given (its docs: "should not
        # be specified"); which one serves must not be a guess. The text is never quoted.
        text = value.get_secret_value() if isinstance(value, SecretStr) else value
        name = info.field_name
        if text and info.data.get(f"{name}_file"):
            raise ValueError(f"give {name} or {name}_file, not both")
        if len(text) > MAX_INLINE_PEM:
            raise ValueError(
                f"longer than {MAX_INLINE_PEM // 1024} KiB, more than any certificate chain "
                "or CA bundle; is this the right text?"
            )
        return value

    @field_validator("client_allowed_sans")
    @classmethod
    def _sans_of_verified_certificates(
        cls, sans: tuple[str, ...] | None, info: ValidationInfo
    ) -> tuple[str, ...] | None:
        if sans is None:  # `client_allowed_sans:` with nothing: no list, as in Go
            return None
        if not sans:
            raise ValueError(
                "an empty list admits no client; leave it out to admit every client whose "
                "certificate the client CA verifies"
            )
        auth = info.data.get("client_auth_type")  # absent: refused above, already said
        if auth is not None and auth != "RequireAndVerifyClientCert":
            raise ValueError(
                f"needs client_auth_type: RequireAndVerifyClientCert, not {auth or 'none'}: "
                "a client that sends no certificate has no SAN to check (and under "
                "NoClientCert, Go ignores the list)"
            )
        return sans

    @model_validator(mode="after")
    def _complete(self) -> TlsServerConfig:
        if not self.enabled:
            return self
        if not (self.cert_file or self.cert):
            raise ValueError("missing cert_file (or cert, inline)")
        if not (self.key_file or self.key.get_secret_value()):
            raise ValueError("missing key_file (or key, inline)")
        if (self.client_ca_file or self.client_ca) and (
            CLIENT_AUTH_TYPES[self.client_auth_type] == ssl.CERT_NONE
        ):
            which = "client_ca_file" if self.client_ca_file else "client_ca"
            raise ValueError(
                f"{which} is set without a client_auth_type that checks certificates "
                "(VerifyClientCertIfGiven or RequireAndVerifyClientCert)"
            )
        return self

    @property
    def enabled(self) -> bool:
        """As in Go: any of these turns TLS on (and then a certificate and key are required)."""
        return any(
            (self.cert_file, self.key_file, self.client_auth_type, self.client_ca_file,
             self.cert, self.key.get_secret_value(), self.client_ca)
        )  # fmt: skip


class RateLimit(_Block):
    """exporter-toolkit's token bucket on the endpoints (http/rate_limit.py); 0s is off."""

    interval: Annotated[float, BeforeValidator(_go_duration)] = 0.0
    burst: StrictInt = Field(default=0, ge=0, validate_default=True)

    @field_validator("burst")
    @classmethod
    def _a_token_at_least(cls, burst: int, info: ValidationInfo) -> int:
        if info.data.get("interval") and burst < 1:
            raise ValueError(
                "must be at least 1 with an interval: a bucket of 0 tokens (Go's default) "
                "refuses every request"
            )
        return burst

    @property
    def bucket(self) -> tuple[float, int] | None:
        """The bucket's interval (seconds) and burst; None when it is off."""
        return (self.interval, self.burst) if self.interval else None


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
    rate_limit: RateLimit = RateLimit()


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


class _Encrypted(Exception):
    """What the passphrase callback raises: OpenSSL would otherwise ask on the terminal."""


def _no_passphrase() -> bytes:
    raise _Encrypted


def _memory_file(pem: str) -> int | None:
    """A memfd holding `pem` that OpenSSL can open as /proc/self/fd/N, or None where there
    is none (not Linux, no /proc)."""
    try:
        fd = os.memfd_create("pg-advisory-exporter-web-config", os.MFD_CLOEXEC)
    except (AttributeError, OSError):
        return None
    try:
        data = memoryview(pem.encode())
        while data:
            data = data[os.write(fd, data) :]
        if os.access(f"/proc/self/fd/{fd}", os.R_OK):
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


@contextlib.contextmanager
def _readable(pem: str) -> Iterator[str]:
    """A path to inline PEM text, for ssl's load_cert_chain, which reads only files: in
    memory (a memfd: the image's root is read-only, and a key must not touch a disk), else
    a file of mode 0600 in a private folder (0700) that is removed at once after."""
    fd = _memory_file(pem)
    if fd is not None:
        try:
            yield f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)
        return
    with tempfile.TemporaryDirectory(prefix="pg-advisory-exporter-") as folder:
        path = os.path.join(folder, "pem")
        with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as out:
            out.write(pem)
        yield path


def _load_chain(context: ssl.SSLContext, config: TlsServerConfig, folder: Path) -> str | None:
    """The certificate and key (files or inline) into `context`; the problem, if any, never
    quoting the text."""
    with contextlib.ExitStack() as stack:

        def where(path: str, text: str) -> str:
            return str(folder / path) if path else stack.enter_context(_readable(text))

        try:
            context.load_cert_chain(
                where(config.cert_file, config.cert),
                where(config.key_file, config.key.get_secret_value()),
                password=_no_passphrase,
            )
        except _Encrypted:
            return "the key is encrypted, which Go's exporters cannot read either; decrypt it"
        except OSError as exc:  # ssl.SSLError is one
            return f"cannot load the certificate and key: {exc.strerror or exc}"
    return None


def _ssl_context(config: TlsServerConfig, folder: Path, source: str) -> ssl.SSLContext:
    def error(key: str, problem: str) -> ConfigError:
        return ConfigError(f"{source}: tls_server_config.{key}: {problem}")

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    problem = _load_chain(context, config, folder)
    if problem is not None:
        raise error("cert_file" if config.cert_file else "cert", problem)
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
        try:
            if config.client_ca_file:
                context.load_verify_locations(folder / config.client_ca_file)
            elif config.client_ca:
                context.load_verify_locations(cadata=config.client_ca)
            else:
                context.load_default_certs(ssl.Purpose.CLIENT_AUTH)  # Go uses the system's too
        except (OSError, TypeError) as exc:  # TypeError: inline text that is not ASCII
            key = "client_ca_file" if config.client_ca_file else "client_ca"
            problem = exc.strerror if isinstance(exc, OSError) else None
            raise error(key, f"cannot load: {problem or exc}") from None
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
        allowed_sans=frozenset(tls.client_allowed_sans or ()),
        rate_limit=config.rate_limit.bucket,
    )
