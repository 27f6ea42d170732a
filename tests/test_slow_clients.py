"""Clients that send their request a byte at a time: a whole deadline from the accept, inside
TLS too, and scrapes and liveness probes that a crowd of them never keeps waiting."""

from __future__ import annotations

import socket
import ssl
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import bcrypt
import pytest
import yaml
from support import REFUSED_DSN, RunningExporter, StartExporter, Tls, basic_auth, wait_until

from pg_advisory_exporter.http.connections import Connections
from pg_advisory_exporter.http.server import MAX_PER_ADDRESS, REQUEST_DEADLINE

# Version-independent (tests/conftest.py): no server answers these exporters' DSN.
pytestmark = pytest.mark.any_version

PASSWORD = "drip-Pw-51c2"
DRIPPERS = 300
DRIP_INTERVAL = 1.0  # below the old per-read timeout of 5 s, which kept such a client forever
# A request that never ends: a header line that goes on and on.
ENDLESS_REQUEST = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Drip: " + b"a" * 60_000
# A TLS record header announcing a ClientHello of 512 bytes, then its first bytes.
ENDLESS_HELLO = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 500

Connect = Callable[[], socket.socket]


def _plain(port: int, source: str = "127.0.0.1") -> Connect:
    return lambda: socket.create_connection(
        ("127.0.0.1", port), timeout=2, source_address=(source, 0)
    )


def _in_tls(port: int, tls: Tls) -> Connect:
    """A TLS session set up at once, then a request dripped inside it."""
    context = tls.client()

    def connect() -> socket.socket:
        raw = socket.create_connection(("127.0.0.1", port), timeout=2)
        try:
            return context.wrap_socket(raw, server_hostname="127.0.0.1")
        except BaseException:
            raw.close()
            raise

    return connect


class Drippers:
    """Clients each sending one byte of `payload` every DRIP_INTERVAL for as long as they are
    let; one the server cuts connects again, as an attacker's would (as many reconnections
    in all as there are clients)."""

    def __init__(self, connects: list[Connect], payload: bytes) -> None:
        self._connects = connects
        self._payload = payload
        self._sockets: list[tuple[socket.socket, int] | None] = [None] * len(connects)
        self._stop = threading.Event()
        self._reconnections_left = len(connects)
        self.cut = 0
        with ThreadPoolExecutor(32) as pool:  # the old server let some wait in its queue
            list(pool.map(self._connect, range(len(connects))))
        self.connected = time.monotonic()
        self._thread = threading.Thread(target=self._drip, daemon=True)
        self._thread.start()

    def _connect(self, index: int) -> None:
        try:
            sock = self._connects[index]()
        except OSError:  # the old server's full listen queue: the attack holds anyway
            self._sockets[index] = None
            return
        try:
            sock.send(self._payload[:1])
        except OSError:
            sock.close()
            self._sockets[index] = None
            return
        self._sockets[index] = (sock, 1)

    def _drip(self) -> None:
        while not self._stop.wait(DRIP_INTERVAL):
            for index, held in enumerate(self._sockets):
                if held is None:
                    continue
                sock, sent = held
                try:
                    sock.send(self._payload[sent : sent + 1])
                    self._sockets[index] = (sock, sent + 1)
                except OSError:
                    sock.close()
                    self.cut += 1
                    self._sockets[index] = None
                    if self._reconnections_left > 0:
                        self._reconnections_left -= 1
                        self._connect(index)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        for held in self._sockets:
            if held is not None:
                held[0].close()


@contextmanager
def _dripping(connects: list[Connect], payload: bytes) -> Iterator[Drippers]:
    drippers = Drippers(connects, payload)
    try:
        yield drippers
    finally:
        drippers.close()


def _timed_get(
    url: str, context: ssl.SSLContext | None = None, headers: Mapping[str, str] | None = None
) -> float:
    """Seconds for a 200 answer; the old server kept it waiting past the 5 s timeout."""
    started = time.monotonic()
    request = urllib.request.Request(url, headers=dict(headers or {}))
    with urllib.request.urlopen(request, timeout=5, context=context) as response:
        assert response.status == 200
        response.read()
    return time.monotonic() - started


def _threads(exporter: RunningExporter) -> int:
    status = Path(f"/proc/{exporter.process.pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("Threads:")).split()[1])


def _latencies_while_dripping(
    get: Callable[[str], float], exporter: RunningExporter, drippers: Drippers
) -> tuple[float, int, str]:
    """Scrapes and liveness probes until the drippers' deadlines are past (cut ones connect
    again): the slowest answer, the most threads the exporter had, and a report."""
    seen: dict[str, list[float]] = {"/metrics": [], "/-/healthy": []}
    threads = [_threads(exporter)]
    while time.monotonic() < drippers.connected + REQUEST_DEADLINE + 1:
        for path, times in seen.items():
            times.append(get(path))
        threads.append(_threads(exporter))
        time.sleep(0.2)
    report = ", ".join(f"{path} max {max(times):.3f}s" for path, times in seen.items())
    slowest = max(max(times) for times in seen.values())
    return slowest, max(threads), f"{report}, threads up to {max(threads)}, {drippers.cut} cut"


def _baseline(get: Callable[[str], float]) -> float:
    """The bound on an answer among drippers: a second, or ten times the slowest without."""
    return max(1.0, 10 * max(get(path) for path in ("/metrics", "/-/healthy") for _ in range(3)))


def test_300_drippers_leave_scrapes_and_liveness_answering(start_exporter: StartExporter) -> None:
    exporter = start_exporter("--dsn", REFUSED_DSN)

    def get(path: str) -> float:
        return _timed_get(exporter.base + path)

    bound = _baseline(get)
    # From three other addresses than the scrapes': past the cap in all, not per address.
    sources = [f"127.0.0.{2 + i % 3}" for i in range(DRIPPERS)]
    with _dripping([_plain(exporter.port, source) for source in sources], ENDLESS_REQUEST) as d:
        slowest, _, report = _latencies_while_dripping(get, exporter, d)
    print(f"plain, {DRIPPERS} drippers from 3 addresses: {report}")
    assert slowest < bound, report
    assert d.cut > 0, "the exporter cut no dripping client"


def _secured(start_exporter: StartExporter, tls: Tls) -> RunningExporter:
    web_file = tls.folder / "web.yml"
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()
    web_file.write_text(
        yaml.safe_dump(
            {
                "tls_server_config": {"cert_file": "server.pem", "key_file": "server-key.pem"},
                "basic_auth_users": {"prometheus": hashed},
            }
        )
    )
    return start_exporter("--dsn", REFUSED_DSN, "--web.config.file", str(web_file))


def test_300_drippers_inside_tls_leave_scrapes_and_liveness_answering(
    start_exporter: StartExporter, tls: Tls
) -> None:
    exporter = _secured(start_exporter, tls)
    context, right = tls.client(), basic_auth("prometheus", PASSWORD)

    def get(path: str) -> float:
        return _timed_get(f"https://127.0.0.1:{exporter.port}{path}", context, right)

    bound = _baseline(get)
    # From the scrapes' own address, before any credentials: past the cap per address.
    with _dripping([_in_tls(exporter.port, tls)] * DRIPPERS, ENDLESS_REQUEST) as d:
        slowest, threads, report = _latencies_while_dripping(get, exporter, d)
    print(f"TLS, {DRIPPERS} drippers inside the session: {report}")
    assert slowest < bound, report
    assert d.cut > 0, "the exporter cut no dripping client"
    # One address holds at most its share of the threads; the rest serve others.
    assert threads <= MAX_PER_ADDRESS + 16, report


def test_stalled_clients_neither_delay_a_scrape_nor_stay_forever(
    start_exporter: StartExporter,
) -> None:
    exporter = start_exporter("--dsn", REFUSED_DSN)
    stalled = [socket.create_connection(("127.0.0.1", exporter.port)) for _ in range(200)]
    try:
        stalled[-1].sendall(b"GET /metrics HTTP/1.0\r\nX-Half: ")  # and never the rest
        elapsed, scrape = exporter.timed_scrape()
        assert elapsed < 2.0
        assert scrape.value("pg_advisory_up", target="default") == 0
        # A connection that says nothing, or stops halfway, is closed at the deadline.
        wait_until(
            lambda: all(_was_cut(sock) for sock in (stalled[0], stalled[100], stalled[-1])),
            REQUEST_DEADLINE + 5,
            "the exporter closes stalled connections",
        )
    finally:
        for sock in stalled:
            sock.close()


def _seconds_until_cut(connect: Connect, payload: bytes) -> float | None:
    """Connect and drip `payload` a byte every 0.5 s: the seconds until the server cuts the
    connection, None if it still serves it well past the deadline."""
    started = time.monotonic()
    with connect() as sock:
        sock.settimeout(0.5)
        for byte in range(len(payload)):
            if time.monotonic() - started > REQUEST_DEADLINE + 5:
                return None
            try:
                sock.send(payload[byte : byte + 1])
                if sock.recv(1) == b"":
                    break
            except TimeoutError:
                continue  # still open, nothing said: drip on
            except OSError:
                break
    return time.monotonic() - started


def test_a_client_dripping_past_the_deadline_is_cut_at_it(
    start_exporter: StartExporter, tls: Tls
) -> None:
    plain, secured = start_exporter("--dsn", REFUSED_DSN), _secured(start_exporter, tls)
    cases = {
        "a plain request": (_plain(plain.port), ENDLESS_REQUEST),
        "a TLS handshake": (_plain(secured.port), ENDLESS_HELLO),
        "a request inside TLS": (_in_tls(secured.port, tls), ENDLESS_REQUEST),
    }
    with ThreadPoolExecutor(len(cases)) as pool:
        timed = {what: pool.submit(_seconds_until_cut, *case) for what, case in cases.items()}
    seconds = {what: future.result() for what, future in timed.items()}
    print(f"cut after: {seconds}")
    for what, elapsed in seconds.items():
        assert elapsed is not None, f"{what} dripped was still read after {REQUEST_DEADLINE + 5}s"
        # The deadline counts from the accept, a moment after `started`.
        assert REQUEST_DEADLINE - 0.5 < elapsed < REQUEST_DEADLINE + 1.5, f"{what}: {elapsed:.2f}s"
    assert plain.process.poll() is None, "cut, not crashed"
    assert secured.process.poll() is None, "cut, not crashed"


@contextmanager
def _pairs(count: int) -> Iterator[list[tuple[socket.socket, socket.socket]]]:
    """Connected pairs: the server's end of each, and its client's."""
    pairs = [socket.socketpair() for _ in range(count)]
    try:
        yield pairs
    finally:
        for server_end, client_end in pairs:
            server_end.close()
            client_end.close()


def _was_cut(client_end: socket.socket) -> bool:
    client_end.settimeout(0.01)
    try:
        return client_end.recv(1) == b""
    except TimeoutError:
        return False


def test_at_the_cap_of_an_address_its_oldest_reader_is_cut_or_the_new_one_refused() -> None:
    connections = Connections(limit=10, per_address=2, deadline=60)
    with _pairs(6) as pairs:
        ends = [server_end for server_end, _ in pairs]
        clients = [client_end for _, client_end in pairs]
        first, second, third = (connections.admit(ends[i], "a") for i in range(3))
        assert first is not None
        assert second is not None
        assert third is not None
        assert [_was_cut(client) for client in clients[:3]] == [True, False, False]
        # The request of the second has arrived: it is being answered, and kept.
        connections.answering(second)
        fourth = connections.admit(ends[3], "a")
        assert fourth is not None
        assert [_was_cut(client) for client in clients[1:4]] == [False, True, False]
        connections.answering(fourth)
        assert connections.admit(ends[4], "a") is None  # both of "a" being answered
        assert connections.admit(ends[5], "b") is not None  # another address has room
        assert not any(_was_cut(client) for client in (clients[1], clients[3], clients[5]))


def test_at_the_cap_in_all_the_busiest_address_gives_way() -> None:
    connections = Connections(limit=3, per_address=3, deadline=60)
    with _pairs(4) as pairs:
        admitted = [connections.admit(pairs[i][0], address) for i, address in enumerate("aab")]
        assert None not in admitted
        assert connections.admit(pairs[3][0], "c") is not None
        assert [_was_cut(client) for _, client in pairs] == [True, False, False, False]


def test_a_reader_is_cut_at_its_deadline_and_an_answered_one_is_not() -> None:
    connections = Connections(limit=10, per_address=10, deadline=0.3)
    watchdog = threading.Thread(target=connections.watch)
    watchdog.start()
    try:
        with _pairs(2) as [(reading, reader), (answered, answering)]:
            started = time.monotonic()
            kept = connections.admit(answered, "a")
            assert kept is not None
            connections.answering(kept)
            assert connections.admit(reading, "a") is not None
            while not _was_cut(reader) and time.monotonic() - started < 5:
                time.sleep(0.02)
            assert 0.25 < time.monotonic() - started < 1.0
            assert not _was_cut(answering)
    finally:
        connections.stop()
        watchdog.join(timeout=5)
    assert not watchdog.is_alive()
