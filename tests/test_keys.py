"""Advisory lock keys and the pg_locks columns that show them, both ways, for every key value:
the edges pinned, the rest round-tripped, and the server's own columns agreeing."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from devtools.embedded_postgres import EmbeddedPostgres
from pg_advisory_exporter.keys.key import (
    BIGINT_KEY,
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    INT_PAIR_KEY,
    AdvisoryKey,
    bigint_of_oids,
    oids_of_bigint,
    oids_of_pair,
    pair_of_oids,
    signed,
    unsigned,
)

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
INT32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)
OID = st.integers(min_value=0, max_value=2**32 - 1)

# A bigint key and the (classid, objid) pg_locks shows it with.
BIGINT_EDGES = [
    (0, (0, 0)),
    (1, (0, 1)),
    (-1, (0xFFFFFFFF, 0xFFFFFFFF)),
    (-(2**63), (0x80000000, 0)),
    (2**63 - 1, (0x7FFFFFFF, 0xFFFFFFFF)),
    (2**31, (0, 0x80000000)),
    (2**32, (1, 0)),
    (-(2**32), (0xFFFFFFFF, 0)),
    (-(2**31), (0xFFFFFFFF, 0x80000000)),
]
# An int pair key and its (classid, objid).
PAIR_EDGES = [
    ((0, 0), (0, 0)),
    ((-1, -1), (0xFFFFFFFF, 0xFFFFFFFF)),
    ((-(2**31), 2**31 - 1), (0x80000000, 0x7FFFFFFF)),
    ((2**31 - 1, -(2**31)), (0x7FFFFFFF, 0x80000000)),
    ((1, -1), (1, 0xFFFFFFFF)),
]


def test_the_ranges() -> None:
    assert (INT32_MIN, INT32_MAX) == (-2_147_483_648, 2_147_483_647)
    assert (INT64_MIN, INT64_MAX) == (-9_223_372_036_854_775_808, 9_223_372_036_854_775_807)


def test_signed_and_unsigned_readings_at_the_edges() -> None:
    assert [signed(v, 32) for v in (0, 2**31 - 1, 2**31, 2**32 - 1)] == [0, 2**31 - 1, -(2**31), -1]
    assert [signed(v, 64) for v in (2**63 - 1, 2**63, 2**64 - 1)] == [2**63 - 1, -(2**63), -1]
    assert [unsigned(v, 32) for v in (-1, -(2**31), 2**32, 2**32 + 5)] == [2**32 - 1, 2**31, 0, 5]
    assert unsigned(-1, 64) == 2**64 - 1


@pytest.mark.parametrize(("key", "oids"), BIGINT_EDGES)
def test_bigint_keys_at_the_edges(key: int, oids: tuple[int, int]) -> None:
    assert oids_of_bigint(key) == oids
    assert bigint_of_oids(*oids) == key
    assert AdvisoryKey.from_oids(*oids, BIGINT_KEY).parts == (key,)


@pytest.mark.parametrize(("pair", "oids"), PAIR_EDGES)
def test_int_pair_keys_at_the_edges(pair: tuple[int, int], oids: tuple[int, int]) -> None:
    assert oids_of_pair(*pair) == oids
    assert pair_of_oids(*oids) == pair
    assert AdvisoryKey.from_oids(*oids, INT_PAIR_KEY).parts == pair


@given(INT64)
def test_bigint_key_round_trips(key: int) -> None:
    classid, objid = oids_of_bigint(key)
    assert 0 <= classid < 2**32
    assert 0 <= objid < 2**32
    decoded = AdvisoryKey.from_oids(classid, objid, BIGINT_KEY)
    assert decoded.parts == (key,)
    assert str(decoded) == str(key)


@given(INT32, INT32)
def test_int_pair_key_round_trips(first: int, second: int) -> None:
    classid, objid = oids_of_pair(first, second)
    decoded = AdvisoryKey.from_oids(classid, objid, INT_PAIR_KEY)
    assert decoded.parts == (first, second)
    assert str(decoded) == f"({first}, {second})"


@given(OID, OID)
def test_the_statements_packing_is_the_bigint_of_the_columns(classid: int, objid: int) -> None:
    # What PostgreSQL's `(classid::bigint << 32) | objid::bigint` yields: a wrapping int8.
    value = (classid << 32) | objid
    assert bigint_of_oids(classid, objid) == (value - 2**64 if value >= 2**63 else value)
    assert oids_of_bigint(bigint_of_oids(classid, objid)) == (classid, objid)


def test_the_two_key_spaces_stay_apart() -> None:
    assert AdvisoryKey.from_oids(0, 1, BIGINT_KEY) != AdvisoryKey.from_oids(0, 1, INT_PAIR_KEY)
    assert str(AdvisoryKey.from_oids(0, 1, INT_PAIR_KEY)) == "(0, 1)"
    with pytest.raises(ValueError, match="objsubid 3"):
        AdvisoryKey.from_oids(0, 1, 3)


def test_pg_locks_shows_keys_as_the_conversions_say(pg: EmbeddedPostgres) -> None:
    with pg.connect() as conn:
        for key, _ in BIGINT_EDGES:
            conn.execute("SELECT pg_advisory_lock(%s::bigint)", (key,))
        for (first, second), _ in PAIR_EDGES:
            conn.execute("SELECT pg_advisory_lock(%s::int, %s::int)", (first, second))
        rows = conn.execute(
            "SELECT objsubid, classid::bigint, objid::bigint,"
            " (classid::bigint << 32) | objid::bigint"
            " FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
        ).fetchall()
    seen = {(objsubid, classid, objid): packed for objsubid, classid, objid, packed in rows}
    expected = {(BIGINT_KEY, *oids): key for key, oids in BIGINT_EDGES}
    expected |= {(INT_PAIR_KEY, *oids): bigint_of_oids(*oids) for _, oids in PAIR_EDGES}
    assert seen == expected
