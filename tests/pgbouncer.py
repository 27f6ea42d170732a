"""A real PgBouncer (Debian's, 1.18) in front of the test server: a transaction-mode pool
and a session-mode pool of one server connection each (or `pool_size`), and an admin
console for a stats_users role."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from support import wait_until

from devtools.embedded_postgres import EmbeddedPostgres, free_port

TRANSACTION_POOL = "app"  # pool_mode = transaction
SESSION_POOL = "app_session"  # pool_mode = session
CLIENT, CLIENT_PASSWORD = "app", "app-secret"
STATS, STATS_PASSWORD = "stats", "stats-secret"

CONFIG = """\
[databases]
{transaction} = {server} pool_mode=transaction
{session} = {server} pool_mode=session

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = md5
auth_file = {dir}/userlist.txt
stats_users = {stats}
default_pool_size = {pool_size}
logfile = {dir}/pgbouncer.log
pidfile = {dir}/pgbouncer.pid
"""


@dataclass
class PgBouncer:
    """One PgBouncer process; `stop()` ends it (the fixture does at the end of the test)."""

    server: EmbeddedPostgres
    port: int = field(default_factory=free_port)
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="pgbouncer-")))
    process: subprocess.Popen[bytes] | None = None
    pool_size: int = 1

    def dsn(self, pool: str = TRANSACTION_POOL) -> str:
        """A client's DSN through one of the pools."""
        return make_conninfo(
            host="127.0.0.1", port=self.port, dbname=pool, user=CLIENT, password=CLIENT_PASSWORD
        )

    def admin_dsn(self, with_password: bool = True) -> str:
        """The admin console, as the stats_users role."""
        password = {"password": STATS_PASSWORD} if with_password else {}
        return make_conninfo(
            host="127.0.0.1", port=self.port, dbname="pgbouncer", user=STATS, **password
        )

    def log(self) -> str:
        path = self.workdir / "pgbouncer.log"
        return path.read_text() if path.exists() else ""

    def start(self) -> None:
        binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
        assert Path(binary).exists(), "pgbouncer is not installed (the test command installs it)"
        (self.workdir / "pgbouncer.ini").write_text(
            CONFIG.format(
                transaction=TRANSACTION_POOL, session=SESSION_POOL, server=self.server.dsn(),
                port=self.port, dir=self.workdir, stats=STATS, pool_size=self.pool_size,
            )
        )  # fmt: skip
        (self.workdir / "userlist.txt").write_text(
            f'"{CLIENT}" "{CLIENT_PASSWORD}"\n"{STATS}" "{STATS_PASSWORD}"\n'
        )
        user: dict[str, Any] = {}
        if os.geteuid() == 0:  # PgBouncer refuses to run as root
            entry = pwd.getpwnam("postgres")
            user = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
            for path in (self.workdir, *self.workdir.iterdir()):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        self.process = subprocess.Popen(
            [binary, str(self.workdir / "pgbouncer.ini")],
            **user,
        )
        wait_until(self._accepting, 15, lambda: f"pgbouncer accepting:\n{self.log()}")

    def _accepting(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            pytest.fail(f"pgbouncer exited:\n{self.log()}")
        try:
            psycopg.connect(self.admin_dsn(), autocommit=True).close()
        except psycopg.OperationalError:
            return False
        return True

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)
