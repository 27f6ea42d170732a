"""The demo run as `make demo` runs it: the scenarios show up in its metrics, the server's
log's events too."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO

import pytest
from support import Scrape, scrape, wait_until

from devtools.embedded_postgres import free_port

ROOT = Path(__file__).parent.parent
SCENARIOS_WITHIN = 90.0  # start-up, then a full bulk-import cycle (25s) with room to spare
STOP_WITHIN = 30.0


def _has(name: str, minimum: float = 1.0, **labels: str) -> Callable[[Scrape], bool]:
    def check(scrape: Scrape) -> bool:
        return any(value >= minimum for _, value in scrape.find(name, **labels))

    return check


def _pods_rewritten(scrape: Scrape) -> bool:
    names = scrape.label_values("application_name")
    return "reward-points-cron" in names and not any(
        n.startswith("reward-points-cron-") for n in names
    )


def _que_idle_by_design(scrape: Scrape) -> bool:
    """Que's locker holds its three jobs' keys in billing, measured as the catalog's
    que_locker and left out of the leak series."""

    def que(name: str) -> list[float]:
        return [
            value
            for labels, value in scrape.find(name, datname="billing")
            if labels["application_name"].startswith("Que Locker: ")
        ]

    return (
        que("pg_advisory_backend_locks_max") == [3]
        and len(que("pg_advisory_idle_by_design_seconds")) == 1
        and que("pg_advisory_idle_holder_max_seconds") == []
    )


# Some of these hold only part of each scenario's cycle, so each is looked for until seen once.
EXPECTED: dict[str, Callable[[Scrape], bool]] = {
    "billing-worker holds while idle": _has(
        "pg_advisory_holders", application_name="billing-worker", state="idle"
    ),
    "signup-api waits": _has("pg_advisory_waiters", application_name="signup-api"),
    "report-reader holds a shared lock": _has(
        "pg_advisory_locks", application_name="report-reader", mode="share", granted="true"
    ),
    "a series for database billing": lambda scrape: "billing" in scrape.label_values("datname"),
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
    "Que's locker holds 3 jobs' keys idle by design, never as a leak": _que_idle_by_design,
    "the server's log tells of payments-worker's unlock on the wrong connection": _has(
        "pg_advisory_log_unlocks_not_held_total",
        application_name="payments-worker",
        datname="postgres",
    ),
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


def _wait_for_scenarios(url: str, process: subprocess.Popen[str], output: _Output) -> None:
    missing = dict(EXPECTED)

    def all_seen() -> bool:
        if process.poll() is not None:
            pytest.fail(f"the demo exited with {process.returncode}:\n{output.finish()}")
        try:
            scraped = scrape(url)
        except OSError:
            return False  # not listening yet
        for what, check in list(missing.items()):
            if check(scraped):
                del missing[what]
        return not missing

    wait_until(
        all_seen,
        SCENARIOS_WITHIN,
        lambda: f"{', '.join(missing)}\ndemo output:\n{output.text()}",
        0.5,
    )


def _data_directory(output: str) -> Path:
    found = re.search(r"^data directory: (\S+)$", output, re.MULTILINE)
    assert found, f"the demo did not say where its data directory is:\n{output}"
    return Path(found.group(1))


@pytest.mark.slow
@pytest.mark.pg  # the demo starts a server of its own
@pytest.mark.any_version  # the demo picks its own version
def test_demo_plays_the_scenarios_and_cleans_up_on_ctrl_c() -> None:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "devtools.demo", "--web.listen-address", f"127.0.0.1:{port}"],
        cwd=ROOT,  # as make runs it: devtools/ is found in the repository, never installed
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
