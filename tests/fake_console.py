"""A PgBouncer admin console that lies: it logs anyone in and answers each SHOW command with
the rows it is given, in the column types it is given, which a real PgBouncer cannot be made
to do. It speaks just enough of the PostgreSQL protocol (v3) for libpq: startup, the simple
and the unnamed extended query, termination. On 127.0.0.1, in threads, for one test."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

_SSL_REQUEST, _GSS_REQUEST = 80877103, 80877104
TEXT, INT4, FLOAT8 = 25, 23, 701  # type OIDs a column can be declared with

# A column: its name, type OID, and the value of each row in text form (None: NULL).
Column = tuple[str, int, Sequence[str | None]]


def _message(kind: bytes, body: bytes = b"") -> bytes:
    return kind + struct.pack("!i", len(body) + 4) + body


def _description(columns: Sequence[Column]) -> bytes:
    """RowDescription: every column in text format."""
    fields = b"".join(
        name.encode() + b"\0" + struct.pack("!ihihih", 0, 0, oid, -1, -1, 0)
        for name, oid, _ in columns
    )
    return _message(b"T", struct.pack("!h", len(columns)) + fields)


def _rows(columns: Sequence[Column], command: str) -> bytes:
    """DataRows and CommandComplete."""
    rows = len(columns[0][2]) if columns else 0
    out = b""
    for i in range(rows):
        values = b""
        for _, _, cells in columns:
            cell = cells[i]
            data = b"" if cell is None else cell.encode()
            values += struct.pack("!i", -1 if cell is None else len(data)) + data
        out += _message(b"D", struct.pack("!h", len(columns)) + values)
    return out + _message(b"C", f"{command.split(maxsplit=1)[0]} {rows}".encode() + b"\0")


def _read(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the client went away")
        data += chunk
    return data


@dataclass
class FakeConsole:
    """Answers "SHOW X" with `tables["SHOW X"]` (no rows for a command it is not given)."""

    tables: Mapping[str, Sequence[Column]]
    port: int = 0
    asked: list[str] = field(default_factory=list)

    def _startup(self, conn: socket.socket) -> None:
        while True:
            (length,) = struct.unpack("!i", _read(conn, 4))
            (code,) = struct.unpack("!i", _read(conn, 4))
            _read(conn, length - 8)  # the startup parameters: anyone may log in
            if code not in (_SSL_REQUEST, _GSS_REQUEST):
                break
            conn.sendall(b"N")  # no encryption: the startup packet follows
        parameters = (("server_version", "1.18.0/bouncer"), ("client_encoding", "UTF8"),
                      ("standard_conforming_strings", "on"))  # fmt: skip
        conn.sendall(
            _message(b"R", struct.pack("!i", 0))  # AuthenticationOk
            + b"".join(_message(b"S", f"{k}\0{v}\0".encode()) for k, v in parameters)
            + _message(b"K", struct.pack("!ii", 1, 1))
            + _message(b"Z", b"I")
        )

    def _serve(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError, ConnectionError):
            self._startup(conn)
            statement = ""
            while True:
                kind = _read(conn, 1)
                (length,) = struct.unpack("!i", _read(conn, 4))
                body = _read(conn, length - 4)
                if kind == b"X":
                    return
                if kind in (b"Q", b"P"):  # simple query, or Parse of the unnamed statement
                    start = 0 if kind == b"Q" else body.index(b"\0") + 1
                    statement = body[start : body.index(b"\0", start)].decode().strip()
                    self.asked.append(statement)
                columns = self.tables.get(statement, ())
                if kind == b"Q":
                    answer = _description(columns) + _rows(columns, statement)
                    conn.sendall(answer + _message(b"Z", b"I"))
                elif kind == b"P":
                    conn.sendall(_message(b"1"))  # ParseComplete
                elif kind == b"B":
                    conn.sendall(_message(b"2"))  # BindComplete
                elif kind == b"D":  # Describe (the portal)
                    conn.sendall(_description(columns))
                elif kind == b"E":
                    conn.sendall(_rows(columns, statement))
                elif kind == b"S":
                    conn.sendall(_message(b"Z", b"I"))

    @contextlib.contextmanager
    def running(self) -> Iterator[FakeConsole]:
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        server.settimeout(0.1)
        self.port = server.getsockname()[1]
        stop = threading.Event()

        def accept() -> None:
            while not stop.is_set():
                try:
                    conn, _ = server.accept()
                except TimeoutError:
                    continue
                conn.settimeout(10)
                threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

        thread = threading.Thread(target=accept, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join()
            server.close()

    def admin_dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} dbname=pgbouncer user=stats sslmode=disable"
