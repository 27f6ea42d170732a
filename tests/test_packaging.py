"""What installs, and what a daemon start loads: the project's own import name, no dev code."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from support import StartExporter

ROOT = Path(__file__).parent.parent


def test_the_wheel_installs_only_the_projects_own_package(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--wheel-dir", str(tmp_path), str(ROOT)],
        check=True, capture_output=True,
    )  # fmt: skip
    [wheel] = tmp_path.glob("*.whl")
    top_level = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert top_level == {"pg_advisory_exporter", f"{wheel.name.split('-py3')[0]}.dist-info"}
    assert "pg_advisory_exporter/py.typed" in zipfile.ZipFile(wheel).namelist()


def test_a_daemon_start_loads_no_development_code(
    start_exporter: StartExporter,
) -> None:
    # Python reports every module it imports; the daemon serves before the check runs.
    exporter = start_exporter(
        "--dsn", "host=127.0.0.1 port=1 user=x dbname=x", env={"PYTHONPROFILEIMPORTTIME": "1"}
    )
    assert exporter.get("/")[0] == 200
    imported = {
        line.rsplit("|", 1)[-1].strip()
        for line in exporter.log().splitlines()
        if line.startswith("import time:")
    }
    assert "pg_advisory_exporter.daemon" in imported
    assert not {"exporter"} & imported
    for development_only in ("demo", "embedded_postgres"):
        assert f"pg_advisory_exporter.{development_only}" not in imported
    assert "logger=pg_advisory_exporter." in exporter.log()
