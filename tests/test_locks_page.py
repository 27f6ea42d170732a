"""/locks against a real server: a holder, a waiter it blocks, the page as JSON and as HTML
(rendered by a real headless Chromium), the rate limit counted in the server's own log."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import bcrypt
import psycopg
import pytest
import yaml
from support import (
    FORENSICS_READ,
    MONITOR_PASSWORD,
    Config,
    LoggedReads,
    RunningExporter,
    Session,
    SilentServer,
    StartExporter,
    basic_auth,
    block_on,
    wait_until,
)

from devtools.embedded_postgres import EmbeddedPostgres, free_port
from pg_advisory_exporter.config.targets import LocksPageSettings
from pg_advisory_exporter.forensics.read import (
    FORENSICS_SQL,
    FORENSICS_WITH_QUERY_SQL,
    LOCKS_PER_BACKEND,
    parameters,
)
from pg_advisory_exporter.http.app import LOCKS_AT_ONCE

KEY = 4242
# The waiter's statement: its text must never reach the page unless query text is on.
WAITER_SQL = f"SELECT pg_advisory_lock({KEY}) /* waiter-secret-text */"
SECRET = "waiter-secret-text"
ARTIFACTS = Path(__file__).resolve().parent.parent / "build" / "test-artifacts"


@dataclass
class Contention:
    holder: int  # pid
    waiter: int  # pid
    before_the_wait: float  # time.monotonic() before the waiter asked for the lock


@pytest.fixture
def contention(pg: EmbeddedPostgres, session: Session) -> Iterator[Contention]:
    """ "billing-worker" holds KEY, idle; "billing-waiter" waits for it in a thread."""
    holder = session("billing-worker")
    holder.execute(f"SELECT pg_advisory_lock({KEY})")
    waiter = session("billing-waiter")
    waiter_pid = waiter.info.backend_pid
    before_the_wait = time.monotonic()
    blocked = block_on(pg, waiter, WAITER_SQL)
    yield Contention(holder.info.backend_pid, waiter_pid, before_the_wait)
    holder.execute(f"SELECT pg_advisory_unlock({KEY})")  # the waiter gets it and returns
    blocked.join(timeout=10)


def _config(dsn: str, **locks_page: Any) -> Config:
    target: dict[str, Any] = {"name": "main", "dsn": dsn}
    if locks_page:
        target["locks_page"] = locks_page
    return {
        "collection": {"min_interval": "1ms", "reconnect_backoff_max": "1s"},
        "keys": [{"name": "billing_batch", "key": KEY}],
        "targets": [target],
    }


def _json(exporter: RunningExporter, query: str = "target=main&format=json") -> dict[str, Any]:
    status, body = exporter.get(f"/locks?{query}")
    assert status == 200, body
    found: dict[str, Any] = json.loads(body)
    return found


def test_holder_waiter_and_blocker_as_json(
    start_exporter: StartExporter, monitor_dsn: str, contention: Contention
) -> None:
    exporter = start_exporter(config=_config(monitor_dsn))
    page = _json(exporter)
    assert page["target"] == "main"
    assert page["query_text"] is False
    [holder] = [h for h in page["holders"] if h["pid"] == contention.holder]
    assert holder["application_name"] == "billing-worker"
    assert holder["client_addr"] == "127.0.0.1"
    assert isinstance(holder["client_port"], int)
    assert holder["backend_start"]
    assert holder["state"] == "idle"
    assert holder["session_level"] is True
    assert holder["terminate"] == f"SELECT pg_terminate_backend({contention.holder})"
    assert holder["held_entries"] == 1
    [lock] = holder["locks"]
    assert (lock["key"], lock["key_name"], lock["key_source"]) == (
        str(KEY),
        "billing_batch",
        "registry",
    )
    assert (lock["mode"], lock["granted"]) == ("exclusive", True)
    assert "query" not in holder  # not read at all when off

    [waiter] = page["waiters"]
    assert waiter["pid"] == contention.waiter
    assert waiter["application_name"] == "billing-waiter"
    assert waiter["blocked_by"] == [contention.holder]
    assert waiter["queued_behind"] == []
    assert waiter["awaits"]["key"] == str(KEY)
    assert waiter["awaits"]["key_name"] == "billing_batch"
    # The server's count of the wait, in seconds, within the test's own: not clamped to 0
    # from a negative (now and wait_start swapped), nor in milliseconds.
    assert 0 < waiter["awaits"]["wait_seconds"] <= time.monotonic() - contention.before_the_wait
    assert waiter["terminate"] is None  # it holds nothing: ending it would release nothing

    [contended] = page["contended_keys"]
    assert contended["holders"] == [{"pid": contention.holder, "mode": "exclusive"}]
    assert contended["waiters"] == [{"pid": contention.waiter, "mode": "exclusive"}]
    # The exporter's own backend is never listed.
    assert page["backends_total"] == 2

    status, html_page = exporter.get("/locks?target=main")
    assert status == 200
    assert "<h2>Waiters (1)</h2>" in html_page
    for text in (json.dumps(page), html_page):
        assert SECRET not in text
    # A client that asks for JSON gets it without the parameter.
    status, body = exporter.get("/locks?target=main", {"Accept": "application/json"})
    assert status == 200
    assert json.loads(body)["target"] == "main"


def test_query_text_only_when_on_and_cut_on_the_server(
    start_exporter: StartExporter, monitor_dsn: str, contention: Contention
) -> None:
    exporter = start_exporter(config=_config(monitor_dsn, query_text=True, query_text_length=10))
    page = _json(exporter)
    assert page["query_text"] is True
    [waiter] = page["waiters"]
    assert waiter["query"] == WAITER_SQL[:10]
    _, html_page = exporter.get("/locks?target=main")
    assert WAITER_SQL[:10] in html_page
    for text in (json.dumps(page), html_page):
        assert SECRET not in text


@pytest.mark.any_version  # the exporter's reuse of a read
def test_requests_close_together_share_one_read(
    pg: EmbeddedPostgres, start_exporter: StartExporter, monitor_dsn: str, contention: Contention
) -> None:
    exporter = start_exporter(config=_config(monitor_dsn, reuse_for="3s"))
    reads = LoggedReads(pg, FORENSICS_READ)
    # Concurrent requests wait for the one read; those that follow within reuse_for get it.
    with ThreadPoolExecutor(max_workers=4) as pool:
        pages = list(pool.map(lambda _: _json(exporter), range(4)))
    second = _json(exporter)
    assert {p["read_at"] for p in [*pages, second]} == {pages[0]["read_at"]}
    wait_until(lambda: reads.count() == 1, 5, "one read in the server log")
    assert second["age_seconds"] > 0
    time.sleep(3.2)
    third = _json(exporter)
    assert third["age_seconds"] == 0
    wait_until(lambda: reads.count() == 2, 5, "a second read after reuse_for")
    time.sleep(0.5)
    assert reads.count() == 2
    # A scrape never reads it.
    exporter.scrape()
    time.sleep(0.5)
    assert reads.count() == 2


def test_a_busy_holder_is_capped_and_its_contended_key_still_listed(
    pg: EmbeddedPostgres, start_exporter: StartExporter, monitor_dsn: str, session: Session
) -> None:
    busy = session("busy-worker")
    busy.execute("SELECT pg_advisory_lock(k) FROM generate_series(1, 60) AS k")
    waiter = session("late-worker")
    blocked = block_on(pg, waiter, "SELECT pg_advisory_lock(60)")
    page = _json(start_exporter(config=_config(monitor_dsn)))
    [holder] = page["holders"]
    assert holder["held_entries"] == 60
    assert len(holder["locks"]) == LOCKS_PER_BACKEND
    assert holder["locks_left_out"] == 60 - LOCKS_PER_BACKEND
    assert holder["locks"][0]["key"] == "60"  # the contended key first, past the cap or not
    [waits] = page["waiters"]
    assert waits["blocked_by"] == [busy.info.backend_pid]
    busy.execute("SELECT pg_advisory_unlock_all()")
    blocked.join(timeout=10)


@pytest.mark.any_version  # HTTP answers
def test_bad_requests_and_unknown_targets(start_exporter: StartExporter, monitor_dsn: str) -> None:
    exporter = start_exporter(config=_config(monitor_dsn))
    assert exporter.get("/locks")[0] == 400
    assert exporter.get("/locks?target=main&target=main")[0] == 400
    assert exporter.get("/locks?target=main&format=xml")[0] == 400
    status, body = exporter.get("/locks?target=host%3Ddb.example")
    assert status == 404
    assert "main" in body
    status, landing = exporter.get("/")
    assert 'href="/locks?target=main"' in landing


def test_a_server_that_is_down_answers_503_and_the_exporter_carries_on(
    start_exporter: StartExporter,
) -> None:
    port = free_port()  # nobody listens there
    dsn = f"host=127.0.0.1 port={port} user=monitor dbname=postgres password={MONITOR_PASSWORD}"
    exporter = start_exporter(config=_config(dsn))
    status, body = exporter.get("/locks?target=main&format=json")
    assert status == 503
    answer = json.loads(body)
    assert answer["target"] == "main"
    assert "127.0.0.1" in answer["error"]
    assert MONITOR_PASSWORD not in body
    status, html_page = exporter.get("/locks?target=main")
    assert status == 503
    assert "Cannot read the server" in html_page
    assert MONITOR_PASSWORD not in html_page
    assert exporter.scrape().value("pg_advisory_up", target="main") == 0
    assert exporter.get("/-/healthy") == (200, "OK\n")


@pytest.mark.any_version  # HTTP answers
def test_head_answers_without_a_body(start_exporter: StartExporter, monitor_dsn: str) -> None:
    exporter = start_exporter(config=_config(monitor_dsn))
    assert exporter.get("/locks?target=main", method="HEAD") == (200, "")
    assert exporter.get("/locks?target=main", method="POST")[0] == 405


@pytest.mark.any_version  # HTTP answers
def test_the_web_configuration_guards_locks(
    start_exporter: StartExporter, monitor_dsn: str, tmp_path: Path
) -> None:
    password = "locks-Pw-91c2"
    web = tmp_path / "web.yml"
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(4)).decode()
    web.write_text(yaml.safe_dump({"basic_auth_users": {"admin": hashed}}))
    exporter = start_exporter("--web.config.file", str(web), config=_config(monitor_dsn))
    assert exporter.get("/locks?target=main")[0] == 401
    assert exporter.get("/locks?target=main", basic_auth("admin", "wrong"))[0] == 401
    assert exporter.get("/locks?target=main", basic_auth("admin", password))[0] == 200


@pytest.mark.any_version  # the page in a browser
def test_chromium_renders_the_page(
    start_exporter: StartExporter,
    monitor_dsn: str,
    contention: Contention,
    chromium: str,
    tmp_path: Path,
) -> None:
    exporter = start_exporter(config=_config(monitor_dsn))
    url = f"{exporter.base}/locks?target=main"
    dom = _chromium(chromium, tmp_path, "--dump-dom", url).stdout
    assert f"SELECT pg_terminate_backend({contention.holder})" in dom
    assert f"<td>{contention.holder}</td>" in dom
    assert "billing_batch" in dom
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    png = ARTIFACTS / "locks-page.png"
    png.unlink(missing_ok=True)
    _chromium(chromium, tmp_path, f"--screenshot={png}", "--window-size=1280,900", url)
    data = png.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    assert len(data) > 10_000, f"a {len(data)}-byte screenshot is blank"


# -- At a glance: a demo-like server (devtools/demo.py's bulk import) and a chain of waits ----

BULK_NAMESPACE, BULK_LOCKS = 900000, 2000
CHAIN_KEY = 77  # the middle of the chain holds it; the tail waits for it


@dataclass
class Glance:
    bulk: int  # holds BULK_LOCKS keys of the namespace, in a transaction
    checker: int  # waits for the bulk import's last key
    head: int  # holds KEY
    middle: int  # holds CHAIN_KEY, waits for KEY
    tail: int  # waits for CHAIN_KEY


@pytest.fixture
def glance(pg: EmbeddedPostgres, session: Session) -> Glance:
    """A chain tail <- middle <- head, and a bulk import that one backend waits for."""
    bulk = session("bulk-import", autocommit=False)
    bulk.execute(
        "SELECT count(pg_advisory_xact_lock(%s, i)) FROM generate_series(1, %s) AS i",
        (BULK_NAMESPACE, BULK_LOCKS),
    )
    checker = session("import-checker")
    block_on(pg, checker, f"SELECT pg_advisory_lock({BULK_NAMESPACE}, {BULK_LOCKS})")
    head = session("billing-worker")
    head.execute(f"SELECT pg_advisory_lock({KEY})")
    middle = session("billing-middle")
    middle.execute(f"SELECT pg_advisory_lock({CHAIN_KEY})")
    block_on(pg, middle, f"SELECT pg_advisory_lock({KEY})")
    tail = session("billing-tail")
    block_on(pg, tail, f"SELECT pg_advisory_lock({CHAIN_KEY})")
    pids = [conn.info.backend_pid for conn in (bulk, checker, head, middle, tail)]
    return Glance(*pids)  # the session fixture cancels and closes them all


def _glance_config(dsn: str) -> Config:
    config = _config(dsn)
    config["keys"].append({"name": "bulk_import", "namespace": BULK_NAMESPACE})
    return config


@dataclass
class Element:
    """An element of a parsed page: enough of a DOM to assert its structure."""

    tag: str
    attrs: dict[str, str]
    children: list[Element | str] = field(default_factory=list)

    @property
    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())

    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    def elements(self) -> list[Element]:
        return [c for c in self.children if isinstance(c, Element)]

    def find_all(self, tag: str, cls: str | None = None, *, deep: bool = True) -> list[Element]:
        found = []
        for child in self.elements():
            if child.tag == tag and (cls is None or cls in child.classes):
                found.append(child)
            if deep:
                found += child.find_all(tag, cls)
        return found

    def find(self, tag: str, cls: str | None = None) -> Element:
        [only] = self.find_all(tag, cls)
        return only


_VOID = frozenset({"meta", "col", "br", "link", "img", "input"})


class _Parser(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.root = Element("#document", {})
        self.stack = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = Element(tag, {name: value or "" for name, value in attrs})
        self.stack[-1].children.append(element)
        if tag not in _VOID:
            self.stack.append(element)

    def handle_endtag(self, tag: str) -> None:
        assert tag in [e.tag for e in self.stack], f"</{tag}> closes nothing"
        while self.stack.pop().tag != tag:
            pass

    def handle_data(self, data: str) -> None:
        self.stack[-1].children.append(data)


def parse_html(page: str) -> Element:
    parser = _Parser()
    parser.feed(page)
    parser.close()
    assert parser.stack == [parser.root], "unclosed elements"
    return parser.root


def _row(table: Element, pid: int) -> list[Element]:
    [row] = [r for r in table.find_all("tr") if r.elements()[0].text() == str(pid)]
    return row.find_all("td", deep=False)


def _tree(item: Element) -> tuple[int, list[Any]]:
    """A chain's list item as (pid, [its waiters' trees])."""
    nested = item.find_all("ul", deep=False)
    waiters = [_tree(li) for ul in nested for li in ul.find_all("li", deep=False)]
    return int(item.attrs["data-pid"]), waiters


@pytest.mark.any_version  # the page's layout
def test_the_page_at_a_glance_shows_the_chain_first_and_a_bulk_holder_in_one_line(
    start_exporter: StartExporter, monitor_dsn: str, glance: Glance
) -> None:
    exporter = start_exporter(config=_glance_config(monitor_dsn))
    status, page = exporter.get("/locks?target=main")
    assert status == 200
    document = parse_html(page)
    headings = [h.text() for h in document.find_all("h2")]
    assert headings[0] == "Who blocks whom"
    # Each waiter under its blockers, from the head blockers down.
    chains = document.find("ul", "chains")
    forest = [_tree(li) for li in chains.find_all("li", deep=False)]
    assert (glance.head, [(glance.middle, [(glance.tail, [])])]) in forest
    assert (glance.bulk, [(glance.checker, [])]) in forest
    assert len(forest) == 2

    # The bulk import: one row, its keys counted per group, the awaited one outside the
    # disclosure, all those read inside it.
    holders = document.find_all("table")[1]
    cells = _row(holders, glance.bulk)
    assert cells[1].text() == f"{BULK_LOCKS:,}"
    keys = cells[2]
    groups = keys.find("ul", "groups").find_all("li")
    assert [(g.find("span", "group").text(), g.find("span", "count").text()) for g in groups] == [
        ("bulk_import", str(LOCKS_PER_BACKEND))
    ]
    assert (
        f"{BULK_LOCKS - LOCKS_PER_BACKEND:,} more not read" in keys.find("span", "summary").text()
    )
    assert f"({BULK_NAMESPACE}, {BULK_LOCKS})" in keys.find("span", "contended").text()
    assert len(keys.find("span", "first").find_all("code")) == 5
    details = keys.find("details")
    assert (
        details.find("summary").text() == f"all {LOCKS_PER_BACKEND} keys read (of {BULK_LOCKS:,})"
    )
    assert len(details.find("ol", "keys").find_all("li")) == LOCKS_PER_BACKEND
    # The middle of the chain holds one key that the tail awaits, and awaits one itself.
    middle = _row(holders, glance.middle)[2]
    assert str(CHAIN_KEY) in middle.find("span", "contended").text()
    assert str(KEY) in middle.find("span", "awaits").text()
    assert middle.find_all("details") == []

    found = _json(exporter)
    [bulk] = [h for h in found["holders"] if h["pid"] == glance.bulk]
    assert bulk["key_groups"] == [{"group": "bulk_import", "locks": LOCKS_PER_BACKEND}]
    assert bulk["locks_left_out"] == BULK_LOCKS - LOCKS_PER_BACKEND
    [head] = [c for c in found["blocking_chains"] if c["pid"] == glance.head]
    assert head["awaits"] is None
    [middle_node] = head["waiters"]
    assert (middle_node["pid"], middle_node["awaits"]["key"]) == (glance.middle, str(KEY))
    [tail] = middle_node["waiters"]
    assert (tail["pid"], tail["awaits"]["key"], tail["waiters"]) == (
        glance.tail, str(CHAIN_KEY), []
    )  # fmt: skip


# Written into the title once the page has loaded: in a copy of the page read from a file,
# since the page itself runs no script (its Content-Security-Policy, sent as a header, forbids
# any, and a file has no header).
_MEASURE = (
    "<script>addEventListener('load', () => { document.title = 'width ' + "
    "document.documentElement.scrollWidth; });</script>"
)


@pytest.mark.any_version  # the page in a browser
def test_the_demo_like_page_fits_a_1280_px_window(
    start_exporter: StartExporter, monitor_dsn: str, glance: Glance, chromium: str, tmp_path: Path
) -> None:
    exporter = start_exporter(config=_glance_config(monitor_dsn))
    status, page = exporter.get("/locks?target=main")
    assert status == 200
    copy = tmp_path / "locks.html"
    copy.write_text(page.replace("</body>", _MEASURE + "</body>"))
    dom = _chromium(
        chromium, tmp_path, "--window-size=1280,2000", "--dump-dom", copy.as_uri()
    ).stdout
    title = parse_html(dom).find("title").text()
    assert title.startswith("width "), title
    assert int(title.removeprefix("width ")) <= 1280, "the page scrolls sideways"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    png = ARTIFACTS / "locks-page-at-a-glance.png"
    png.unlink(missing_ok=True)
    url = f"{exporter.base}/locks?target=main"
    _chromium(chromium, tmp_path, f"--screenshot={png}", "--window-size=1280,1400", url)
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def _chromium(binary: str, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Headless Chromium with a profile of its own under `home` (removed with it)."""
    profile = home / "chromium"
    command = [binary, "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run",
               "--disable-dev-shm-usage", f"--user-data-dir={profile}", *args]  # fmt: skip
    env = {
        **os.environ,
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home),
        "XDG_CACHE_HOME": str(home),
    }
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=60, check=False, env=env
    )
    assert result.returncode == 0, result.stderr
    return result


def _function_scans(plan: dict[str, Any], name: str) -> int:
    own = int(plan.get("Function Name") == name)
    return own + sum(_function_scans(child, name) for child in plan.get("Plans", ()))


@pytest.mark.parametrize("sql", [FORENSICS_SQL, FORENSICS_WITH_QUERY_SQL], ids=["plain", "query"])
def test_the_statement_reads_pg_locks_once(pg: EmbeddedPostgres, sql: str) -> None:
    # pg_locks is pg_lock_status(): each scan of it copies the whole lock table under every
    # lock-manager partition lock. The plan must scan it once, however the CTE is used.
    given = parameters(LocksPageSettings(query_text=True, query_text_length=10))
    with pg.connect() as conn:
        row = conn.execute(f"EXPLAIN (FORMAT JSON) {sql}", given).fetchone()
    assert row is not None
    assert _function_scans(row[0][0]["Plan"], "pg_lock_status") == 1


def _fetch(url: str) -> tuple[int, str | None, bytes, float]:
    """Status, Retry-After, body and the seconds the answer took; an error status too."""
    started = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            status, retry, body = response.status, response.headers["Retry-After"], response.read()
    except urllib.error.HTTPError as error:
        status, retry, body = error.code, error.headers["Retry-After"], error.read()
    return status, retry, body, time.monotonic() - started


def _timed(url: str, times: int) -> list[float]:
    """The seconds each of `times` requests in a row took; each must answer 200."""
    took = []
    for _ in range(times):
        status, _, body, seconds = _fetch(url)
        assert status == 200, body
        took.append(seconds)
    return took


@pytest.mark.any_version  # HTTP answers
def test_requests_for_a_hung_server_take_a_few_slots_and_the_rest_are_told_to_retry(
    start_exporter: StartExporter, monitor_dsn: str, silent_server: SilentServer
) -> None:
    hung = f"host=127.0.0.1 port={silent_server.port} user=monitor dbname=postgres"
    config = _config(monitor_dsn)
    config["targets"].append({"name": "hung", "dsn": hung})
    config["collection"] |= {"connect_timeout": "4s", "statement_timeout": "1s"}
    exporter = start_exporter(config=config)
    healthy, probe = f"{exporter.base}/-/healthy", f"{exporter.base}/probe?target=main"
    before = sorted(_timed(healthy, 5) + _timed(probe, 5))
    viewers = 100
    with ThreadPoolExecutor(max_workers=viewers) as pool:
        url = f"{exporter.base}/locks?target=hung"
        answers = [pool.submit(_fetch, url) for _ in range(viewers)]
        # The first ones wait for the server, which answers nothing for connect_timeout: the
        # others are answered meanwhile.
        answered, waiting = wait(answers, timeout=1.5)
        meanwhile = sorted(_timed(healthy, 5) + _timed(probe, 5))
    told = [a.result() for a in answered]
    assert len(waiting) <= LOCKS_AT_ONCE
    assert {(status, retry) for status, retry, _, _ in told} == {(429, "5")}  # reuse_for: 5s
    assert all(a.result()[0] == 503 for a in waiting)  # after the server's deadline
    # Liveness and a healthy target's scrape, the 8th of 10 (the loaded machine has noise).
    assert meanwhile[7] < before[7] + 0.1, (before, meanwhile)


HOLDERS, WAITERS, HELD_EACH = 150, 200, LOCKS_PER_BACKEND + 10


def _peak_rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    [line] = [line for line in status.splitlines() if line.startswith("VmHWM:")]
    return int(line.split()[1]) / 1024


@pytest.mark.any_version  # the exporter's reuse of a read and its rendering
def test_a_hundred_viewers_of_a_large_answer_leave_metrics_and_memory_alone(
    own_server: EmbeddedPostgres, start_exporter: StartExporter
) -> None:
    # 150 holders of 60 keys each (50 listed) and 200 waiters: about 1.2 MB of JSON.
    own_server.stop()
    own_server.start(max_connections=HOLDERS + WAITERS + 20)
    sessions = [psycopg.connect(own_server.dsn(), autocommit=True) for _ in range(HOLDERS)]
    try:
        for i, holder in enumerate(sessions):
            first = i * 1000
            holder.execute(
                "SELECT pg_advisory_lock(k) FROM generate_series(%s::bigint, %s) AS k",
                (first, first + HELD_EACH - 1),
            )
        for i in range(WAITERS):
            waiter = psycopg.connect(own_server.dsn(), autocommit=True)
            sessions.append(waiter)
            # Sent, not awaited: the backend waits for the key while this test goes on.
            waiter.pgconn.send_query(f"SELECT pg_advisory_lock({i % HOLDERS * 1000})".encode())
        with own_server.connect() as admin:
            waiting = "SELECT count(*) FROM pg_locks WHERE NOT granted"
            wait_until(lambda: admin.execute(waiting).fetchone() == (WAITERS,), 20, "the waiters")
        _viewed_by_a_hundred(start_exporter(config=_config(own_server.dsn(), reuse_for="1s")))
    finally:
        for conn in sessions:
            conn.close()


# A hundred viewers, each asking for three pages (JSON or HTML) and asking again a quarter of
# Retry-After later when told to; in a process of their own at the lowest priority, as if on
# other machines: on the test's two cores, their own work would otherwise delay /metrics.
_VIEWERS = """
import json, os, sys, threading, time, urllib.error, urllib.request
os.nice(19)
base, sizes, told = sys.argv[1], [], []
def view(number):
    page = "json" if number % 2 == 0 else "html"
    seen = 0
    for _ in range(60):
        try:
            with urllib.request.urlopen(f"{base}/locks?target=main&format={page}") as answer:
                sizes.append(len(answer.read()))
            seen += 1
            if seen == 3:
                return
        except urllib.error.HTTPError as error:
            told.append((error.code, error.headers["Retry-After"]))
            time.sleep(float(error.headers["Retry-After"] or 1) / 4)
viewers = [threading.Thread(target=view, args=(n,)) for n in range(100)]
for viewer in viewers:
    viewer.start()
for viewer in viewers:
    viewer.join()
print(json.dumps({"sizes": sizes, "told": told}))
"""


def _viewed_by_a_hundred(exporter: RunningExporter) -> None:
    metrics = f"{exporter.base}/metrics"
    before = sorted(_timed(metrics, 7))
    # The answer is read again every second meanwhile (reuse_for), and rendered once a read.
    viewers = subprocess.Popen(
        [sys.executable, "-c", _VIEWERS, exporter.base], stdout=subprocess.PIPE, text=True
    )
    meanwhile: list[float] = []
    while viewers.poll() is None or len(meanwhile) < 7:
        meanwhile += _timed(metrics, 1)
    seen = json.loads(viewers.communicate(timeout=60)[0])
    meanwhile.sort()
    rss = _peak_rss_mb(exporter.process.pid)
    figures = f"/metrics before {before}, meanwhile {meanwhile}; peak RSS {rss:.0f} MB"
    assert len(seen["sizes"]) == 300
    assert min(seen["sizes"]) > 300_000, figures  # each got the whole page
    assert {tuple(told) for told in seen["told"]} <= {(429, "1")}
    page = _json(exporter)
    assert (len(page["holders"]), len(page["waiters"])) == (HOLDERS, WAITERS)
    # The median and the worst but one against the same before the viewers came, and the
    # worst against a stall: /metrics queued behind the viewers' 300 renderings of a 1.2 MB
    # page would take seconds. The slowest say as much of the machine's other load as of the
    # exporter: 0.37 s and 0.48 s, with 0.12 s before, beside two busy loops.
    assert meanwhile[len(meanwhile) // 2] < before[3] + 0.1, figures
    assert meanwhile[-2] < before[-1] + 0.5, figures
    assert meanwhile[-1] < 2.0, figures
    assert rss < 128, figures


def test_a_name_distributed_lock_packed_in_its_key_is_shown(
    start_exporter: StartExporter, monitor_dsn: str, session: Session
) -> None:
    """DistributedLock.Postgres' PostgresAdvisoryLockKey("nightly") is the pair below (7 bits
    a character, a 0, then 1s: tests/test_packed_names.py); held for real, /locks names it
    without any registry entry, and says where the name came from."""
    holder = session("dotnet-worker")
    holder.execute("SELECT pg_advisory_lock(-576242034, -1690517505)")
    exporter = start_exporter(config=_config(monitor_dsn))
    [row] = [h for h in _json(exporter)["holders"] if h["application_name"] == "dotnet-worker"]
    [lock] = row["locks"]
    assert (lock["key"], lock["key_name"], lock["key_source"]) == (
        "(-576242034, -1690517505)",
        "DistributedLock 'nightly'",
        "packed",
    )
