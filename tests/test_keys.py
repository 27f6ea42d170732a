"""Decoding advisory lock keys from the pg_locks columns, for every key value."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pg_advisory_exporter.keys.key import BIGINT_KEY, INT_PAIR_KEY, AdvisoryKey

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
INT32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)


def _packed(classid: int, objid: int) -> int:
    """What `(classid::bigint << 32) | objid::bigint` yields in PostgreSQL: a signed bigint."""
    value = (classid << 32) | objid
    return value - 2**64 if value >= 2**63 else value


@given(INT64)
def test_bigint_key_round_trips(key: int) -> None:
    # pg_locks splits a bigint key into two unsigned oids: high and low 32 bits.
    classid, objid = (key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF
    decoded = AdvisoryKey.from_packed(_packed(classid, objid), BIGINT_KEY)
    assert decoded.parts == (key,)
    assert str(decoded) == str(key)


@given(INT32, INT32)
def test_int_pair_key_round_trips(first: int, second: int) -> None:
    classid, objid = first & 0xFFFFFFFF, second & 0xFFFFFFFF
    decoded = AdvisoryKey.from_packed(_packed(classid, objid), INT_PAIR_KEY)
    assert decoded.parts == (first, second)
    assert str(decoded) == f"({first}, {second})"


def test_the_two_key_spaces_stay_apart() -> None:
    assert AdvisoryKey.from_packed(1, BIGINT_KEY) != AdvisoryKey.from_packed(1, INT_PAIR_KEY)
    assert str(AdvisoryKey.from_packed(1, INT_PAIR_KEY)) == "(0, 1)"
