"""Names that DistributedLock.Postgres packs into its keys, read back (keys/packed_names.py).

The .NET library does not run here (no .NET runtime in the test command's packages): its
encoder is written below as its source does it (PostgresAdvisoryLockKey.TryEncodeAscii and
SplitKeys, DistributedLock 2.x), and the exporter's decoder reads back what it makes."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pg_advisory_exporter.keys.key import BIGINT_KEY, INT_PAIR_KEY, AdvisoryKey
from pg_advisory_exporter.keys.packed_names import NAME_CHARACTERS, distributed_lock_name


def _distributed_lock_key(name: str) -> AdvisoryKey:
    """PostgresAdvisoryLockKey(name): 7 bits a character, a 0, 7-bit groups of 1s to 64
    bits; taken as the pair of its high and low 32 bits, each a signed int."""
    result = 0
    for char in name:
        assert ord(char) < 128
        result = (result << 7) | ord(char)
    result <<= 1
    for _ in range(len(name), 9):
        result = (result << 7) | 127
    high, low = result >> 32, result & 0xFFFFFFFF
    return AdvisoryKey(INT_PAIR_KEY, (_signed(high), _signed(low)))


def _signed(value: int) -> int:
    return value - (1 << 32) if value >= 1 << 31 else value


@pytest.mark.parametrize("name", ["a", "nightly", "reindex", "leader-01", "job:42", "x/y.z_"])
def test_a_packed_name_reads_back(name: str) -> None:
    key = _distributed_lock_key(name)
    assert distributed_lock_name(key) == name


@given(st.text(alphabet=sorted(NAME_CHARACTERS), min_size=1, max_size=9))
def test_every_name_of_up_to_nine_characters_reads_back(name: str) -> None:
    assert distributed_lock_name(_distributed_lock_key(name)) == name


def test_what_is_not_a_packed_name_reads_as_none() -> None:
    # A bigint key is not the pair DistributedLock takes; a name with a character names are
    # not written with (a space, a control character) is not shown.
    assert distributed_lock_name(AdvisoryKey(BIGINT_KEY, (12345,))) is None
    assert distributed_lock_name(_distributed_lock_key("two words")) is None
    assert distributed_lock_name(_distributed_lock_key("bell\a")) is None
    assert distributed_lock_name(_distributed_lock_key("")) is None
    # Pairs of hashes, as namespaces and libraries make them: one in a thousand or fewer may
    # read as a name, none of these do.
    pairs = [
        AdvisoryKey(
            INT_PAIR_KEY,
            tuple(
                int.from_bytes(
                    hashlib.sha256(f"{i}".encode()).digest()[j : j + 4], "big", signed=True
                )
                for j in (0, 4)
            ),
        )
        for i in range(2000)
    ]
    named = [key for key in pairs if distributed_lock_name(key) is not None]
    assert len(named) <= 4, named
