"""The container image, built from the real Dockerfile with podman on a local stand-in for the
official Python base, and run the way users run it: read-only, as its own non-root UID."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from containers import BASE_IMAGE, ROOT, Podman
from support import REFUSED_DSN, Scrape, Session, http_get, wait_until

from devtools.embedded_postgres import free_port
from pg_advisory_exporter import __version__
from pg_advisory_exporter.revision import from_checkout

# The first test to use the image pays for debootstrap (about a minute, once per machine)
# and the build.
# Version-independent (tests/conftest.py): the image, run against any server.
pytestmark = [pytest.mark.timeout(900), pytest.mark.any_version]

DOCKERFILE = ROOT / "Dockerfile"
UID = 65532
# "MB" as podman prints it: 10^6 bytes.
SIZE_LIMIT = 190_000_000
# What the Dockerfile adds on top of its base (the venv: 66 MB when written, 28 MB of it
# pglast's parser as its wheel ships it, with debug information); a pip cache, the wheels or
# a second copy of the venv left in a layer would each break it.
ADDED_LIMIT = 75_000_000
# Kubernetes' readOnlyRootFilesystem, no capabilities, no privilege escalation: podman's
# --read-only alone would still mount writable tmpfs on /tmp and /run.
LOCKED_DOWN = (
    "--read-only", "--read-only-tmpfs=false", "--cap-drop", "all",
    "--security-opt", "no-new-privileges",
)  # fmt: skip


def _binary() -> str:
    """The console command of the development install, which the image must behave like."""
    path = shutil.which("pg-advisory-exporter", path=str(Path(sys.executable).parent))
    assert path, "pg-advisory-exporter is not installed beside this interpreter"
    return path


def test_the_dockerfile_passes_hadolint(hadolint: str, tmp_path: Path) -> None:
    result = subprocess.run(
        [hadolint, str(DOCKERFILE)], capture_output=True, text=True, check=False
    )
    assert (result.returncode, result.stdout + result.stderr) == (0, "")
    # The linter is live: the usual mistakes in a Dockerfile of this kind are reported.
    careless = tmp_path / "Dockerfile"
    careless.write_text(
        "FROM python\nRUN apt-get update && apt-get install gcc\nRUN pip install psycopg\n"
    )
    reported = subprocess.run(
        [hadolint, str(careless)], capture_output=True, text=True, check=False
    )
    assert reported.returncode != 0
    assert {"DL3006", "DL3008", "DL3013", "DL3042"} <= set(re.findall(r"DL\d+", reported.stdout))
    # An ignored rule carries its reason in the comment line above it.
    lines = DOCKERFILE.read_text().splitlines()
    for number, line in enumerate(lines):
        if "hadolint ignore=" in line:
            above = lines[number - 1] if number else ""
            assert above.startswith("#"), f"no reason for: {line}"
            assert "hadolint" not in above, f"no reason for: {line}"


def test_the_image_metadata_user_and_size(podman: Podman, image: str) -> None:
    [inspected] = json.loads(podman.run("image", "inspect", image).stdout)
    config = inspected["Config"]
    assert config.get("User") == f"{UID}:{UID}"  # numeric: runAsNonRoot can check it
    assert config["Entrypoint"] == ["pg-advisory-exporter"]
    assert set(config["ExposedPorts"]) == {"9846/tcp"}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "Apache License" in (ROOT / "LICENSE").read_text().split("\n", 2)[0]
    labels = config["Labels"]
    assert {key: labels.get(f"org.opencontainers.image.{key}") for key in (
        "title", "description", "version", "revision", "licenses")} == {
        "title": project["name"],
        "description": project["description"],
        "version": __version__,
        "revision": from_checkout(ROOT),  # the build's VCS_REF
        "licenses": project["license"],
    }  # fmt: skip
    assert labels["org.opencontainers.image.source"].startswith("https://github.com/")

    size = podman.image_size(image)
    added = size - podman.image_size(BASE_IMAGE)
    assert size < SIZE_LIMIT, f"{size / 1e6:.1f} MB, {added / 1e6:.1f} MB over the base"
    assert added < ADDED_LIMIT, f"the Dockerfile adds {added / 1e6:.1f} MB to its base"


# What the final stage may add to its base or change in it: the venv, and the account
# files that useradd writes (with their backups).
_ACCOUNTS = {f"/etc/{name}{backup}" for name in ("passwd", "group", "shadow", "gshadow")
             for backup in ("", "-")}  # fmt: skip
_VENV = "/opt/pg-advisory-exporter"
# Both bases have Debian's tzdata; an empty zoneinfo search path hides it, so that only the
# image's own zone data (the tzdata wheel) can answer, as on a base without any.
_NO_SYSTEM_ZONES = ("--env", "PYTHONTZPATH=")
# psycopg maps the server's TimeZone to a zoneinfo zone when it reads a timestamptz, and
# logs "unknown PostgreSQL timezone" and uses UTC when no zone data has it.
_SERVER_ZONE = """
import sys, psycopg
with psycopg.connect(sys.argv[1], options="-c TimeZone=Europe/Berlin") as conn:
    print(conn.execute("SELECT now()").fetchone()[0].tzinfo)
"""

_FACTS = r"""
import importlib.util, json, os, shutil, sys, zoneinfo
package = os.path.dirname(importlib.util.find_spec("pg_advisory_exporter").origin)
modules = [os.path.join(top, name) for top, _, files in os.walk(package)
           for name in files if name.endswith(".py")]
print(json.dumps({
    "tools": [tool for tool in ("gcc", "cc", "c++", "clang", "make", "ld") if shutil.which(tool)],
    "prefix": sys.prefix,
    "pip": importlib.util.find_spec("pip") is not None,
    "tzdata": importlib.util.find_spec("tzdata") is not None,
    "zone": str(zoneinfo.ZoneInfo("Europe/Berlin")),
    "modules": [os.path.relpath(path, package) for path in modules],
    "uncompiled": [os.path.relpath(path, package) for path in modules
                   if not os.path.exists(importlib.util.cache_from_source(path))],
    "wheels": [name for top, _, files in os.walk(sys.prefix) for name in files
               if name.endswith(".whl")],
}))
"""


def test_the_final_image_adds_the_venv_and_nothing_else(podman: Podman, image: str) -> None:
    diff = json.loads(podman.run("image", "diff", "--format", "json", image, BASE_IMAGE).stdout)
    outside = [
        path
        for path in (*diff.get("added", ()), *diff.get("changed", ()), *diff.get("deleted", ()))
        if not (path.startswith(f"{_VENV}/") or path in {_VENV, "/opt", "/etc", *_ACCOUNTS})
    ]
    assert outside == []  # no source tree, wheels, pip cache or build plumbing

    result = podman.run(
        "run", "--rm", *LOCKED_DOWN, *_NO_SYSTEM_ZONES, "--entrypoint", "python3",
        image, "-c", _FACTS,
    )  # fmt: skip
    facts: dict[str, Any] = json.loads(result.stdout)
    assert facts["tools"] == []  # no compiler or linker
    assert facts["prefix"] == _VENV  # python3 on PATH is the venv's
    assert facts["pip"] is False  # the build's pip installed the venv and stayed behind
    assert facts["wheels"] == []
    # Zone data of the image's own, found with the base's hidden.
    assert (facts["tzdata"], facts["zone"]) == (True, "Europe/Berlin")
    # Byte-compiled at build, every module in every folder of the package: a read-only root
    # takes no .pyc.
    assert "collect/target.py" in facts["modules"]
    assert facts["uncompiled"] == []


def test_version_and_a_bad_dsn_answer_as_the_binary_does(podman: Podman, image: str) -> None:
    bad_dsn = "host=db user=monitor password=s3cret-in-the-dsn sslmode"
    for args in (["--version"], ["--dsn", bad_dsn]):
        binary = subprocess.run(
            [_binary(), *args], capture_output=True, text=True, timeout=60, check=False
        )
        container = podman.run(
            "run", "--rm", *LOCKED_DOWN, "--network", "none", image, *args, check=False
        )  # fmt: skip
        assert (container.returncode, container.stdout, container.stderr) == (
            binary.returncode, binary.stdout, binary.stderr,
        )  # fmt: skip
    assert binary.returncode == 2
    assert "configuration error: flag --dsn" in binary.stderr
    assert "s3cret" not in binary.stderr


def test_the_default_address_answers_on_a_published_port(podman: Podman, image: str) -> None:
    # As users run it: podman's own network, the image's port published on the host.
    port = free_port()
    options = ("--publish", f"127.0.0.1:{port}:9846", *LOCKED_DOWN)
    with podman.container(image, "--dsn", REFUSED_DSN, options=options) as name:
        scrape = _scrape_until(podman, name, port, lambda _: True)
        # Its database is down, and the exporter says so rather than failing the scrape.
        assert [value for _, value in scrape.find("pg_advisory_up")] == [0]


def test_the_image_exports_a_leaked_lock_read_only_as_its_uid(
    podman: Podman, image: str, monitor_dsn: str, session: Session, promtool: str
) -> None:
    leaked = session("billing-worker")
    leaked.execute("SELECT pg_advisory_lock(7310001)")
    port = free_port()
    options = ("--network", "host", "--user", f"{UID}:{UID}", *LOCKED_DOWN)
    # Host networking reaches the test server on 127.0.0.1; the exporter listens there only.
    listen = f"127.0.0.1:{port}"
    with podman.container(
        image, "--dsn", monitor_dsn, "--web.listen-address", listen, options=options
    ) as name:
        worker = {"application_name": "billing-worker", "datname": "postgres"}
        scrape = _scrape_until(podman, name, port, lambda s: bool(s.find("pg_advisory_holders")))
        assert [value for _, value in scrape.find("pg_advisory_up")] == [1]
        assert scrape.value("pg_advisory_holders", **worker, state="idle") == 1
        assert scrape.value("pg_advisory_locks", **worker, mode="exclusive", granted="true") == 1
        check = subprocess.run(
            [promtool, "check", "metrics"],
            input=scrape.text, capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert check.returncode == 0, check.stdout + check.stderr

        # The exporter's own queries read no timestamptz; psycopg in the image reads one.
        zone = podman.run(
            "exec", *_NO_SYSTEM_ZONES, name, "python3", "-c", _SERVER_ZONE, monitor_dsn
        )  # fmt: skip
        assert (zone.stdout, zone.stderr) == ("Europe/Berlin\n", "")

        # The process itself, not only the image's setting, runs as the UID.
        top = podman.run("top", name, "huser", "user").stdout.split()
        assert top[2:] == [str(UID), "exporter"], top
        # SIGTERM stops it at once, although Python runs as PID 1 here.
        started = time.monotonic()
        podman.run("stop", "--time", "10", name)
        assert time.monotonic() - started < 5
        assert podman.run("inspect", "--format", "{{.State.ExitCode}}", name).stdout.strip() == "0"
        logs = _logs(podman, name)
        assert "logger=pg_advisory_exporter." in logs
        assert "unknown PostgreSQL timezone" not in logs
        assert "Traceback" not in logs


def _scrape_until(podman: Podman, name: str, port: int, check: Callable[[Scrape], bool]) -> Scrape:
    """Scrape the container's /metrics on 127.0.0.1:`port` until `check` holds; fail at once
    if the container stops."""
    scraped: list[Scrape] = []

    def holds() -> bool:
        state = podman.run("inspect", "--format", "{{.State.Status}}", name).stdout.strip()
        if state != "running":
            pytest.fail(f"the container is {state}:\n{_logs(podman, name)}")
        try:
            status, body = http_get(f"http://127.0.0.1:{port}/metrics")
        except OSError:  # not listening yet
            return False
        if status != 200:
            return False
        scraped[:] = [Scrape(body)]
        return check(scraped[0])

    wait_until(holds, 30, lambda: f"a scrape as expected:\n{_logs(podman, name)}", 0.2)
    return scraped[0]


def _logs(podman: Podman, name: str) -> str:
    result = podman.run("logs", name, check=False)
    return result.stdout + result.stderr
