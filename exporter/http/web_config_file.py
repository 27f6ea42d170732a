"""The web configuration file's model (--web.config.file), in the exporter-toolkit format.

The same keys and meaning as every Go exporter (node_exporter, postgres_exporter) and
Prometheus itself, so one file and `promtool check web-config` serve them all: TLS (with
certificates in files or inline, and the SANs a client certificate must have), basic auth
users (bcrypt hashes), extra response headers and a rate limit. Relative paths are relative
to the file's folder. What Python's ssl module cannot honour is refused with the key named,
never ignored: a file that asks for a protection we would not give must not start.
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Mapping
from decimal import Decimal
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

from pg_advisory_exporter.validation import Strict

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
