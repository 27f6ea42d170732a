"""The TLS context a web configuration asks for, its certificate and key from files or memory."""

from __future__ import annotations

import contextlib
import os
import ssl
import tempfile
from collections.abc import Iterator
from pathlib import Path

from pg_advisory_exporter.validation import ConfigError

from .web_config_file import CIPHER_SUITES, CLIENT_AUTH_TYPES, TLS_VERSIONS, TlsServerConfig


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


def ssl_context(config: TlsServerConfig, folder: Path, source: str) -> ssl.SSLContext:
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
