"""PostgreSQL connection strings: checking one, keeping its password out of messages, and
taking the password from a file."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any

from psycopg.conninfo import conninfo_to_dict, make_conninfo
from pydantic import AfterValidator


def _password_in(dsn: str) -> str | None:
    """The password written in a DSN, found without trusting the DSN to parse."""
    uri = re.match(r"^[a-z]+://[^/@:]*:([^@/]*)@", dsn)
    if uri:
        return uri.group(1)
    keyword = re.search(r"password\s*=\s*('(?:[^'\\]|\\.)*'?|\S+)", dsn)
    return keyword.group(1).strip("'") if keyword else None


def redact(message: str, dsn: str) -> str:
    """Remove a DSN and its password from a message (libpq may quote either back)."""
    password = _password_in(dsn)
    message = message.replace(dsn, "<dsn>")
    if password:
        message = message.replace(password, "<password>")
    return message


# Quoted punctuation in libpq's messages ('missing "=" after'), never a piece of the DSN.
_LIBPQ_LITERALS = ('"="', '"]"', '":"', '"/"')


def _without_fragments(message: str) -> str:
    """libpq's message with the pieces of the DSN it quotes cut out, as "...".

    libpq writes `missing "=" after "Part2xQ"`, and the piece may be part of a password. A
    piece may itself hold a quote, so everything from the first quoted piece to the last
    quote goes.
    """
    start = message.find('"')
    while start != -1 and message[start : start + 3] in _LIBPQ_LITERALS:
        start = message.find('"', start + 3)
    if start == -1:
        return message
    end = message.rfind('"') + 1
    return f'{message[:start]}"..."{message[end:]}'


def _dsn_hint(dsn: str) -> str:
    if re.match(r"^[a-z]+://", dsn):
        return "percent-encode special characters in a URI, e.g. %40 for @"
    return "quote values that contain spaces, e.g. password='a b'"


_URI_SCHEMES = ("postgresql://", "postgres://")


def _dsn_parameters(dsn: str) -> dict[str, Any]:
    # libpq reads any other scheme as a keyword=value string and complains of a missing "=".
    scheme = re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", dsn)
    if scheme and not dsn.startswith(_URI_SCHEMES):
        raise ValueError(
            f"malformed DSN: unknown scheme {scheme.group()!r} "
            f"(a URI starts with {' or '.join(_URI_SCHEMES)})"
        )
    try:
        params = conninfo_to_dict(dsn)
    except Exception as exc:  # psycopg raises ProgrammingError with libpq's message
        problem = _without_fragments(str(exc).strip())
        raise ValueError(f"malformed DSN: {problem} ({_dsn_hint(dsn)})") from None
    port = params.get("port")
    if port is not None and not all(p.isdigit() for p in str(port).split(",")):
        raise ValueError(f"malformed DSN: port {port!r} is not a number")
    return params


def _check_dsn(dsn: str) -> str:
    _dsn_parameters(dsn)
    return dsn


# A configuration field holding a DSN: refused with libpq's reason, none of its pieces quoted.
Dsn = Annotated[str, AfterValidator(_check_dsn)]


def server_of(dsn: str) -> str:
    """The server a checked DSN connects to, as HOST:PORT (hostaddr before host, a list of
    hosts as a list, the default port filled in), to tell two DSNs of one server."""
    params = _dsn_parameters(dsn)
    hosts = str(params.get("hostaddr") or params.get("host") or "").split(",")
    ports = str(params.get("port") or "5432").split(",")
    if len(ports) == 1:
        ports *= len(hosts)
    return ",".join(
        f"{host.strip().lower().removesuffix('.') or 'localhost'}:{port.strip()}"
        for host, port in zip(hosts, ports, strict=False)
    )


# A password file holds one line; one larger than this is not a password file (a device, a
# log), and is refused rather than read into memory at every connect.
MAX_PASSWORD_BYTES = 64 * 1024


def _read_password_file(path: Path) -> str:
    """The password in the file, without its line end; ValueError says why there is none.
    Opened without blocking (a FIFO with no writer gives nothing rather than hang a
    connection), and read up to MAX_PASSWORD_BYTES."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(descriptor, "rb") as file:
            data = file.read(MAX_PASSWORD_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"cannot read password_file {path}: {exc.strerror}") from None
    if data is None:  # a pipe whose writer has written nothing yet: no wait for it
        raise ValueError(f"password_file {path} has nothing to read yet (a pipe, not a file)")
    if len(data) > MAX_PASSWORD_BYTES:
        raise ValueError(
            f"password_file {path} is larger than {MAX_PASSWORD_BYTES // 1024} KiB: not a "
            "password file"
        )
    try:
        return data.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"password_file {path} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
            f"{exc.start})"
        ) from None


def check_password_source(dsn: str, password_file: Path | None) -> None:
    """Refuse a password given twice: in the DSN and in password_file. Whether the file can
    be read is not the configuration's to say: a secret missing at start makes its target
    down until it appears, as one that vanishes later does (`password_file_problem`)."""
    if password_file is not None and _dsn_parameters(dsn).get("password"):
        raise ValueError("give the password either in the DSN or in password_file, not both")


def password_file_problem(password_file: Path | None) -> str | None:
    """Why the password file cannot give a password now; None if it can (or there is none)."""
    if password_file is None:
        return None
    try:
        _read_password_file(password_file)
    except ValueError as exc:
        return str(exc)
    return None


def with_password(dsn: str, password_file: Path | None) -> str:
    """The DSN with the password from password_file, read now so that rotation works (and a
    file that appears after the start is read at the next connect); ValueError if it cannot
    be read."""
    if password_file is None:
        return dsn
    return make_conninfo(dsn, password=_read_password_file(password_file))
