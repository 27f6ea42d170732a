"""The seed's worst case: a session lock leaked through PgBouncer's transaction pooling."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from support import OneTarget, StartExporter, wait_until

from pg_advisory_exporter.embedded_postgres import EmbeddedPostgres, free_port

CONFIG = """\
[databases]
app = host=127.0.0.1 port={pg_port} dbname=postgres user=postgres password={password}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = any
pool_mode = transaction
default_pool_size = 1
logfile = {dir}/pgbouncer.log
pidfile = {dir}/pgbouncer.pid
"""


@pytest.fixture
def pgbouncer(pg: EmbeddedPostgres) -> Iterator[int]:
    """A real PgBouncer in transaction mode with one server connection; returns its port."""
    binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    assert Path(binary).exists(), "pgbouncer is not installed (the test command installs it)"
    workdir = Path(tempfile.mkdtemp(prefix="pg-advisory-exporter-pgbouncer-"))
    port = free_port()
    (workdir / "pgbouncer.ini").write_text(
        CONFIG.format(pg_port=pg.port, password=pg.password, port=port, dir=workdir)
    )
    user: dict[str, Any] = {}
    if os.geteuid() == 0:  # PgBouncer refuses to run as root
        entry = pwd.getpwnam("postgres")
        user = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
        for path in (workdir, workdir / "pgbouncer.ini"):
            os.chown(path, entry.pw_uid, entry.pw_gid)
    process = subprocess.Popen([binary, str(workdir / "pgbouncer.ini")], **user)
    log = workdir / "pgbouncer.log"

    def accepting() -> bool:
        if process.poll() is not None:
            pytest.fail(f"pgbouncer exited:\n{log.read_text()}")
        try:
            psycopg.connect(f"host=127.0.0.1 port={port} dbname=app user=x").close()
        except psycopg.OperationalError:
            return False
        return True

    try:
        wait_until(accepting, 15, lambda: f"pgbouncer accepting:\n{log.read_text()}")
        yield port
    finally:
        process.terminate()
        process.wait(timeout=10)
        shutil.rmtree(workdir, ignore_errors=True)


def test_a_lock_leaked_on_a_pooled_connection_is_seen(
    pgbouncer: int, start_exporter: StartExporter, one_target: OneTarget, monitor_dsn: str
) -> None:
    through_pooler = f"host=127.0.0.1 port={pgbouncer} dbname=app user=x"
    # The job takes a session lock through the pooler and finishes: its client disconnects,
    # but the server connection, with the lock, goes back to the pool.
    with psycopg.connect(through_pooler, autocommit=True, application_name="nightly-job") as job:
        job.execute("SELECT pg_advisory_lock(777)")
    exporter = start_exporter(config=one_target(monitor_dsn))

    labels = {"target": "main", "datname": "postgres", "application_name": "nightly-job"}
    scrape = exporter.scrape()
    assert scrape.value("pg_advisory_holders", **labels, state="idle") == 1
    assert scrape.find("pg_advisory_idle_holder_max_seconds", **labels, state="idle")

    # The next client handed that server connection "gets" the lock too: the seed's double
    # run. The exporter still sees one idle holder, now under the new client's name, and a
    # leak age that restarted with its statement.
    with psycopg.connect(through_pooler, autocommit=True, application_name="nightly-job-2") as late:
        row = late.execute("SELECT pg_try_advisory_lock(777)").fetchone()
        assert row == (True,)
    second = {**labels, "application_name": "nightly-job-2"}
    scrape = exporter.scrape_until(
        lambda s: any(
            age >= 1.0
            for _, age in s.find("pg_advisory_idle_holder_max_seconds", **second, state="idle")
        )
    )
    assert scrape.value("pg_advisory_holders", **second, state="idle") == 1
    assert scrape.value("pg_advisory_locks", **second, mode="exclusive", granted="true") == 1
    assert scrape.value("pg_advisory_idle_holder_max_seconds", **second, state="idle") >= 1.0
    assert scrape.find("pg_advisory_holders", application_name="nightly-job") == []
