"""Probed host names against a real DNS server that never answers some of them: the exporter
runs in a mount namespace of its own whose /etc/resolv.conf names the test's server."""

from __future__ import annotations

import os
import re
import socket
import struct
import threading
import time
import urllib.parse
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from support import MONITOR_PASSWORD, RunningExporter, StartExporter, wait_until

from devtools.embedded_postgres import EmbeddedPostgres

# resolv.conf takes no port: the server has port 53 of a loopback address of its own.
DNS_ADDRESS = "127.0.0.9"
TYPE_A, CLASS_IN = 1, 1
NOERROR, NXDOMAIN = 0, 3
FLOOD = 100


def _question(query: bytes) -> tuple[str, int, int]:
    """The name (lower case, no trailing dot) and type a query asks, and where it ends."""
    labels: list[str] = []
    at = 12  # after the header
    while query[at]:
        labels.append(query[at + 1 : at + 1 + query[at]].decode().lower())
        at += 1 + query[at]
    (qtype,) = struct.unpack_from("!H", query, at + 1)
    return ".".join(labels), qtype, at + 5


def _reply(query: bytes, name: str, qtype: int, end: int) -> bytes:
    """good.test's A record (127.0.0.1), no record of another type, or NXDOMAIN."""
    qid, flags = struct.unpack_from("!HH", query)
    records = b""
    if name == "good.test" and qtype == TYPE_A:
        records = b"\xc0\x0c" + struct.pack("!HHIH", TYPE_A, CLASS_IN, 60, 4)
        records += socket.inet_aton("127.0.0.1")
    rcode = NOERROR if name == "good.test" else NXDOMAIN
    # A response (QR), recursion desired as asked, recursion available.
    header_flags = 0x8000 | (flags & 0x0100) | 0x0080 | rcode
    header = struct.pack("!HHHHHH", qid, header_flags, 1, len(records) > 0, 0, 0)
    return header + query[12:end] + records


class _Dns:
    """A DNS server over UDP: good.test is 127.0.0.1 with no AAAA record, names starting
    with `hang` are never answered, any other is NXDOMAIN. `asked` holds every name queried."""

    def __init__(self) -> None:
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._socket.bind((DNS_ADDRESS, 53))
        self.asked: set[str] = set()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                query, client = self._socket.recvfrom(512)
            except OSError:  # closed
                return
            name, qtype, end = _question(query)
            self.asked.add(name)
            if not name.startswith("hang"):
                self._socket.sendto(_reply(query, name, qtype, end), client)

    def close(self) -> None:
        self._socket.close()


@pytest.fixture
def dns() -> Iterator[_Dns]:
    if os.geteuid() != 0:
        pytest.skip("port 53 and a mount namespace of the exporter's own need root")
    server = _Dns()
    yield server
    server.close()


def _threads(pid: int) -> int:
    """How many threads the process has."""
    status = Path(f"/proc/{pid}/status").read_text()
    found = re.search(r"^Threads:\s+(\d+)$", status, re.MULTILINE)
    assert found, status
    return int(found[1])


def _probe(exporter: RunningExporter, target: str) -> tuple[int, str]:
    query = urllib.parse.urlencode({"target": target, "auth_module": "fleet"})
    return exporter.get(f"/probe?{query}")


@pytest.mark.any_version
def test_a_name_resolves_while_a_hundred_names_never_do(
    pg: EmbeddedPostgres, start_exporter: StartExporter, dns: _Dns, tmp_path: Path
) -> None:
    resolv_conf = tmp_path / "resolv.conf"
    # The lookups of hung names give up after 3 s, after the probes' 2 s wait: the test
    # sees their threads end.
    resolv_conf.write_text(f"nameserver {DNS_ADDRESS}\noptions timeout:3 attempts:1\n")
    password_file = tmp_path / "monitor-password"
    password_file.write_text(MONITOR_PASSWORD)
    module = {
        "user": "monitor",
        "password_file": str(password_file),
        "options": {"sslmode": "disable"},
        # A loopback address only a network admits; the names are looked up through "*.test".
        "allowed_targets": ["127.0.0.1/32", "*.test"],
    }
    exporter = start_exporter(
        config={"auth_modules": {"fleet": module}},
        # The namespace is the exporter's: sh execs it, and the test's /etc/resolv.conf stays.
        prefix=[
            "unshare", "--mount", "sh", "-c",
            'mount --bind "$0" /etc/resolv.conf && exec "$@"', str(resolv_conf),
        ],
    )  # fmt: skip
    pid = exporter.process.pid
    status, body = _probe(exporter, f"nowhere.test:{pg.port}/postgres")
    assert (status, "nowhere.test" in dns.asked) == (502, True), body  # asks the test's DNS
    # A first target starts the threads that collect and sweep discovered targets.
    status, body = _probe(exporter, f"127.0.0.1:{pg.port}/postgres")
    assert status == 200, body
    before = _threads(pid)

    with ThreadPoolExecutor(FLOOD) as flooding:
        flood = [
            flooding.submit(_probe, exporter, f"hang-{i}.test:{pg.port}/postgres")
            for i in range(FLOOD)
        ]
        # Each probe being served has a thread of the exporter's.
        wait_until(
            lambda: _threads(pid) >= before + FLOOD,
            10,
            lambda: f"{FLOOD} probes in the exporter: {_threads(pid) - before} threads more",
            0.01,
        )
        started = time.monotonic()
        status, body = _probe(exporter, f"good.test:{pg.port}/postgres")
        took = time.monotonic() - started
        assert status == 200, f"{status} after {took:.2f}s: {body}"
        # All of them being looked up at once (the last queries may still be on their way).
        wait_until(
            lambda: len({name for name in dns.asked if name.startswith("hang")}) == FLOOD,
            5,
            lambda: f"{FLOOD} names asked of the DNS server: {len(set(dns.asked))}",
            0.01,
        )
        during = _threads(pid)
        answers = [probe.result() for probe in flood]
    assert {status for status, _ in answers} == {502}
    # One thread per probe served and one per name looked up, no more; and they end.
    assert during <= before + 2 * FLOOD + 5
    wait_until(
        lambda: _threads(pid) <= before + 2,
        10,
        lambda: f"the lookups' threads ended: {_threads(pid)}, {before} before the flood",
    )
