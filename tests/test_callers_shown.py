"""The caller behind a lock on a real server (hygiene/callers.py): holders and a waiter whose
last statements are annotated each of the ways applications do it, hostile ones too, shown
by /locks as JSON and HTML and by `check` as JSON and text.

django-pgware (django-pglocks 2), its comment asked for, and google-cloud-sqlcommenter's
Django middleware run for real from the libraries' virtualenv (tests/py-clients.txt): the
middleware's `%` of URL-encoding doubled (google/cloud/sqlcommenter/__init__.py, url_quote)
and kept by a statement run without parameters. Rails' are statements written exactly as
Rails 7.1's QueryLogs writes them, in its sqlcommenter format (`key='url-encoded value'`,
sorted, appended) and in its legacy format with prepend_comment (`/*key:value,...*/ ` before
the statement): Debian's Rails is 6.1, older than query log tags, and RubyGems is not
reachable here.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

import pytest
from clients import PY_REQUIREMENTS, StartClient, client_environment, fresh_database
from support import Cli, Session, StartExporter, block_on, wait_until, write_config

from devtools.embedded_postgres import EmbeddedPostgres

RAILS_LEGACY_PREPENDED = (
    "/*application:Shop,controller:orders,action:create*/ SELECT pg_advisory_lock(7001)"
)
RAILS_SQLCOMMENTER = (
    "SELECT pg_advisory_lock(7002) /*action='create',application='Shop',controller='orders'*/"
)
# Longer than track_activity_query_size (1024 bytes): the server keeps the start only, cut in
# the literal. The leading annotation is read, HTML and all; the trailing one is cut away.
LONG = "v" * 10_000
HOSTILE_LEADING = (
    "/*a='%3Cscript%3Ealert(1)%3C%2Fscript%3E',b='line%0Abreak',c='</td><b>raw'*/ "
    f"SELECT pg_advisory_lock(7003), '{LONG}'"
)
HOSTILE_TRAILING = f"SELECT pg_advisory_lock(7004), '{LONG}' /*controller='lost'*/"
SCRIPT = "<script>alert(1)</script>"
DJANGO_VERSION = re.findall(r"^Django==(\S+)$", PY_REQUIREMENTS.read_text(), re.MULTILINE)[0]

DJANGO_PGWARE = """\
import os
import sys

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

with advisory_lock("nightly-billing", comment=True):
    print("locked", flush=True)
    sys.stdin.readline()
"""
# google-cloud-sqlcommenter's Django middleware, the request served in the script by Django's
# test client: its view takes the lock and holds it until told.
DJANGO_SQLCOMMENTER = """\
import os
import sys

import django
from django.conf import settings
from django.db import connection
from django.http import HttpResponse
from django.test import Client
from django.urls import path

settings.configure(
    ALLOWED_HOSTS=["testserver"],
    ROOT_URLCONF="__main__",
    MIDDLEWARE=["google.cloud.sqlcommenter.django.middleware.SqlCommenter"],
    DATABASES={
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            **{name: os.environ[f"PG{name}"] for name in ("HOST", "PORT", "USER", "PASSWORD")},
            "NAME": os.environ["PGDATABASE"],
            "OPTIONS": {"application_name": "django-sqlcommenter"},
        }
    },
)
django.setup()


def create_order(request, id):
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(7001)")
    print("locked", flush=True)
    sys.stdin.readline()
    return HttpResponse("created")


urlpatterns = [path("orders/<int:id>/", create_order, name="orders-create")]
assert Client().get("/orders/42/").status_code == 200
"""
DJANGO_LINE = DJANGO_PGWARE.splitlines().index(
    'with advisory_lock("nightly-billing", comment=True):'
)


def _callers(document: dict[str, Any]) -> dict[int, dict[str, Any] | None]:
    """Each listed waiter's and holder's caller, by pid."""
    backends = document["waiters"] + document["holders"]
    return {backend["pid"]: backend["caller"] for backend in backends}


@pytest.mark.any_version  # the statement's column is read the same way on every version
def test_locks_and_check_show_each_caller_escaped_and_bounded(
    pg: EmbeddedPostgres,
    session: Session,
    start_exporter: StartExporter,
    monitor_dsn: str,
    cli: Cli,
    py_clients: Path,
    start_client: StartClient,
    tmp_path: Path,
) -> None:
    database = fresh_database(pg, "callers")
    script = tmp_path / "jobs.py"
    script.write_text(DJANGO_PGWARE)
    django = start_client("django-pgware", [py_clients, script], client_environment(pg, database))
    wait_until(lambda: django.said("locked"), 60, "django-pgware taking its lock")
    django_location = f"{script}:{DJANGO_LINE + 1}"
    web_script = tmp_path / "web.py"
    web_script.write_text(DJANGO_SQLCOMMENTER)
    web = start_client("django-sqlcommenter", [py_clients, web_script], client_environment(pg))
    wait_until(lambda: web.said("locked"), 60, "the Django view taking its lock")

    pids: dict[str, int] = {}
    for name, statement in [
        ("rails-sqlcommenter", RAILS_SQLCOMMENTER),
        ("hostile-leading", HOSTILE_LEADING),
        ("hostile-trailing", HOSTILE_TRAILING),
    ]:
        conn = session(name)
        conn.execute(statement.encode())  # bytes: run as written, `%%` and all
        pids[name] = conn.info.backend_pid
    waiter = session("rails-legacy")
    pids["rails-legacy"] = waiter.info.backend_pid
    blocked = block_on(pg, waiter, RAILS_LEGACY_PREPENDED)

    expected: dict[int, tuple[list[str], list[list[str]]] | None] = {
        pids["rails-sqlcommenter"]: (
            ["sqlcommenter"],
            [["action", "create"], ["application", "Shop"], ["controller", "orders"]],
        ),
        pids["rails-legacy"]: (
            ["rails"], [["application", "Shop"], ["controller", "orders"], ["action", "create"]]
        ),
        pids["hostile-leading"]: (
            ["sqlcommenter"], [["a", SCRIPT], ["b", "line\\nbreak"], ["c", "</td><b>raw"]]
        ),
        pids["hostile-trailing"]: None,
    }  # fmt: skip

    def shown(document: dict[str, Any]) -> None:
        callers = _callers(document)
        for pid, want in expected.items():
            found = callers[pid]
            assert (found and (found["styles"], found["tags"])) == want, pid
        holders = {h["application_name"]: h["caller"] for h in document["holders"]}
        assert holders["django-pgware"]["styles"] == ["django-pglocks"]
        assert holders["django-pgware"]["tags"] == [
            ["lock_id", "'nightly-billing'"], ["location", django_location]
        ]  # fmt: skip
        assert holders["django-sqlcommenter"]["styles"] == ["sqlcommenter"]
        assert holders["django-sqlcommenter"]["tags"] == [
            ["controller", "orders-create"], ["framework", f"django:{DJANGO_VERSION}"],
            ["route", "orders/<int:id>/"],
        ]  # fmt: skip

    config = {
        "collection": {"min_interval": "1ms"},
        "targets": [{"name": "main", "dsn": monitor_dsn}],
    }
    exporter = start_exporter(config=config)
    status, body = exporter.get("/locks?target=main&format=json")
    assert status == 200, body
    shown(json.loads(body))

    status, page = exporter.get("/locks?target=main")
    assert status == 200, page
    assert "<script" not in page
    assert "<b>raw" not in page
    caller = '<span class="note">caller</span> '
    assert caller + html.escape(f"a={SCRIPT}, b=line\\nbreak, c=</td><b>raw") in page
    assert caller + "application=Shop, controller=orders, action=create" in page
    assert caller + html.escape(f"lock_id='nightly-billing', location={django_location}") in page
    assert "lost" not in page

    path = write_config(tmp_path, {"targets": [{"name": "main", "dsn": monitor_dsn}]})
    result = cli("check", "--format", "json", "--config.file", str(path), check=True)
    [target] = json.loads(result.stdout)
    shown(target)
    text = cli("check", "--config.file", str(path), check=True).stdout
    lines = text.splitlines()
    start = lines.index("  Callers, from the annotations of their last statements")
    listed = lines[start + 2 : lines.index("", start)]
    assert f"    {pids['rails-legacy']}  " in listed[0]  # the waiter first
    assert listed[0].endswith("application=Shop, controller=orders, action=create")
    assert any(line.endswith(f"a={SCRIPT}, b=line\\nbreak, c=</td><b>raw") for line in listed)
    # The waiter and four holders: each Django one and those expected, less the trailing one.
    assert len(listed) == 1 + 2 + len(expected) - 2
    # Turned off, not a character of the statements is read: no caller anywhere.
    quiet = {"locks_page": {"callers": False}, "targets": [{"name": "main", "dsn": monitor_dsn}]}
    path = write_config(tmp_path, quiet, "quiet.yaml")
    result = cli("check", "--format", "json", "--config.file", str(path), check=True)
    [target] = json.loads(result.stdout)
    assert set(_callers(target).values()) == {None}
    assert len(_callers(target)) >= len(expected) + 2

    web.proceed()  # its view returns, its connection closes: the waiter gets the lock
    web.finish()
    blocked.join(timeout=10)
    django.proceed()
    django.finish()
