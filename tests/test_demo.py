"""`pg-advisory-exporter demo` run as a user runs it: the scenarios show up in its metrics."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import IO

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from exporter.embedded_postgres import free_port

SCENARIOS_WITHIN = 90.0  # start-up, then a full bulk-import cycle (25s) with room to spare
STOP_WITHIN = 30.0


def _has(name: str, minimum: float = 1.0, **labels: str) -> Callable[[list[Sample]], bool]:
    def check(samples: list[Sample]) -> bool:
        return any(
            s.name == name and labels.items() <= s.labels.items() and s.value >= minimum
            for s in samples
        )

    return check


def _pods_rewritten(samples: list[Sample]) -> bool:
    names = {s.labels.get("application_name", "") for s in samples}
    return "reward-points-cron" in names and not any(
        n.startswith("reward-points-cron-") for n in names
    )


# Some of these hold only part of each scenario's cycle, so each is looked for until seen once.
EXPECTED: dict[str, Callable[[list[Sample]], bool]] = {
    "billing-worker holds while idle": _has(
        "pg_advisory_holders", application_name="billing-worker", state="idle"
    ),
    "signup-api waits": _has("pg_advisory_waiters", application_name="signup-api"),
    "report-reader holds a shared lock": _has(
        "pg_advisory_locks", application_name="report-reader", mode="share", granted="true"
    ),
    "a series for database billing": lambda samples: any(
        s.labels.get("datname") == "billing" for s in samples
    ),
    "pod names rewritten to reward-points-cron": _pods_rewritten,
    "bulk-import holds 2,000 locks": _has(
        "pg_advisory_backend_locks_max", 2000, application_name="bulk-import"
    ),
    "the registry names the leader lock": _has(
        "pg_advisory_key_holders", key="billing_leader", datname="billing"
    ),
    "the registry names the leaked lock": _has(
        "pg_advisory_key_holders", key="nightly_billing", datname="postgres"
    ),
    "a signup waits in the signup namespace": _has("pg_advisory_key_waiters", key="signup"),
}


class _Output:
    """Collects the demo's output from a thread, so that the pipe never fills up."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        assert process.stdout is not None
        self._thread = threading.Thread(target=self._read, args=(process.stdout,), daemon=True)
        self._thread.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self.lines.append(line)

    def text(self) -> str:
        return "".join(self.lines)

    def finish(self) -> str:
        self._thread.join(timeout=5)
        return self.text()


def _scrape(url: str) -> list[Sample]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
    except OSError:
        return []  # not listening yet
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def _wait_for_scenarios(url: str, process: subprocess.Popen[str], output: _Output) -> None:
    missing = dict(EXPECTED)
    deadline = time.monotonic() + SCENARIOS_WITHIN
    while missing and time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"the demo exited with {process.returncode}:\n{output.finish()}")
        samples = _scrape(url)
        missing = {what: check for what, check in missing.items() if not check(samples)}
        time.sleep(0.5)
    if missing:
        pytest.fail(
            f"not seen within {SCENARIOS_WITHIN:.0f}s: {', '.join(missing)}\n"
            f"demo output:\n{output.text()}"
        )


def _data_directory(output: str) -> Path:
    found = re.search(r"^data directory: (\S+)$", output, re.MULTILINE)
    assert found, f"the demo did not say where its data directory is:\n{output}"
    return Path(found.group(1))


@pytest.mark.slow
def test_demo_plays_the_scenarios_and_cleans_up_on_ctrl_c() -> None:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "exporter", "demo", "--web.listen-address", f"127.0.0.1:{port}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output = _Output(process)
    try:
        _wait_for_scenarios(f"http://127.0.0.1:{port}/metrics", process, output)
        process.send_signal(signal.SIGINT)
        try:
            returncode = process.wait(timeout=STOP_WITHIN)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the demo did not stop within {STOP_WITHIN:.0f}s:\n{output.text()}")
        text = output.finish()
        assert returncode == 0, text
        datadir = _data_directory(text)
        assert f"stopped, removed {datadir}" in text, text
        assert not datadir.exists(), f"{datadir} is still there:\n{text}"
    finally:
        if process.poll() is None:  # the test failed: still stop the demo's server cleanly
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=STOP_WITHIN)
            except subprocess.TimeoutExpired:
                process.kill()
