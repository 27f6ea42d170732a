"""Enforcing the web configuration: TLS on every connection, basic auth and headers on every
answer, and the file (with the certificates it names) read again when any of them changes.

As exporter-toolkit does, a rotated certificate or a new user takes effect on the next
connection or request, without a restart. A change that cannot be loaded (a certificate
written before its key, a typo) is logged and the last good configuration stays.
"""

from __future__ import annotations

import binascii
import hashlib
import logging
import os
import socket
import ssl
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import bcrypt

from .schema import ConfigError
from .web_config import WebSettings, read_web_config

log = logging.getLogger(__name__)

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]

# Checked for a user that does not exist, so that the answer takes as long as for one that
# does and a client cannot find out names by timing (exporter-toolkit does the same).
_NO_USER_HASH = b"$2b$10$G8ZNbjlN397rbLLBsXYuguaHCi.nOJZsDrwukcno4yrzcF7GDlPYi"
# A bcrypt check costs tens of milliseconds of CPU: Prometheus sends the same credentials
# every scrape, so verdicts are kept (as digests, never the password itself).
_VERDICTS_KEPT = 1024
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


class WebAccess:
    """The web configuration in force; safe to use from every request thread."""

    def __init__(self, settings: WebSettings) -> None:
        self._settings = settings
        self._stamp = _stamp(settings.files)
        self._reload_lock = threading.Lock()
        self._bcrypt_lock = threading.Lock()  # one check at a time: a flood costs one core
        self._verdicts: dict[bytes, bool] = {}

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
            settings = read_web_config(path)
        except ConfigError as exc:
            log.error(
                "web configuration not reloaded; the last one stays", extra={"error": str(exc)}
            )
            return
        if (settings.tls is not None) != self.tls:
            log.error(
                "web configuration not reloaded; the last one stays",
                extra={"error": f"{path}: turning TLS on or off takes a restart"},
            )
            return
        self._settings = settings
        self._stamp = _stamp(settings.files)
        log.info("web configuration reloaded", extra={"file": str(path)})

    def wrap(self, connection: socket.socket) -> ssl.SSLSocket:
        """TLS on an accepted connection, with the certificate in force now."""
        context = self.current().tls
        assert context is not None, "wrap() is only called when TLS is on"
        return context.wrap_socket(connection, server_side=True)

    def _authorized(self, settings: WebSettings, header: str | None) -> bool:
        credentials = _credentials(header)
        if credentials is None:
            return False
        user, password = credentials
        hashed = settings.users.get(user)
        key = hashlib.sha256(b"\0".join((user.encode(), hashed or b"", password))).digest()
        verdict = self._verdicts.get(key)
        if verdict is None:
            with self._bcrypt_lock:
                try:
                    matches = bcrypt.checkpw(password, hashed or _NO_USER_HASH)
                except ValueError:  # longer than bcrypt's 72 bytes: no hash matches it
                    matches = False
                verdict = matches and hashed is not None
                if len(self._verdicts) >= _VERDICTS_KEPT:
                    self._verdicts.pop(next(iter(self._verdicts)))
                self._verdicts[key] = verdict
        return verdict

    def guard(self, app: WsgiApp) -> WsgiApp:
        """Every endpoint behind the file's users, and its headers on every answer."""

        def guarded(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
            settings = self.current()

            def start(status: str, headers: list[tuple[str, str]], *exc_info: Any) -> Any:
                return start_response(status, [*headers, *settings.headers], *exc_info)

            if settings.users and not self._authorized(settings, environ.get("HTTP_AUTHORIZATION")):
                start(
                    "401 Unauthorized",
                    [
                        ("WWW-Authenticate", CHALLENGE),
                        ("Content-Type", "text/plain; charset=utf-8"),
                    ],
                )
                return [] if environ.get("REQUEST_METHOD") == "HEAD" else [b"Unauthorized\n"]
            return app(environ, start)

        return guarded
