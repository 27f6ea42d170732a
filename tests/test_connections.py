"""Every connection the exporter opens is closed on every path, and no collection outlives its
deadline: connect timeouts, a frozen backend, a terminated backend, a restart, a reload."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import yaml
from support import Cli, RunningExporter, Session, SilentServer, wait_until

from devtools.embedded_postgres import EmbeddedPostgres

# Version-independent (tests/conftest.py): connecting, deadlines and outages: the client's side of
# the connection.
pytestmark = pytest.mark.any_version


def _open_fds(exporter: RunningExporter) -> int:
    """The exporter's open descriptors; the socket of a scrape just answered may take a
    moment to close, so compare them with wait_until."""
    return len(os.listdir(f"/proc/{exporter.process.pid}/fd"))


def _settled_fds(exporter: RunningExporter) -> int:
    """The exporter's open descriptors once no scrape's socket is still closing."""
    counts = [_open_fds(exporter)]
    while len(counts) < 3 or len(set(counts[-3:])) > 1:
        time.sleep(0.1)
        counts.append(_open_fds(exporter))
    return counts[-1]


def _backends(server: EmbeddedPostgres, user: str = "") -> list[int]:
    """The pids of the server's backends for `user` (those still starting up included),
    or else those of the exporter."""
    with server.connect() as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE pid <> pg_backend_pid()"
            " AND (usename = %s OR %s = '' AND application_name = 'pg-advisory-exporter')",
            (user, user),
        ).fetchall()
    return [row[0] for row in rows]


@pytest.mark.slow
def test_connect_timeouts_leave_no_socket_and_no_backend(
    start_exporter: Callable[..., RunningExporter],
    monitor_dsn: str,
    pg: EmbeddedPostgres,
    session: Session,
) -> None:
    # Four names of one server: read once, through one connection, the others up with it.
    names = [f"db{i}" for i in range(4)]
    exporter = start_exporter(
        config={
            "collection": {
                "min_interval": "1ms",
                "reconnect_backoff_max": "1ms",
                "connect_timeout": "2s",
                "statement_timeout": "1s",
                "statements_interval": "0s",  # no rare read of pg_stat_statements meanwhile
            },
            "targets": [{"name": name, "dsn": monitor_dsn} for name in names],
        }
    )
    baseline = _settled_fds(exporter)
    assert _backends(pg, "monitor") == []
    # A new backend reads pg_database before it can serve anything: with the catalog locked
    # (as by a long DDL) the server accepts connections and never finishes starting them.
    locker = session("catalog-locker", autocommit=False)
    locker.execute("LOCK TABLE pg_catalog.pg_database IN ACCESS EXCLUSIVE MODE")
    try:
        for _ in range(4):
            scrape = exporter.scrape()
            assert all(scrape.value("pg_advisory_up", target=name) == 0 for name in names)
        errors = exporter.scrape().value("pg_advisory_exporter_collect_errors_total")
        assert errors >= 4
        assert "timeout expired" in exporter.log()
        # Each timed-out attempt closed its socket at once.
        wait_until(lambda: _open_fds(exporter) == baseline, 5, "open descriptors: baseline")
    finally:
        locker.rollback()
    # Backends started for attempts that timed out find their client gone and exit.
    wait_until(lambda: _backends(pg, "monitor") == [], 10, "the exporter's backends exit")
    wait_until(lambda: _open_fds(exporter) == baseline, 5, "open descriptors: baseline")
    # And the exporter recovers with one connection for the server, no more.
    exporter.scrape_until(
        lambda s: all(s.value("pg_advisory_up", target=name) == 1 for name in names)
    )
    assert len(_backends(pg, "monitor")) == 1
    wait_until(lambda: _open_fds(exporter) == baseline + 1, 5, "open descriptors: baseline + 1")


@pytest.mark.slow
def test_a_frozen_backend_is_given_up_at_the_deadline(
    start_exporter: Callable[..., RunningExporter],
    one_target: Callable[..., dict[str, Any]],
    own_server: EmbeddedPostgres,
) -> None:
    # The deadline is connect_timeout + statement_timeout + 1s: 4s here.
    config = one_target(own_server.dsn(), connect_timeout="2s", statement_timeout="1s")
    exporter = start_exporter(config=config)
    assert exporter.scrape().value("pg_advisory_up", target="main") == 1
    baseline = _settled_fds(exporter)
    [frozen] = _backends(own_server)
    # A stopped backend (or a hung proxy) leaves the kernel acknowledging every packet:
    # no keepalive or TCP timeout ever fires, and the statement timeout cannot either.
    os.kill(frozen, signal.SIGSTOP)
    try:
        elapsed, scrape = exporter.timed_scrape()
        assert elapsed < 6
        assert scrape.value("pg_advisory_up", target="main") == 0
        # The collection itself ends at its deadline and is recorded as a failure.
        wait_until(lambda: exporter.get("/health")[0] == 503, 5, "/health reports the failure")
        assert "deadline" in exporter.get("/health")[1]
        scrape = exporter.scrape_until(lambda s: s.value("pg_advisory_up", target="main") == 1)
        assert scrape.value("pg_advisory_exporter_collect_errors_total", target="main") == 1
        assert "passed its deadline" in exporter.log()
        # The frozen connection was closed and replaced by one new connection.
        wait_until(lambda: _open_fds(exporter) == baseline, 5, "open descriptors: baseline")
        assert len(_backends(own_server)) == 2
    finally:
        os.kill(frozen, signal.SIGCONT)
    # Thawed, the old backend finds its statement cancelled and its client gone.
    wait_until(lambda: frozen not in _backends(own_server), 10, "the backend exits")
    assert exporter.get("/health")[0] == 200


def test_a_terminated_backend_costs_no_scrape(
    exporter: RunningExporter, pg: EmbeddedPostgres
) -> None:
    assert exporter.scrape().value("pg_advisory_up", target="main") == 1
    [backend] = _backends(pg)  # the kept connection (pg_stat_statements' read has its own)
    with pg.connect() as conn:
        conn.execute("SELECT pg_terminate_backend(%s)", (backend,))
    scrape = exporter.scrape()
    assert scrape.value("pg_advisory_up", target="main") == 1
    assert scrape.value("pg_advisory_exporter_collect_errors_total", target="main") == 0
    assert "the connection was lost; reconnecting" in exporter.log()
    assert _backends(pg) not in ([], [backend])


@pytest.mark.slow
def test_a_restarted_server_costs_no_scrape(
    start_exporter: Callable[..., RunningExporter],
    one_target: Callable[..., dict[str, Any]],
    own_server: EmbeddedPostgres,
) -> None:
    exporter = start_exporter(config=one_target(own_server.dsn()))
    assert exporter.scrape().value("pg_advisory_up", target="main") == 1
    own_server.stop()
    own_server.start()
    assert exporter.scrape().value("pg_advisory_up", target="main") == 1


@pytest.mark.slow
def test_a_connection_lost_right_after_an_outage_reconnects_at_once(
    start_exporter: Callable[..., RunningExporter],
    one_target: Callable[..., dict[str, Any]],
    own_server: EmbeddedPostgres,
) -> None:
    exporter = start_exporter(config=one_target(own_server.dsn(), reconnect_backoff_max="4s"))
    own_server.stop()
    # Failed attempts 1s, 2s and 4s apart take the backoff to its cap.
    started = time.monotonic()
    while time.monotonic() - started < 8:
        assert exporter.scrape().value("pg_advisory_up", target="main") == 0
        time.sleep(0.5)
    own_server.start()
    exporter.scrape_until(lambda s: s.value("pg_advisory_up", target="main") == 1, timeout=10)
    [backend] = _backends(own_server)
    with own_server.connect() as conn:
        conn.execute("SELECT pg_terminate_backend(%s)", (backend,))
    # Recovery reset the backoff and its deadline: nothing waits out the old cap.
    for _ in range(3):
        assert exporter.scrape().value("pg_advisory_up", target="main") == 1


def test_late_targets_report_how_long_they_ran(
    start_exporter: Callable[..., RunningExporter],
    silent_server: SilentServer,
) -> None:
    hung = f"host=127.0.0.1 port={silent_server.port} user=x dbname=x"
    exporter = start_exporter(
        config={
            "collection": {"min_interval": "1ms", "connect_timeout": "10s"},
            "targets": [{"name": "hung-1", "dsn": hung}, {"name": "hung-2", "dsn": hung}],
        }
    )
    elapsed, scrape = exporter.timed_scrape(**{"X-Prometheus-Scrape-Timeout-Seconds": "2"})
    assert elapsed < 2.0
    for name in ("hung-1", "hung-2"):
        assert scrape.value("pg_advisory_up", target=name) == 0
    # The two name one server: its one collection ran for the whole 1.5s the scrape could
    # wait, said once, by the first.
    duration = scrape.value("pg_advisory_exporter_collect_duration_seconds", target="hung-1")
    assert 1.0 < duration < 2.0
    assert not scrape.find("pg_advisory_exporter_collect_duration_seconds", target="hung-2")
    late_lines = [line for line in exporter.log().splitlines() if "slower than the scrape" in line]
    assert len(late_lines) == 1
    assert "targets_late=2" in late_lines[0]


@pytest.mark.slow
def test_a_reload_closes_the_connection_of_a_removed_target_even_mid_collection(
    start_exporter: Callable[..., RunningExporter],
    monitor_dsn: str,
    own_server: EmbeddedPostgres,
    tmp_path: Any,
) -> None:
    collection = {"min_interval": "1ms", "connect_timeout": "2s", "statement_timeout": "5s"}
    stays = {"name": "stays", "dsn": monitor_dsn}
    both = {
        "collection": collection,
        "targets": [stays, {"name": "removed", "dsn": own_server.dsn()}],
    }
    exporter = start_exporter("--web.enable-lifecycle", config=both)
    baseline = _settled_fds(exporter)  # nothing connected yet
    assert exporter.scrape().value("pg_advisory_up", target="removed") == 1
    [frozen] = _backends(own_server)
    os.kill(frozen, signal.SIGSTOP)
    try:
        # A scrape starts a collection that hangs on the frozen backend...
        exporter.get("/metrics", {"X-Prometheus-Scrape-Timeout-Seconds": "1"})
        # ...and a reload removes that target while it is still running.
        config_file = next(tmp_path.glob("config-*.yaml"))
        config_file.write_text(yaml.safe_dump({"collection": collection, "targets": [stays]}))
        assert exporter.get("/-/reload", method="POST")[0] == 200
        wait_until(
            lambda: _open_fds(exporter) == baseline + 1, 5, "the removed target's socket closes"
        )
    finally:
        os.kill(frozen, signal.SIGCONT)
    assert exporter.scrape().label_values("target") == {"stays"}
    assert "Traceback" not in exporter.log()


class FreezingProxy:
    """A TCP proxy to a server that stops passing bytes, both ways, once the client sends
    one containing `trigger`: a proxy that hangs while the kernel acknowledges every packet."""

    def __init__(self, upstream_port: int, trigger: bytes) -> None:
        self._upstream = upstream_port
        self._trigger = trigger
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.frozen = threading.Event()
        self._sockets: list[socket.socket] = [self._listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self._listener.accept()
                server = socket.create_connection(("127.0.0.1", self._upstream))
                self._sockets += [client, server]
                threading.Thread(
                    target=self._pipe, args=(client, server, True), daemon=True
                ).start()
                threading.Thread(
                    target=self._pipe, args=(server, client, False), daemon=True
                ).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, from_client: bool) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                if from_client and self._trigger in data:
                    self.frozen.set()
                if self.frozen.is_set():
                    return  # keep both sockets open, pass nothing more
                sink.sendall(data)

    def close(self) -> None:
        # shutdown() first: close() alone leaves a socket open while a thread is in recv()
        # on it, and the server's backend would stay connected after the test.
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


def test_check_gives_up_on_a_hung_proxy(pg: EmbeddedPostgres, monitor_dsn: str, cli: Cli) -> None:
    proxy = FreezingProxy(pg.port, trigger=b"pg_lock_status")
    dsn = monitor_dsn.replace(f"port={pg.port}", f"port={proxy.port}")
    try:
        started = time.monotonic()
        result = cli(
            "check", "--dsn", dsn,
            "--collection.connect-timeout", "2s", "--collection.statement-timeout", "1s",
        )  # fmt: skip
        elapsed = time.monotonic() - started
    finally:
        proxy.close()
    assert proxy.frozen.is_set()
    assert result.returncode == 1, result.stderr
    assert "cannot collect: no answer within 4s" in result.stdout
    assert elapsed < 10
    wait_until(lambda: _backends(pg, "monitor") == [], 5, "the check's backend exits")
