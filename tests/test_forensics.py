"""The forensics without a server: rows mapped, blockers computed, keys named, lists capped,
answers shared, and the page escaped."""

from __future__ import annotations

import html
import io
import json
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta
from ipaddress import ip_network
from typing import Any
from urllib.parse import quote

import pytest
from support import BACKEND_START, Clock, forensic_backend

from pg_advisory_exporter.collect.connection import Unanswered
from pg_advisory_exporter.collect.databases import Databases
from pg_advisory_exporter.collect.poolers import PooledBackend, PoolerView
from pg_advisory_exporter.forensics.answers import Answer, OnDemand
from pg_advisory_exporter.forensics.blocking import assemble, conflicts
from pg_advisory_exporter.forensics.glance import CHAIN_DEPTH, blocking_chains
from pg_advisory_exporter.forensics.model import Backend, Forensics, LockEntry
from pg_advisory_exporter.forensics.page import Page, render
from pg_advisory_exporter.forensics.page_json import forensics_json
from pg_advisory_exporter.forensics.read import backend_from_row
from pg_advisory_exporter.forensics.text import print_forensics
from pg_advisory_exporter.hygiene.callers import caller_of
from pg_advisory_exporter.keys.key import BIGINT_KEY, INT_PAIR_KEY, AdvisoryKey
from pg_advisory_exporter.keys.key_config import KeyConfig
from pg_advisory_exporter.keys.registry import Registry

DATABASE = 5  # the oid of "app"
APP = Databases({DATABASE: "app"})


def _key(value: int) -> AdvisoryKey:
    return AdvisoryKey(BIGINT_KEY, (value,))


def _lock(key: int, mode: str = "exclusive", *, waiting_since: float | None = None) -> LockEntry:
    if waiting_since is None:
        return LockEntry(DATABASE, _key(key), mode, granted=True)
    return LockEntry(
        DATABASE,
        _key(key),
        mode,
        granted=False,
        wait_start=BACKEND_START + timedelta(seconds=waiting_since),
        wait_seconds=100.0 - waiting_since,
    )


def _read(*backends: Backend, **fields: Any) -> Forensics:
    return assemble("main", backends, **fields)


def _page(found: Forensics, age: float, as_json: bool) -> str:
    return b"".join(render("main", Answer(found, None, 0.0), as_json).body(age)).decode()


def page_html(found: Forensics, age: float) -> str:
    return _page(found, age, as_json=False)


def page_json(found: Forensics, age: float) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(_page(found, age, as_json=True))
    return document


def test_modes_conflict_as_the_lock_manager_says() -> None:
    assert conflicts("exclusive", "exclusive")
    assert conflicts("exclusive", "share")
    assert conflicts("share", "exclusive")
    assert not conflicts("share", "share")


def test_a_waiter_is_blocked_by_conflicting_holders_of_its_key_only() -> None:
    exclusive = forensic_backend(1, _lock(42))
    elsewhere = forensic_backend(2, replace(_lock(42), database=DATABASE + 1))  # another database
    other_key = forensic_backend(3, _lock(43))
    waiter = forensic_backend(4, _lock(42, waiting_since=10), state="active")
    found = _read(exclusive, elsewhere, other_key, waiter)
    [waits] = found.waiters
    assert waits.backend.pid == 4
    assert waits.blocked_by == (1,)
    assert waits.queued_behind == ()
    [contended] = found.contended
    assert contended.key == _key(42)
    assert contended.holders == ((1, "exclusive"),)
    assert contended.waiters == ((4, "exclusive"),)


def test_share_holders_block_an_exclusive_waiter_and_queue_order_counts() -> None:
    readers = [forensic_backend(pid, _lock(7, "share")) for pid in (1, 2)]
    writer = forensic_backend(3, _lock(7, waiting_since=5), state="active")  # waits first
    reader = forensic_backend(4, _lock(7, "share", waiting_since=20), state="active")  # then this
    late_writer = forensic_backend(5, _lock(7, waiting_since=30), state="active")
    found = _read(*readers, writer, reader, late_writer)
    by_pid = {w.backend.pid: w for w in found.waiters}
    assert by_pid[3].blocked_by == (1, 2)
    assert by_pid[3].queued_behind == ()
    # Share does not conflict with the share holders: the exclusive waiter ahead holds it up.
    assert by_pid[4].blocked_by == ()
    assert by_pid[4].queued_behind == (3,)
    assert by_pid[5].blocked_by == (1, 2)
    assert by_pid[5].queued_behind == (3, 4)
    assert [w.backend.pid for w in found.waiters] == [3, 4, 5]  # the longest waiting first
    [contended] = found.contended
    assert contended.waiters == ((3, "exclusive"), (4, "share"), (5, "exclusive"))


def test_a_wait_not_yet_timed_queues_last_and_an_upgrade_is_not_its_own_blocker() -> None:
    holder = forensic_backend(1, _lock(9, "share"))
    upgrading = forensic_backend(2, _lock(9, "share"), _lock(9, waiting_since=1), state="active")
    unknown = forensic_backend(
        3, replace(_lock(9, waiting_since=2), wait_start=None), state="active"
    )
    by_pid = {w.backend.pid: w for w in _read(holder, upgrading, unknown).waiters}
    assert by_pid[2].blocked_by == (1,)
    assert by_pid[3].blocked_by == (1, 2)
    assert by_pid[3].queued_behind == (2,)
    assert by_pid[2].queued_behind == ()


def _registry() -> Registry:
    configs = [
        KeyConfig(name="billing_batch", key=4242),
        KeyConfig(name="negative", key=-7),
        KeyConfig(name="tenant_export", pair=(3001, -7)),
        KeyConfig(name="signup", namespace=1001),
        KeyConfig(name="billing_leader", key=42, databases=("billing",)),
    ]
    catalog = [KeyConfig(name="sqitch", key=75474063)]
    return Registry.resolve(configs, lambda texts, seeds: [], catalog)


def _columns(key: AdvisoryKey) -> tuple[int, int, int]:
    """pg_locks' objsubid, classid and objid for a key: unsigned halves."""
    if key.objsubid == BIGINT_KEY:
        value = key.parts[0] & 0xFFFFFFFFFFFFFFFF
        return BIGINT_KEY, value >> 32, value & 0xFFFFFFFF
    return INT_PAIR_KEY, key.parts[0] & 0xFFFFFFFF, key.parts[1] & 0xFFFFFFFF


@pytest.mark.parametrize(
    ("key", "datname", "name"),
    [
        (_key(4242), "app", "billing_batch"),
        (_key(-7), "app", "negative"),
        (AdvisoryKey(INT_PAIR_KEY, (3001, -7)), "app", "tenant_export"),
        (AdvisoryKey(INT_PAIR_KEY, (1001, 12345)), "app", "signup"),
        (AdvisoryKey(INT_PAIR_KEY, (1002, 12345)), "app", None),
        (_key(42), "billing", "billing_leader"),
        (_key(42), "app", None),  # registered for billing only
        (_key(75474063), "app", "sqitch"),
        (AdvisoryKey(INT_PAIR_KEY, (0, 4242)), "app", None),  # another key space
    ],
)
def test_keys_are_named_as_the_collection_names_them(
    key: AdvisoryKey, datname: str, name: str | None
) -> None:
    found = _registry().lookup(*_columns(key), datname)
    assert (found.name if found else None) == name


def _row(pid: int, locks: Sequence[Sequence[Any]], **fields: Any) -> dict[str, Any]:
    return {
        "pid": pid,
        "lock_entries": len(locks),
        "backends_total": 1,
        "locks": [list(lock) for lock in locks],
        "datid": DATABASE,
        "application_name": "billing-worker",
        "outside_transaction": True,
        "client_addr": "10.0.0.7",
        "client_port": 41000,
        "backend_start": BACKEND_START,
        "state": "idle",
        "state_seconds": 12.5,
        "xact_start": None,
        "backend_start_unix": BACKEND_START.timestamp(),
        "xact_start_unix": None,
        "now_unix": BACKEND_START.timestamp() + 3600,
        "caller_text": None,
        **fields,
    }


def test_rows_are_mapped_with_key_names_levels_and_poolers() -> None:
    pair = _columns(AdvisoryKey(INT_PAIR_KEY, (3001, -7)))
    waiting = _columns(_key(75474063))
    row = _row(
        10,
        [
            [DATABASE, waiting[1], waiting[2], BIGINT_KEY, "ExclusiveLock", False,
             "2026-01-01T02:00:00.25+00:00", -0.001],
            [DATABASE, pair[1], pair[2], INT_PAIR_KEY, "ShareLock", True, None, None],
        ],
        state="idle in transaction",
        outside_transaction=False,
    )  # fmt: skip
    # A pooler known by its addresses: every backend whose client comes from them is its.
    views = [
        PoolerView("pgbouncer", networks=(ip_network("10.0.0.0/24"),), pool_mode="transaction")
    ]
    backend = backend_from_row(row, _registry(), views, databases=APP)
    assert backend.awaited is not None
    assert backend.awaited.key == _key(75474063)
    assert (backend.awaited.key_name, backend.awaited.catalog) == ("sqitch", True)
    assert backend.awaited.wait_start == BACKEND_START + timedelta(seconds=0.25)
    assert backend.awaited.wait_seconds == 0.0  # began after the statement did
    [held] = backend.held
    assert held.key == AdvisoryKey(INT_PAIR_KEY, (3001, -7))
    assert (held.key_name, held.mode) == ("tenant_export", "share")
    assert backend.held_entries == 1
    # No collection saw it before: held at least since it went idle (collect/holds.py).
    assert (backend.held_seconds, backend.held_at_least) == (12.5, True)
    assert held.held_seconds == 12.5
    assert backend.awaited.held_seconds is None
    # Inside a transaction pg_locks cannot tell: not certainly session-level, not stranded.
    assert backend.session_level is False
    assert backend.pooled == PooledBackend("pgbouncer", "", "transaction")
    assert not backend.stranded
    assert (backend.state_word, backend.level) == ("idle_in_transaction", "session or transaction")
    idle = backend_from_row({**row, "state": "idle"}, _registry(), views, databases=APP)
    assert idle.session_level
    assert idle.stranded
    assert (
        backend_from_row(
            {**row, "client_addr": "10.0.1.7"}, _registry(), views, databases=APP
        ).pooled
        is None
    )


def test_caps_say_what_they_left_out() -> None:
    listed = tuple(_lock(i) for i in range(50))
    busy = forensic_backend(1, *listed, lock_entries=100_000)
    found = _read(busy, backends_total=700)
    assert found.backends_left_out == 699
    assert busy.held_entries == 100_000
    assert busy.held_left_out == 100_000 - 50
    page = page_json(found, 1.5)
    [holder] = page["holders"]
    assert len(holder["locks"]) == 50
    assert holder["locks_left_out"] == 99_950
    assert page["backends_left_out"] == 699
    assert "699 backends are left out" in page_html(found, 1.5)
    assert "99,950 more" in page_html(found, 1.5)


def test_the_page_says_states_and_ages_as_check_and_the_metrics_do() -> None:
    in_tx = forensic_backend(
        1, _lock(1), state="idle in transaction", state_seconds=3725.4, session_level=False
    )
    hidden = forensic_backend(2, _lock(2), state=None, state_seconds=None)  # outside: idle
    waiter = forensic_backend(3, _lock(1, waiting_since=25), state="active")
    found = _read(in_tx, hidden, waiter)
    text = page_html(found, 2.25)
    # A holder's state, for how long, and its locks' level, a line each in one cell.
    state = '<td><span class="line"><span class="state">{}</span></span><span class="line">'
    assert state.format("idle_in_transaction") + '<span class="note">for</span> 1h2m5s' in text
    assert state.format("idle") + '<span class="note">for</span> unknown' in text
    assert "<td>1m15s</td>" in text  # the wait
    assert "(2.2s ago)" in text
    page = page_json(found, 2.25)
    assert [h["state"] for h in page["holders"]] == ["idle_in_transaction", "idle"]
    assert page["holders"][0]["state_seconds"] == 3725.4  # numbers stay numbers


HOSTILE = "<script>alert(1)</script>"


def test_hostile_values_are_escaped_in_the_page_and_kept_in_json() -> None:
    holder = forensic_backend(1, _lock(1), application_name=HOSTILE, query=f"SELECT '{HOSTILE}'")
    waiter = forensic_backend(2, _lock(1, waiting_since=1), datname=HOSTILE, state="active")
    found = _read(holder, waiter, query_text=True)
    text = page_html(found, 0.0)
    assert "<script" not in text
    assert html.escape(HOSTILE) in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;&#x27;</code>" in text  # the query, too
    assert "pg_terminate_backend(1)" in text
    page = page_json(found, 0.0)
    assert json.loads(json.dumps(page))["holders"][0]["application_name"] == HOSTILE
    assert page["holders"][0]["query"] == f"SELECT '{HOSTILE}'"
    without = page_json(replace(found, query_text=False), 0.0)
    assert "query" not in without["holders"][0]
    assert "SELECT '" not in page_html(replace(found, query_text=False), 0.0)


def test_the_caller_is_shown_escaped_in_each_format_whatever_query_text_says() -> None:
    hostile = caller_of(f"SELECT 1 /*controller='{quote(HOSTILE)}',line='a%0Ab'*/")
    holder = forensic_backend(1, _lock(1), caller=hostile)
    waiter = forensic_backend(2, _lock(1, waiting_since=1), caller=caller_of(RAILS_TAGGED))
    found = _read(holder, waiter, query_text=False)
    text = page_html(found, 0.0)
    assert "<script" not in text
    assert f'<span class="note">caller</span> controller={html.escape(HOSTILE)}, line=a\\nb' in text
    assert '<span class="note">caller</span> application=Shop, action=create' in text
    [held] = page_json(found, 0.0)["holders"]
    assert held["caller"] == {
        "text": f"controller={HOSTILE}, line=a\\nb",
        "styles": ["sqlcommenter"],
        "tags": [["controller", HOSTILE], ["line", "a\\nb"]],
    }
    out = io.StringIO()
    print_forensics(found, out)
    lines = out.getvalue().splitlines()
    callers = lines.index("  Callers, from the annotations of their last statements")
    assert lines[callers + 2 : callers + 4] == [
        "    2    application=Shop, action=create",
        f"    1    controller={HOSTILE}, line=a\\nb",
    ]


RAILS_TAGGED = "/*application:Shop,action:create*/ SELECT pg_advisory_lock(1)"


def test_concurrent_requests_share_one_read_and_later_ones_reuse_it() -> None:
    clock = Clock()
    reads: list[float] = []
    started, release = threading.Event(), threading.Event()

    def read() -> Forensics:
        reads.append(clock())
        started.set()
        release.wait(5)
        return _read()

    answers = OnDemand(read, reuse_for=0.3, wait_at_most=5, clock=clock)
    results: list[tuple[Any, float]] = []
    first = threading.Thread(target=lambda: results.append(answers.get()))
    first.start()
    assert started.wait(5)  # the first request reads; the others join it
    others = [threading.Thread(target=lambda: results.append(answers.get())) for _ in range(4)]
    for thread in others:
        thread.start()
    clock.now += 0.2  # the read takes its time
    release.set()
    for thread in (first, *others):
        thread.join()
    assert len(reads) == 1
    assert len({id(answer) for answer, _ in results}) == 1
    clock.now += 0.1
    answer, age = answers.get()
    assert answer is results[0][0]
    # Its age counts from the end of the read: from its start it would be 0.3, not 0.1.
    assert age == pytest.approx(0.1)
    clock.now += 0.2  # reuse_for has passed since the read ended
    assert answers.get()[0] is not answer
    assert len(reads) == 2


def test_a_failed_read_is_an_answer_and_a_bug_does_not_escape() -> None:
    def down() -> Forensics:
        raise Unanswered("connection refused")

    answer, _ = OnDemand(down, reuse_for=1, wait_at_most=1).get()
    assert (answer.forensics, answer.error) == (None, "connection refused")

    def bug() -> Forensics:
        raise KeyError("oops")

    answer, _ = OnDemand(bug, reuse_for=1, wait_at_most=1).get()
    assert answer.error == "internal error, see the exporter's log"


def test_an_answer_is_rendered_once_per_format_for_every_request() -> None:
    found = _read(forensic_backend(1, _lock(1)), forensic_backend(2, _lock(1, waiting_since=1)))
    answer = Answer(found, None, 0.0)
    renders: list[bool] = []

    def page(as_json: bool) -> Page:
        def make(made: Answer) -> Page:
            renders.append(as_json)
            time.sleep(0.05)  # the others ask meanwhile
            return render("main", made, as_json)

        return answer.made(("page", as_json), make)

    threads = [threading.Thread(target=page, args=(n % 2 == 0,)) for n in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(renders) == [False, True]
    # Each request's body is the shared bytes around its own age: nothing copied per request.
    first, second = page(True).body(1.25), page(True).body(3.5)
    assert (first[0] is second[0], first[-1] is second[-1]) == (True, True)
    assert json.loads(b"".join(second))["age_seconds"] == 3.5
    text = b"".join(page(False).body(3.5)).decode()
    assert "(3.5s ago)" in text
    assert "\0" not in text


def test_json_is_compact() -> None:
    found = _read(forensic_backend(1, _lock(1)), forensic_backend(2, _lock(1, waiting_since=1)))
    text = b"".join(render("main", Answer(found, None, 0.0), as_json=True).body(0.5)).decode()
    document = json.loads(text)
    assert document == {
        "target": "main",
        "age_seconds": 0.5,
        **forensics_json(found),
        "risky_statements": None,  # none read
    }
    assert text == json.dumps(document, separators=(",", ":"))  # no indent, no spaces


def test_an_error_is_rendered_without_an_age() -> None:
    answer = Answer(None, "connection refused", 0.0)
    page = render("main", answer, as_json=True)
    assert page.status.startswith("503")
    assert json.loads(b"".join(page.body(2.0))) == {"target": "main", "error": "connection refused"}
    text = b"".join(render("main", answer, as_json=False).body(2.0)).decode()
    assert "Cannot read the server: connection refused" in text


def _forest(nodes: Sequence[Any]) -> list[Any]:
    return [(n.pid, n.repeat, _forest(n.waiters)) for n in nodes]


def test_chains_nest_each_waiter_under_its_blockers_and_show_a_cycle_once() -> None:
    # 1 holds 10; 2 holds 20 and waits for 10; 3 waits for 20; 4 and 5 wait for each other
    # (a deadlock the server has not broken yet), 6 waits for 5.
    head = forensic_backend(1, _lock(10))
    middle = forensic_backend(2, _lock(20), _lock(10, waiting_since=1), state="active")
    tail = forensic_backend(3, _lock(20, waiting_since=2), state="active")
    one = forensic_backend(4, _lock(40), _lock(50, waiting_since=3), state="active")
    other = forensic_backend(5, _lock(50), _lock(40, waiting_since=4), state="active")
    late = forensic_backend(6, _lock(50, waiting_since=5), state="active")
    found = _read(head, middle, tail, one, other, late)
    assert _forest(blocking_chains(found.waiters)) == [
        (1, None, [(2, None, [(3, None, [])])]),
        (4, None, [(5, None, [(4, "cycle", []), (6, None, [])])]),
    ]
    page = page_json(found, 0.0)
    [first, second] = page["blocking_chains"]
    assert (first["pid"], first["awaits"]) == (1, None)
    assert first["waiters"][0]["awaits"]["key"] == "10"
    assert second["waiters"][0]["waiters"][0]["repeat"] == "cycle"
    assert "a deadlock" in page_html(found, 0.0)


def test_a_waiter_under_two_blockers_is_shown_in_full_once() -> None:
    readers = [forensic_backend(pid, _lock(7, "share")) for pid in (1, 2)]
    writer = forensic_backend(3, _lock(7, waiting_since=5), state="active")
    reader = forensic_backend(4, _lock(7, "share", waiting_since=20), state="active")
    chains = blocking_chains(_read(*readers, writer, reader).waiters)
    assert _forest(chains) == [
        (1, None, [(3, None, [(4, None, [])])]),
        (2, None, [(3, "seen", [])]),
    ]
    assert chains[0].waiters[0].waiters[0].queued  # behind the writer, not a holder


def test_a_chain_deeper_than_the_page_nests_goes_on_at_a_root_of_its_own() -> None:
    # Backend i holds key i and waits for key i - 1: a chain of 100 under backend 0.
    chain = [forensic_backend(0, _lock(0))] + [
        forensic_backend(i, _lock(i), _lock(i - 1, waiting_since=i / 10), state="active")
        for i in range(1, 100)
    ]
    found = _read(*chain)
    roots = blocking_chains(found.waiters)
    assert [root.pid for root in roots] == list(range(0, 100, CHAIN_DEPTH))

    def full(node: Any) -> list[int]:
        here = [node.pid] if node.repeat is None else []
        return here + [pid for child in node.waiters for pid in full(child)]

    assert sorted(pid for root in roots for pid in full(root)) == list(range(100))
    assert len(page_json(found, 0.0)["blocking_chains"]) == len(roots)
    assert "(its waiters: below, from here on)" in page_html(found, 0.0)


def test_names_as_the_series_give_them_leaks_marked_and_ending_offered_to_holders() -> None:
    leaked = forensic_backend(
        1, _lock(1), state_seconds=16 * 60.0, rewritten_name="billing-worker-*",
        application_name="billing-worker-7d9f",
    )  # fmt: skip
    fresh = forensic_backend(2, _lock(2), state_seconds=60.0)
    migration = replace(_lock(3), key_name="rails_migration", long_lived=True)
    migrating = forensic_backend(3, migration, state_seconds=16 * 60.0)
    busy = forensic_backend(4, _lock(4), state="active", state_seconds=16 * 60.0)
    waiter = forensic_backend(5, _lock(1, waiting_since=10.0), state="active")
    found = _read(leaked, fresh, migrating, busy, waiter)
    page = page_json(found, 1.0)
    holders = {h["pid"]: h for h in page["holders"]}
    assert (holders[1]["application_name"], holders[1]["application_name_raw"]) == (
        "billing-worker-*",
        "billing-worker-7d9f",
    )
    assert holders[2]["application_name"] == holders[2]["application_name_raw"]
    # Idle past the leak alert's default threshold, with a lock no long-lived key names.
    assert {pid: h["leak_suspect"] for pid, h in holders.items()} == {
        1: True, 2: False, 3: False, 4: False,
    }  # fmt: skip
    [waiting] = page["waiters"]
    assert waiting["terminate"] is None  # ending it would release nothing
    assert holders[1]["terminate"] == "SELECT pg_terminate_backend(1)"
    html = page_html(found, 1.0)
    assert html.count("likely leaked: idle over 15m") == 1
    assert '<span class="note">as set</span> billing-worker-7d9f' in html
    waiters_table = html.split("<h2>Waiters", 1)[1].split("<h2>", 1)[0]
    assert "pg_terminate_backend" not in waiters_table
    assert "To end it" not in waiters_table
    holders_table = html.split("<h2>Holders", 1)[1].split("<h2>", 1)[0]
    assert holders_table.count("pg_terminate_backend") == 4


def test_an_application_idle_by_design_is_no_likely_leak_while_idle_only() -> None:
    """Idle past the leak threshold, a holder its entry idle by design names is judged by that
    entry's max_hold, not marked as leaked; idle inside a transaction it still is."""
    queue = replace(
        forensic_backend(1, _lock(1), state_seconds=16 * 60.0), idle_by_design="que_locker"
    )
    stuck = replace(queue, pid=2, locks=(_lock(2),), state="idle in transaction")
    page = page_json(_read(queue, stuck), 1.0)
    holders = {h["pid"]: (h["idle_by_design"], h["leak_suspect"]) for h in page["holders"]}
    assert holders == {1: ("que_locker", False), 2: ("que_locker", True)}
    html = page_html(_read(queue, stuck), 1.0)
    assert html.count('<span class="note">idle by design</span> que_locker') == 1
    assert html.count("likely leaked") == 1
