"""Advisory lock keys as pg_locks shows them, turned back into what the application passed."""

from __future__ import annotations

from dataclasses import dataclass

BIGINT_KEY = 1  # pg_locks.objsubid of a lock taken with one bigint key
INT_PAIR_KEY = 2  # ... and of one taken with two int4 keys

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1  # an int4 key part's range
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # a bigint key's range

# pg_locks shows a key in two oid columns, classid and objid, unsigned 32-bit: a bigint key's
# high and low 32 bits, or an int pair's two ints. A negative key is only its bits there, and
# comes back through the signed reading below. Every conversion between the two is here.


def unsigned(value: int, bits: int) -> int:
    """The low `bits` bits of `value`, unsigned: an oid column's value for 32."""
    return value & ((1 << bits) - 1)


def signed(value: int, bits: int) -> int:
    """The low `bits` bits of `value` read as two's complement: an int4 for 32, a bigint
    for 64."""
    value = unsigned(value, bits)
    return value - (1 << bits) if value >> (bits - 1) else value


def oid(part: int) -> int:
    """An int4 key part as the oid column shows it."""
    return unsigned(part, 32)


def int4(column: int) -> int:
    """The int4 key part an oid column holds."""
    return signed(column, 32)


def oids_of_bigint(key: int) -> tuple[int, int]:
    """The (classid, objid) of a bigint key: its high and low 32 bits."""
    return oid(key >> 32), oid(key)


def bigint_of_oids(classid: int, objid: int) -> int:
    """The bigint key of (classid, objid); for any key form, what the collection statement's
    `(classid::bigint << 32) | objid::bigint` makes of the two columns."""
    return signed(classid << 32 | objid, 64)


def oids_of_pair(first: int, second: int) -> tuple[int, int]:
    """The (classid, objid) of an int pair key: each int's bits."""
    return oid(first), oid(second)


def pair_of_oids(classid: int, objid: int) -> tuple[int, int]:
    """The int pair key of (classid, objid)."""
    return int4(classid), int4(objid)


@dataclass(frozen=True, order=True)
class AdvisoryKey:
    """One advisory lock key: `(value,)` for a bigint key, `(first, second)` for an int pair."""

    objsubid: int
    parts: tuple[int, ...]

    @classmethod
    def from_oids(cls, classid: int, objid: int, objsubid: int) -> AdvisoryKey:
        """The key of a lock from pg_locks' classid, objid and objsubid columns."""
        if objsubid == BIGINT_KEY:
            return cls(objsubid, (bigint_of_oids(classid, objid),))
        if objsubid == INT_PAIR_KEY:
            return cls(objsubid, pair_of_oids(classid, objid))
        raise ValueError(f"objsubid {objsubid} is not an advisory lock key form")

    def __str__(self) -> str:
        if self.objsubid == BIGINT_KEY:
            return str(self.parts[0])
        return f"({self.parts[0]}, {self.parts[1]})"
