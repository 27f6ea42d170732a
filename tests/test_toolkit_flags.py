"""The exporter-toolkit's flags that operators script against every exporter:
--web.systemd-socket (through systemd's own socket activation tool), --web.max-requests and
--web.disable-exporter-metrics, on the real daemon."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import (
    REFUSED_DSN,
    Cli,
    Scrape,
    SilentServer,
    StartExporter,
    cli_command,
    wait_until,
)

from devtools.embedded_postgres import free_port
from pg_advisory_exporter.http.socket_activation import ActivationError, activated_socket

# Version-independent (tests/conftest.py): the HTTP surface, no server's behaviour.
pytestmark = pytest.mark.any_version


def _get(url: str, timeout: float = 30, scrape_timeout: str | None = None) -> tuple[int, str]:
    headers = (
        {} if scrape_timeout is None else {"X-Prometheus-Scrape-Timeout-Seconds": scrape_timeout}
    )
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return int(answer.status), answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


@dataclass
class Activated:
    """systemd-socket-activate listening on `port`, to exec the exporter when a client comes."""

    port: int
    process: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text()


StartActivated = Callable[..., Activated]


@pytest.fixture
def socket_activate(tmp_path: Path) -> Iterator[StartActivated]:
    """systemd's own tool for socket activation, as a .socket unit does it: it listens, and
    at the first client (datagram) execs the exporter with that socket as descriptor 3."""
    tool = shutil.which("systemd-socket-activate")
    assert tool, "systemd-socket-activate is not installed (the test command installs systemd)"
    started: list[Activated] = []

    def start(*args: str, datagram: bool = False) -> Activated:
        port, log = free_port(), tmp_path / f"exporter-{len(started)}.log"
        kind = ["--datagram"] if datagram else []
        command = [tool, "--listen", f"127.0.0.1:{port}", *kind, *cli_command(*args)]
        with log.open("w") as output:
            process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
        started.append(activated := Activated(port, process, log))
        wait_until(lambda: "Listening on" in activated.output(), 15, "the tool listening")
        return activated

    yield start
    for activated in started:
        activated.process.terminate()
        activated.process.wait(timeout=15)


def test_the_socket_systemd_passes_is_served(socket_activate: StartActivated) -> None:
    activated = socket_activate("--web.systemd-socket", "--dsn", REFUSED_DSN)
    # This first request makes the tool exec the exporter, which answers it on the socket
    # handed over (the connection waits in its backlog meanwhile), as under systemd.
    status, body = _get(f"http://127.0.0.1:{activated.port}/metrics")
    assert status == 200, f"{body}\n{activated.output()}"
    assert Scrape(body).value("pg_advisory_up", target="default") == 0
    assert f'address="systemd socket 127.0.0.1:{activated.port}"' in activated.output()


def test_a_socket_that_cannot_be_served_is_refused_by_name(
    socket_activate: StartActivated,
) -> None:
    # A datagram socket (ListenDatagram=): the exporter starts at the first datagram, and
    # exits naming the flag and what is wrong.
    activated = socket_activate("--web.systemd-socket", "--dsn", REFUSED_DSN, datagram=True)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client:
        client.sendto(b"hello", ("127.0.0.1", activated.port))
    assert activated.process.wait(timeout=30) == 1, activated.output()
    assert "--web.systemd-socket: file descriptor 3 is not a TCP socket" in activated.output()


def test_the_flag_without_a_socket_exits_with_the_reason(cli: Cli) -> None:
    started = cli("--web.systemd-socket", "--dsn", REFUSED_DSN)
    assert started.returncode == 1
    assert "--web.systemd-socket: no socket was passed" in started.stdout + started.stderr


@pytest.mark.parametrize(
    ("environ", "reason"),
    [
        ({}, "no socket was passed"),
        ({"LISTEN_PID": "1", "LISTEN_FDS": "1"}, "passed to process 1, not to this one"),
        ({"LISTEN_PID": "{pid}", "LISTEN_FDS": "2"}, "2 sockets were passed"),
        ({"LISTEN_PID": "x", "LISTEN_FDS": "1"}, "passed to process x"),
    ],
)
def test_what_systemd_passed_is_checked_before_any_descriptor(
    environ: dict[str, str], reason: str
) -> None:
    given = {name: value.format(pid=os.getpid()) for name, value in environ.items()}
    given["LISTEN_FDNAMES"] = "web"
    with pytest.raises(ActivationError, match=reason):
        activated_socket(given)
    assert given == {}  # no program the exporter starts takes them


def test_scrapes_past_max_requests_get_503_at_once(
    start_exporter: StartExporter, silent_server: SilentServer
) -> None:
    """Three scrapes at once with room for one, which waits on a hung server for its
    timeout: the other two are refused at once, as promhttp's MaxRequestsInFlight does. A
    probe meanwhile is not limited (a fleet's Prometheus probes every target at once), nor
    is the health endpoint."""
    hung = f"host=127.0.0.1 port={silent_server.port} user=x dbname=x"
    exporter = start_exporter("--web.max-requests", "1", "--dsn", hung)
    url = f"http://127.0.0.1:{exporter.port}/metrics"

    def scrape() -> tuple[int, str, float]:
        started = time.monotonic()
        status, body = _get(url, scrape_timeout="4")
        return status, body, time.monotonic() - started

    with ThreadPoolExecutor(3) as pool:
        scrapes = [pool.submit(scrape) for _ in range(3)]
        healthy = _get(f"http://127.0.0.1:{exporter.port}/-/healthy", timeout=5)[0]
        probe = _get(f"http://127.0.0.1:{exporter.port}/probe?target=default", scrape_timeout="1")
        answers = sorted((done.result() for done in scrapes), key=lambda a: a[0])
    assert [status for status, _, _ in answers] == [200, 503, 503], answers
    answered, *refused = answers
    assert answered[2] > 2  # it waited on the hung server, so the others came meanwhile
    for _, body, seconds in refused:
        assert body == "limit of concurrent requests reached (1), try again later\n"
        assert seconds < 2
    assert healthy == 200
    assert probe[0] == 200, probe
    assert _get(url, scrape_timeout="1")[0] == 200  # room again


def test_exporter_metrics_can_be_left_out(start_exporter: StartExporter) -> None:
    with_them = start_exporter("--dsn", REFUSED_DSN).scrape()
    without = start_exporter("--dsn", REFUSED_DSN, "--web.disable-exporter-metrics").scrape()
    assert with_them.find("process_resident_memory_bytes")
    assert not [line for line in without.text.splitlines() if line.startswith("process_")]
    # Only the process's: the targets' series and the exporter's own signals stay.
    assert without.value("pg_advisory_up", target="default") == 0
    assert without.find("pg_advisory_exporter_build_info")
