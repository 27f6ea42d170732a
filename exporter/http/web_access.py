"""Enforcing the web configuration: TLS on every connection (and the client certificate's
SANs), the rate limit, basic auth and headers on every answer, and the file (with the
certificates it names) read again when any of them changes.

As exporter-toolkit does, a rotated certificate or a new user takes effect on the next
connection or request, without a restart. A change that cannot be loaded (a certificate
written before its key, a typo), or that would weaken the protection (TLS on or off, every
user gone, every allowed SAN gone, an empty file: what an editor or `cat new > web.yml`
leaves mid-write), is logged and the last good configuration stays. A new rate limit takes
effect at once, a removed one too: it bounds the exporter's work, not who may read it.
"""

from __future__ import annotations

import binascii
import hmac
import ipaddress
import logging
import math
import os
import socket
import ssl
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import bcrypt

from pg_advisory_exporter.endpoints import HEALTHY_PATH
from pg_advisory_exporter.metrics import Sample, web_config_reload, web_rate_limited
from pg_advisory_exporter.validation import ConfigError

from .rate_limit import TokenBucket
from .web_config import WebSettings, read_web_config

log = logging.getLogger(__name__)

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]

# A bcrypt check costs tens to hundreds of milliseconds of CPU. Prometheus sends the same
# credentials every scrape, so a password found right is remembered (as a keyed digest, never
# the password itself) and not checked again while the user's hash stays; wrong ones are not
# remembered, so no flood of them can push the right one out. Checks of passwords not known
# to be right run this many at a time, and one over it is refused at once (429) rather than
# queued: a flood takes at most one core and delays no known-good client.
_CHECKS_AT_ONCE = 1
CHALLENGE = 'Basic realm="pg-advisory-exporter", charset="UTF-8"'

Stamp = tuple[tuple[int, int, int] | None, ...]


def _stamp(files: Iterable[Path]) -> Stamp:
    """What changes when a file is rewritten or a Kubernetes secret's symlink is swapped."""
    stamps: list[tuple[int, int, int] | None] = []
    for path in files:
        try:
            status = os.stat(path)
        except OSError:
            stamps.append(None)
        else:
            stamps.append((status.st_ino, status.st_mtime_ns, status.st_size))
    return tuple(stamps)


def _cost(hashed: bytes) -> int:
    """A bcrypt hash's cost, the `12` of `$2b$12$...` (web_config checked the form)."""
    return int(hashed[4:6])


def certificate_sans(certificate: dict[str, Any]) -> list[str]:
    """A verified certificate's SANs as Go's crypto/x509 spells those exporter-toolkit
    matches: DNS names, e-mail addresses, IP addresses (net.IP's String(): compressed
    IPv6, an IPv4-mapped one as IPv4; Python's ssl writes them in full, upper case), URIs."""
    found: list[str] = []
    for kind, value in certificate.get("subjectAltName", ()):
        if kind == "IP Address":
            try:
                address = ipaddress.ip_address(value.strip())
            except ValueError:  # "<invalid>": an address of neither 4 nor 16 bytes
                continue
            if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
                address = address.ipv4_mapped
            found.append(str(address))
        elif kind in ("DNS", "email", "URI"):
            found.append(value)
    return found


class CertificateRefused(OSError):
    """A client whose verified certificate has none of the allowed SANs: its connection is
    closed after the handshake, before any request is read."""


def _bucket(limit: tuple[float, int] | None, kept: TokenBucket | None) -> TokenBucket | None:
    """The bucket for a rate limit, the one kept retuned if there is one."""
    if limit is None:
        return None
    return TokenBucket(*limit) if kept is None else kept.retuned(*limit)


def _credentials(header: str | None) -> tuple[str, bytes] | None:
    """The user and password of an `Authorization: Basic` header, if it is one."""
    if header is None:
        return None
    scheme, _, encoded = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = binascii.a2b_base64(encoded.strip(), strict_mode=True)
    except binascii.Error:
        return None
    user, colon, password = decoded.partition(b":")
    if not colon:
        return None
    try:
        return user.decode(), password
    except UnicodeDecodeError:
        return None


# Refused clients (address and SANs) whose refusal was logged as a warning, remembered.
_REFUSALS_SAID = 1000


class WebAccess:
    """The web configuration in force; safe to use from every request thread."""

    def __init__(self, settings: WebSettings) -> None:
        self._settings = settings
        self._stamp = _stamp(settings.files)
        self._reload_lock = threading.Lock()
        # pg_advisory_exporter_web_config_last_reload_successful
        self.last_reload_successful = True
        self._checks = threading.BoundedSemaphore(_CHECKS_AT_ONCE)
        self._digest_key = os.urandom(32)  # a digest kept in memory is no password hash to crack
        self._verified: dict[str, tuple[bytes, bytes]] = {}  # user: (hash, password's digest)
        # Per cost, the hash a name that is not a user is checked against, of the highest cost
        # among the users' hashes, so that an unknown name takes as long as a known one (a
        # fixed hash of cost 10 answered 160 ms sooner than users of cost 12).
        self._decoys: dict[int, bytes] = {}
        self._bucket = _bucket(settings.rate_limit, None)
        self._counting = threading.Lock()
        self.rate_limited = 0  # pg_advisory_exporter_web_rate_limited_total
        self._refusals: dict[tuple[str, str], None] = {}  # said of refused clients, oldest first

    def samples(self) -> list[Sample]:
        """The exporter's series of the web configuration: whether the last change to the
        file took effect, the requests the rate limit refused."""
        return [web_config_reload(self.last_reload_successful), web_rate_limited(self.rate_limited)]

    @property
    def tls(self) -> bool:
        """Fixed at start: a server does not turn from HTTP to HTTPS under its clients."""
        return self._settings.tls is not None

    def current(self) -> WebSettings:
        """The settings, read again first if the file or a certificate has changed."""
        settings = self._settings
        stamp = _stamp(settings.files)
        if stamp == self._stamp:
            return settings
        with self._reload_lock:
            if self._settings is settings and stamp != self._stamp:
                self._reload(stamp)
            return self._settings

    def _reload(self, stamp: Stamp) -> None:
        path = self._settings.path
        self._stamp = stamp  # a change that fails is logged once, and retried when it changes
        try:
            settings = read_web_config(path, allow_empty=False)
        except ConfigError as exc:
            self._refuse(str(exc))
            return
        if (settings.tls is not None) != self.tls:
            self._refuse(f"{path}: turning TLS on or off takes a restart")
            return
        if self._settings.users and not settings.users:
            self._refuse(f"{path}: removing every basic auth user takes a restart")
            return
        if self._settings.allowed_sans and not settings.allowed_sans:
            self._refuse(f"{path}: removing client_allowed_sans takes a restart")
            return
        self._bucket = _bucket(settings.rate_limit, self._bucket)
        self._settings = settings
        self._stamp = _stamp(settings.files)
        self.last_reload_successful = True
        verified = self._verified.items()  # a password changed or a user gone is forgotten
        self._verified = {u: kept for u, kept in verified if settings.users.get(u) == kept[0]}
        log.info("web configuration reloaded", extra={"file": str(path), "now": settings.summary})

    def _refuse(self, error: str) -> None:
        self.last_reload_successful = False
        log.error("web configuration not reloaded; the last one stays", extra={"error": error})

    def wrap(self, connection: socket.socket) -> ssl.SSLSocket:
        """TLS on an accepted connection, with the certificate in force now; closed, and
        CertificateRefused raised, when the client's certificate has none of the allowed SANs
        (exporter-toolkit fails the handshake; Python's ssl has no hook in it)."""
        settings = self.current()
        assert settings.tls is not None, "wrap() is only called when TLS is on"
        wrapped = settings.tls.wrap_socket(connection, server_side=True)
        if not settings.allowed_sans:
            return wrapped
        sans = certificate_sans(
            wrapped.getpeercert() or {}
        )  # verified: client_auth_type requires it
        if settings.allowed_sans.isdisjoint(sans):
            client = wrapped.getpeername()[0]
            wrapped.close()
            said = ", ".join(sans)[:512] or "none"
            # A refused peer may reconnect in a loop: a warning for each client and SANs
            # once (the last _REFUSALS_SAID of them remembered), the repeats at debug.
            with self._counting:
                first = (client, said) not in self._refusals
                self._refusals[client, said] = None
                if len(self._refusals) > _REFUSALS_SAID:
                    del self._refusals[next(iter(self._refusals))]
            log.log(
                logging.WARNING if first else logging.DEBUG,
                "TLS client refused: its certificate has none of client_allowed_sans",
                extra={"client": client, "sans": said},
            )
            raise CertificateRefused(f"{client}: no allowed SAN in its certificate")
        return wrapped

    def _limited(self) -> float | None:
        """None if the rate limit lets a request through, else the seconds until it would."""
        bucket = self._bucket
        wait = None if bucket is None else bucket.take()
        if wait is not None:
            with self._counting:
                self.rate_limited += 1
        return wait

    def _authorized(self, settings: WebSettings, header: str | None) -> bool | None:
        """Whether the header names a user and its password; None when too many checks run."""
        credentials = _credentials(header)
        if credentials is None:
            return False
        user, password = credentials
        hashed = settings.users.get(user)
        digest = hmac.digest(self._digest_key, password, "sha256")
        kept = self._verified.get(user)
        if kept is not None and kept[0] == hashed and hmac.compare_digest(kept[1], digest):
            return True
        if not self._checks.acquire(blocking=False):
            return None
        try:
            cost = max(map(_cost, settings.users.values()))
            try:
                matches = bcrypt.checkpw(password, hashed or self._decoy(cost))
            except ValueError:  # longer than bcrypt's 72 bytes: no hash matches it
                matches = False
        finally:
            self._checks.release()
        if matches and hashed is not None:
            self._verified[user] = (hashed, digest)
            return True
        return False

    def _decoy(self, cost: int) -> bytes:
        decoy = self._decoys.get(cost)
        if decoy is None:
            # Made on first use, in the time a check of that cost takes: no answer is faster.
            decoy = self._decoys[cost] = bcrypt.hashpw(os.urandom(16), bcrypt.gensalt(cost))
        return decoy

    def guard(self, app: WsgiApp) -> WsgiApp:
        """Every endpoint behind the rate limit (liveness aside) and the file's users, and its
        headers on every answer."""

        def guarded(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
            settings = self.current()

            def start(status: str, headers: list[tuple[str, str]], *exc_info: Any) -> Any:
                return start_response(status, [*headers, *settings.headers], *exc_info)

            # Before the password, as in Go: a refusal costs nothing. The kubelet's liveness
            # probe is never refused: a flood must not have the exporter restarted.
            wait = None if environ.get("PATH_INFO") == HEALTHY_PATH else self._limited()
            if wait is not None:
                status, body = "429 Too Many Requests", b"Too Many Requests\n"
                headers = [("Retry-After", str(max(1, math.ceil(wait))))]
            else:
                authorized = not settings.users or self._authorized(
                    settings, environ.get("HTTP_AUTHORIZATION")
                )
                if authorized:
                    return app(environ, start)
                if authorized is None:
                    status, body = "429 Too Many Requests", b"Too many password checks; retry\n"
                    headers = [("Retry-After", "1")]
                else:
                    status, body = "401 Unauthorized", b"Unauthorized\n"
                    headers = [("WWW-Authenticate", CHALLENGE)]
            start(status, [*headers, ("Content-Type", "text/plain; charset=utf-8")])
            return [] if environ.get("REQUEST_METHOD") == "HEAD" else [body]

        return guarded
