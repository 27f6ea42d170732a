"""The worked examples of docs/configuration.md ("Keys that libraries compute") against the
libraries themselves: each library computes its own key, which is the one the docs' table
gives; where the library takes its lock, it takes it for real on the test server, and the
exporter, given the docs' `keys` block as its registry, names the lock by the docs' entry.

PALs, django-pgware (with django-pglocks, now a shim of it), django-pglock and PgQueuer come
from PyPI,
advisory-lock and pg-boss from npm, pinned and installed into build/ (tests/clients.py). The
hashtext() example is computed by the server: it is checked on every supported version; the
libraries compute theirs themselves, so their tests run with the first version only.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from clients import (
    StartClient,
    Watch,
    check_level,
    client_environment,
    database_url,
    fresh_database,
    lock_of,
    locks_config,
    pg_boss_starts,
    pgqueuer_takes_its_locks,
)
from support import RunningExporter, StartExporter, wait_until
from test_key_forms import examples_resolved, worked_examples, worked_examples_yaml

from devtools.embedded_postgres import EmbeddedPostgres
from pg_advisory_exporter.keys.registry import HASH_TEXTS_SQL

EXAMPLES = worked_examples()[1]  # entry: (database, the lock it names), as the table says


def test_the_worked_examples_on_a_real_server(pg: EmbeddedPostgres) -> None:
    """Every example, hashtext() included, resolves to its table row with the keys that only
    the server computes asked of this server, as the exporter asks them (on every supported
    version: hashtext() is internal to PostgreSQL)."""
    with pg.connect() as conn:

        def server(texts: Any, seeds: Any) -> list[int]:
            query = {"texts": list(texts), "seeds": list(seeds)}
            return [row[0] for row in conn.execute(HASH_TEXTS_SQL, query).fetchall()]

        assert examples_resolved(server) == EXAMPLES
        # PgQueuer's own SQL for it: pg_try_advisory_xact_lock(hashtext('<table>')).
        row = conn.execute("SELECT hashtext('jobs_pgqueuer_statistics')").fetchone()
    assert row is not None
    assert str(row[0]) == EXAMPLES["jobs_pgqueuer_statistics"][1]


@pytest.fixture
def exporter(start_exporter: StartExporter, monitor_dsn: str) -> RunningExporter:
    """The exporter with the docs' examples as its registry (the catalog on, as it ships)."""
    return start_exporter(config=locks_config(monitor_dsn, worked_examples_yaml()))


# Each takes its lock as its documentation shows, prints the key it computed itself (as JSON),
# then "locked", and lets the lock go at the test's word.
PALS = """\
import json
import sys

from pals import Locker

locker = Locker("billing", "postgresql+psycopg://?application_name=pals")
lock = locker.lock("nightly")
print(json.dumps(lock.lock_num), flush=True)
assert lock.acquire()
print("locked", flush=True)
sys.stdin.readline()
lock.release()
"""
DJANGO = """\
import json
import os
import sys
import warnings

import django
from django.conf import settings

settings.configure(
    DATABASES={
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            **{name: os.environ[f"PG{name}"] for name in ("HOST", "PORT", "USER", "PASSWORD")},
            "NAME": os.environ["PGDATABASE"],
            "OPTIONS": {"application_name": "django-pgware"},
        }
    }
)
django.setup()
from django_pg_utils import advisory_lock
from django_pg_utils.locks._lock import resolve_lock_id

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import django_pglocks

assert django_pglocks.advisory_lock is advisory_lock  # django-pglocks 2 is django-pgware's
print(json.dumps(resolve_lock_id("nightly-billing")), flush=True)
with advisory_lock("nightly-billing") as acquired:
    assert acquired
    print("locked", flush=True)
    sys.stdin.readline()
"""
# django-pglock (no s), another library: its advisory lock of a name, as its docs show it.
DJANGO_PGLOCK = """\
import json
import os
import sys

import django
from django.conf import settings

settings.configure(
    INSTALLED_APPS=["pgactivity", "pglock"],
    DATABASES={
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            **{name: os.environ[f"PG{name}"] for name in ("HOST", "PORT", "USER", "PASSWORD")},
            "NAME": os.environ["PGDATABASE"],
            "OPTIONS": {"application_name": "django-pglock"},
        }
    },
)
django.setup()
import pglock

lock = pglock.advisory("nightly-billing")
print(json.dumps(lock.int_lock_id), flush=True)
with lock as acquired:
    assert acquired
    print("locked", flush=True)
    sys.stdin.readline()
"""
ADVISORY_LOCK = """\
const advisoryLock = require('advisory-lock')
const readline = require('node:readline')

async function main () {
  console.log(JSON.stringify(advisoryLock.strToKey('leader-election')))
  const unlock = await advisoryLock.default(process.argv[2])('leader-election').lock()
  console.log('locked')
  const words = readline.createInterface({ input: process.stdin })
  await new Promise((resolve) => words.once('line', resolve))
  words.close()
  await unlock()
}

main().catch((error) => { console.error(error); process.exit(1) })
"""


def _python(script: str) -> Callable[[Path, Path, str], list[str | Path]]:
    def command(python: Path, _folder: Path, _url: str) -> list[str | Path]:
        return [python, "-c", script]

    return command


def _node(script: str) -> Callable[[Path, Path, str], list[str | Path]]:
    def command(_python: Path, folder: Path, url: str) -> list[str | Path]:
        (folder / "lock.js").write_text(script)
        return ["node", "lock.js", f"{url}?application_name=advisory-lock"]

    return command


def _written(key: Any) -> str:
    """A key as the docs' table writes it: a bigint, or a pair."""
    return f"({key[0]}, {key[1]})" if isinstance(key, list) else str(key)


@pytest.mark.parametrize(
    ("entry", "application_name", "command"),
    [
        ("billing_nightly", "pals", _python(PALS)),
        ("nightly_billing_django", "django-pgware", _python(DJANGO)),
        ("nightly_billing_pglock", "django-pglock", _python(DJANGO_PGLOCK)),
        ("leader_election", "advisory-lock", _node(ADVISORY_LOCK)),
    ],
)
@pytest.mark.any_version
def test_a_library_computes_and_takes_the_documented_key(
    exporter: RunningExporter,
    pg: EmbeddedPostgres,
    py_clients: Path,
    npm_clients: Path,
    start_client: StartClient,
    tmp_path: Path,
    entry: str,
    application_name: str,
    command: Callable[[Path, Path, str], list[str | Path]],
) -> None:
    """PALs 0.4's Locker("billing").lock("nightly"), django-pgware 1.0's
    advisory_lock("nightly-billing"), advisory-lock 2.0's
    createMutex(url)("leader-election").lock(): each one's own key is the table's, and the
    lock it holds, idle and outside any transaction (a session lock), is named by the docs'
    entry until it lets go."""
    database = fresh_database(pg, "libraries")
    argv = command(py_clients, tmp_path, database_url(pg, database))
    client = start_client(entry, argv, client_environment(pg, database))
    wait_until(lambda: client.said("locked"), 60, f"{entry}'s library taking its lock")
    computed = _written(json.loads(client.output().splitlines()[0]))
    assert ("any", computed) == EXAMPLES[entry]
    watch = Watch(exporter, entry, database)
    holder = watch.held(client)
    assert holder["application_name"] == application_name
    assert lock_of(holder, entry)["key"] == computed
    check_level(holder, "session")
    client.proceed()
    client.finish()
    watch.gone()


@pytest.mark.any_version
def test_pg_boss_with_schema_jobs(
    exporter: RunningExporter,
    pg: EmbeddedPostgres,
    npm_clients: Path,
    start_client: StartClient,
    tmp_path: Path,
) -> None:
    """pg-boss 10.4 with schema "jobs" in database bossdb: its schema lock, which another
    installer takes with pg-boss's own SQL, is the table's key, named jobs_boss_migration
    there (and not the catalog's pgboss_migration, whose schema is pgboss)."""
    database = fresh_database(pg, "bossdb")
    watch = Watch(exporter, "jobs_boss_migration", database)
    boss, holder = pg_boss_starts(watch, pg, start_client, tmp_path, "jobs")
    assert (database, lock_of(holder, watch.key)["key"]) == EXAMPLES[watch.key]
    boss.proceed()
    assert "created queue reports" in boss.finish()


@pytest.mark.any_version
def test_pgqueuer_with_prefix_jobs(
    exporter: RunningExporter, pg: EmbeddedPostgres, py_clients: Path, start_client: StartClient
) -> None:
    """PgQueuer 1.6 with PGQUEUER_PREFIX=jobs_: the keys it computes itself (its upgrade
    lock's crc32, the text of its statistics fold's hashtext()) are the docs' entries', and
    the locks it takes are named by them."""
    database = fresh_database(pg, "jobqueue")
    names = ("jobs_pgqueuer_upgrade", "jobs_pgqueuer_statistics")
    keys = pgqueuer_takes_its_locks(
        exporter, pg, start_client, py_clients, database, "jobs_", names
    )
    assert ("any", str(keys.upgrade)) == EXAMPLES["jobs_pgqueuer_upgrade"]
    [statistics] = [e for e in worked_examples_yaml() if e["name"] == names[1]]
    assert (statistics["text"], statistics["hash"]) == (keys.statistics_text, "hashtext")
