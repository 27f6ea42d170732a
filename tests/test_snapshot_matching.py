"""Key matching in the collection statement, against a real server: every registry shape
(bigint keys, int pairs, namespaces, a catalog-sized mix), keys at the edges of their types,
locks that share some but not all of a registered key's columns, several holders, reentrant,
shared and awaited locks, and a lock in another database. Each registry's result is checked
twice: against the expectations written here, and against pg_locks read row by row and
matched in Python."""

from __future__ import annotations

import re
import threading
from collections import Counter
from collections.abc import Iterator, Sequence

import pytest
from support import Connection, Session, md5_key, wait_until

from devtools.embedded_postgres import EmbeddedPostgres
from pg_advisory_exporter.collect.snapshot import ServerSnapshot, collect_sql, read_snapshot
from pg_advisory_exporter.keys.key_config import KeyConfig
from pg_advisory_exporter.keys.registry import Registry

# Keys at the edges: the high bit of objid set (classid 1, objid 0x80000001), negative keys
# (classid and objid 0xffff...), the extremes of bigint and int4.
HIGH_OBJID = (1 << 32) | 0x80000001
NEGATIVE = -42
SMALLEST = -(2**63)
LARGEST = 2**63 - 1
SMALL = 5
# Locks that share columns with a registered key and must not match it: the objid of SMALL
# under another classid; a pair whose second int is SMALL; a bigint key whose high half is
# a namespace's first int.
SAME_OBJID = (1 << 32) | SMALL
SPACE = 2001
NEGATIVE_SPACE = -9
BIGINT_IN_SPACE = (SPACE << 32) | 7

# Catalog-like keys: 30 bigint keys that look like hashes, as the built-in catalog computes
# them (most idle, two held).
CATALOG = [KeyConfig(name=f"catalog_{i}", key=md5_key(f"catalog {i}")) for i in range(30)]
USER = [
    KeyConfig(name="high_objid", key=HIGH_OBJID),
    KeyConfig(name="negative", key=NEGATIVE),
    KeyConfig(name="smallest", key=SMALLEST),
    KeyConfig(name="largest", key=LARGEST),
    KeyConfig(name="small", key=SMALL),
    KeyConfig(name="shared", key=7310001),
    KeyConfig(name="pair_negative", pair=(-5, 3)),
    KeyConfig(name="pair_mixed", pair=(7, -8)),
    KeyConfig(name="pair_extremes", pair=(-(2**31), 2**31 - 1)),
    KeyConfig(name="space", namespace=SPACE),
    KeyConfig(name="negative_space", namespace=NEGATIVE_SPACE),
    KeyConfig(name="never_held", key=123456789),
]
MIXED = CATALOG[:15] + USER + CATALOG[15:]  # 42 keys, the forms interleaved
SHAPES = {
    "mixed": MIXED,
    "bigint keys only": [c for c in MIXED if c.key is not None],
    "int pairs only": [c for c in MIXED if c.pair is not None],
    "namespaces only": [c for c in MIXED if c.namespace is not None],
    "pairs and namespaces": [c for c in MIXED if c.key is None],
    "one key": [USER[1]],
    "one key and its look-alikes": [USER[4]],  # SMALL: b's only screened row is (9, SMALL)
}

Uses = dict[str, tuple[int, bool]]  # key name: (entries held, awaited)


def resolve(configs: Sequence[KeyConfig]) -> Registry:
    return Registry.resolve(configs, lambda texts, seeds: [])


def uses_of(snapshot: ServerSnapshot, registry: Registry, pid: int) -> Uses:
    backends = [b for b in snapshot.backends if b.pid == pid]
    if not backends:
        return {}
    (backend,) = backends
    found = {registry.keys[u.key_index].name: (u.held, u.awaited) for u in backend.registered}
    assert len(found) == len(backend.registered), "a key is reported twice"
    return found


def matched_in_python(conn: Connection, registry: Registry, pids: Sequence[int]) -> dict[int, Uses]:
    """The oracle: every advisory row of these backends, matched to the registry here."""
    rows = conn.execute(
        "SELECT pid, objsubid, classid::bigint, objid::bigint, granted FROM pg_locks"
        " WHERE locktype = 'advisory' AND pid = ANY(%s)",
        (list(pids),),
    ).fetchall()
    entries: Counter[tuple[int, str]] = Counter()
    awaited: set[tuple[int, str]] = set()
    for pid, objsubid, classid, objid, granted in rows:
        for key in registry.keys:
            if (key.objsubid, key.classid) == (objsubid, classid) and key.objid in (None, objid):
                entries[pid, key.name] += 1
                if not granted:
                    awaited.add((pid, key.name))
    result: dict[int, Uses] = {pid: {} for pid in pids}
    for (pid, name), count in entries.items():
        waits = (pid, name) in awaited
        result[pid][name] = (count - waits, waits)
    return result


@pytest.fixture
def scenario(session: Session) -> Iterator[dict[str, Connection]]:
    """Sessions holding, sharing and awaiting registered and look-alike keys."""
    a = session("matching-a")
    for statement in (
        f"SELECT pg_advisory_lock({HIGH_OBJID})",
        f"SELECT pg_advisory_lock({NEGATIVE})",
        f"SELECT pg_advisory_lock({NEGATIVE})",  # reentrant: still one entry
        f"SELECT pg_advisory_lock({SMALLEST})",
        f"SELECT pg_advisory_lock({LARGEST})",
        f"SELECT pg_advisory_lock_shared({LARGEST})",  # the same key in a second mode
        f"SELECT pg_advisory_lock({SMALL})",
        "SELECT pg_advisory_lock_shared(7310001)",
        f"SELECT pg_advisory_lock({CATALOG[3].key})",
        f"SELECT pg_advisory_lock({SAME_OBJID})",
        f"SELECT pg_advisory_lock({BIGINT_IN_SPACE})",
        f"SELECT pg_advisory_lock({SMALL + 1})",
    ):
        a.execute(statement)
    b = session("matching-b")
    for statement in (
        "SELECT pg_advisory_lock(-5, 3)",
        "SELECT pg_advisory_lock(7, -8)",
        f"SELECT pg_advisory_lock({-(2**31)}, {2**31 - 1})",
        f"SELECT pg_advisory_lock({SPACE}, k) FROM generate_series(1, 300) AS k",
        f"SELECT pg_advisory_lock_shared({NEGATIVE_SPACE}, -1)",
        f"SELECT pg_advisory_lock({NEGATIVE_SPACE}, 2)",
        f"SELECT pg_advisory_lock(9, {SMALL})",  # objid of SMALL, but a pair
        "SELECT pg_advisory_lock(-5, 4)",  # first int of a registered pair, not a namespace
    ):
        b.execute(statement)
    c = session("matching-c")
    c.execute("SELECT pg_advisory_lock_shared(7310001)")
    c.execute(f"SELECT pg_advisory_lock_shared({NEGATIVE_SPACE}, -1)")
    elsewhere = session("matching-elsewhere", dbname="billing")
    elsewhere.execute(f"SELECT pg_advisory_lock({CATALOG[20].key})")
    elsewhere.execute(f"SELECT pg_advisory_lock({SPACE}, 1)")  # the namespace, another database
    waiter = session("matching-waiter")
    waiter.execute("SELECT pg_advisory_lock_shared(7310001)")  # then awaits it exclusively
    waiting = threading.Thread(target=waiter.execute, args=("SELECT pg_advisory_lock(7310001)",))
    waiting.start()
    space_waiter = session("matching-space-waiter")
    space_waiter.execute(f"SELECT pg_advisory_lock({SPACE}, 1000)")  # then awaits one of b's
    waiting_in_space = threading.Thread(
        target=space_waiter.execute, args=(f"SELECT pg_advisory_lock({SPACE}, 5)",)
    )
    waiting_in_space.start()
    try:
        yield {
            "a": a,
            "b": b,
            "c": c,
            "elsewhere": elsewhere,
            "waiter": waiter,
            "space_waiter": space_waiter,
        }
    finally:
        a.execute("SELECT pg_advisory_unlock_shared(7310001)")
        c.execute("SELECT pg_advisory_unlock_shared(7310001)")
        b.execute(f"SELECT pg_advisory_unlock({SPACE}, 5)")
        waiting.join(timeout=10)
        waiting_in_space.join(timeout=10)
        waiter.execute("SELECT pg_advisory_unlock_all()")
        space_waiter.execute("SELECT pg_advisory_unlock_all()")


# What each session holds or awaits of the mixed registry; each shape sees its own part.
EXPECTED: dict[str, Uses] = {
    "a": {
        "high_objid": (1, False),
        "negative": (1, False),
        "smallest": (1, False),
        "largest": (2, False),
        "small": (1, False),
        "shared": (1, False),
        "catalog_3": (1, False),
    },
    "b": {
        "pair_negative": (1, False),
        "pair_mixed": (1, False),
        "pair_extremes": (1, False),
        "space": (300, False),
        "negative_space": (2, False),
    },
    "c": {"shared": (1, False), "negative_space": (1, False)},
    "elsewhere": {"catalog_20": (1, False), "space": (1, False)},
    "waiter": {"shared": (1, True)},
    "space_waiter": {"space": (1, True)},
}


def _waiting(conn: Connection, pid: int) -> bool:
    row = conn.execute(
        "SELECT count(*) FROM pg_locks WHERE pid = %s AND NOT granted", (pid,)
    ).fetchone()
    return row is not None and row[0] == 1


@pytest.mark.parametrize("shape", SHAPES)
def test_each_registry_shape_matches_what_pg_locks_shows(
    pg: EmbeddedPostgres, scenario: dict[str, Connection], shape: str
) -> None:
    registry = resolve(SHAPES[shape])
    names = {key.name for key in registry.keys}
    pids = {name: conn.info.backend_pid for name, conn in scenario.items()}
    with pg.connect(application_name="matching-monitor") as conn:
        waiters = [pids["waiter"], pids["space_waiter"]]
        wait_until(lambda: all(_waiting(conn, pid) for pid in waiters), 10, "the waits")
        snapshot = read_snapshot(conn, registry)
        oracle = matched_in_python(conn, registry, list(pids.values()))
    for session_name, pid in pids.items():
        found = uses_of(snapshot, registry, pid)
        expected = {k: v for k, v in EXPECTED[session_name].items() if k in names}
        assert found == expected, session_name
        assert found == oracle[pid], session_name


def test_look_alikes_are_counted_but_not_named(
    pg: EmbeddedPostgres, scenario: dict[str, Connection]
) -> None:
    """SAME_OBJID, BIGINT_IN_SPACE and SMALL + 1 are held but registered under no name."""
    with pg.connect(application_name="matching-monitor") as conn:
        snapshot = read_snapshot(conn, resolve(MIXED))
        idle = read_snapshot(conn, resolve([USER[-1]]))  # a key nobody holds
    backend = next(b for b in snapshot.backends if b.pid == scenario["a"].info.backend_pid)
    assert backend.advisory_entries == 11
    assert sum(use.held for use in backend.registered) == 8
    assert idle.backends
    assert all(b.registered == () for b in idle.backends)


def test_prepared_statement_gives_the_same_result(
    pg: EmbeddedPostgres, scenario: dict[str, Connection]
) -> None:
    """psycopg prepares a statement from its 6th run: the constants keep the plan's matching."""
    registry = resolve(MIXED)
    with pg.connect(application_name="matching-monitor") as conn:
        wait_until(lambda: _waiting(conn, scenario["waiter"].info.backend_pid), 10, "the wait")
        results = [read_snapshot(conn, registry) for _ in range(8)]
    for name in ("b", "waiter"):
        pid = scenario[name].info.backend_pid
        assert all(uses_of(r, registry, pid) == EXPECTED[name] for r in results)


def test_a_registry_of_hundreds_of_catalog_keys(session: Session, pg: EmbeddedPostgres) -> None:
    """The catalog's per-database keys for a server of a hundred databases."""
    many = [KeyConfig(name=f"db_{i}", key=md5_key(f"database {i}")) for i in range(600)]
    registry = resolve([*many, USER[9]])
    holder = session("matching-many")
    holder.execute(f"SELECT pg_advisory_lock({many[599].key})")
    holder.execute(f"SELECT pg_advisory_lock({many[0].key})")
    holder.execute(f"SELECT pg_advisory_lock({SPACE}, 77)")
    with pg.connect(application_name="matching-monitor") as conn:
        snapshot = read_snapshot(conn, registry)
    assert uses_of(snapshot, registry, holder.info.backend_pid) == {
        "db_0": (1, False),
        "db_599": (1, False),
        "space": (1, False),
    }


def test_statement_text() -> None:
    """No registry: no matching at all; a registry: its keys as constants, nothing bound but
    the databases whose deadlocks are read; what a newer server has, read from its version
    on (collect/reads.py)."""
    assert "key_codes" not in collect_sql(150000)
    sql = collect_sql(150000, resolve(MIXED))
    assert str(LARGEST) in sql
    assert str(SMALLEST) in sql
    assert re.findall("%.{0,12}", sql) == ["%(databases)s"]
    assert collect_sql(150000, resolve(MIXED)) is sql  # cached
    assert "pg_stat_get_lock" not in sql
    assert "pg_stat_get_lock" in collect_sql(190000, resolve(MIXED))
    assert "pg_stat_get_lock" in collect_sql(200000)


def test_packed_keys_are_signed_like_the_statement_packs_them() -> None:
    arrays = resolve(MIXED).sql_parameters()
    assert {HIGH_OBJID, NEGATIVE, SMALLEST, LARGEST, SMALL} <= set(arrays["bigint_key"])
    # (first << 32) | (second & 0xffffffff), as a signed bigint
    assert ((-5 << 32) | 3) in arrays["pair_key"]
    assert ((7 << 32) | (-8 & 0xFFFFFFFF)) in arrays["pair_key"]
    assert ((-(2**31) << 32) | (2**31 - 1)) in arrays["pair_key"]
    assert arrays["namespace_classid"] == [SPACE, NEGATIVE_SPACE & 0xFFFFFFFF]
    registry = resolve(MIXED)
    for index, packed in zip(arrays["bigint_index"], arrays["bigint_key"], strict=True):
        assert registry.keys[index].config.key == packed
