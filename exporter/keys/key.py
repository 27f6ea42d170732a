"""Advisory lock keys as pg_locks shows them, turned back into what the application passed."""

from __future__ import annotations

from dataclasses import dataclass

BIGINT_KEY = 1  # pg_locks.objsubid of a lock taken with one bigint key
INT_PAIR_KEY = 2  # ... and of one taken with two int4 keys


def _signed(value: int, bits: int) -> int:
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >= 1 << (bits - 1) else value


@dataclass(frozen=True, order=True)
class AdvisoryKey:
    """One advisory lock key: `(value,)` for a bigint key, `(first, second)` for an int pair."""

    objsubid: int
    parts: tuple[int, ...]

    @classmethod
    def from_packed(cls, packed: int, objsubid: int) -> AdvisoryKey:
        """Decode `(classid::bigint << 32) | objid::bigint`, the form the collection reads.

        classid and objid are unsigned oid columns holding the key's high and low 32 bits,
        so a negative key only comes back through the signed reinterpretation here.
        """
        if objsubid == BIGINT_KEY:
            return cls(objsubid, (_signed(packed, 64),))
        if objsubid == INT_PAIR_KEY:
            return cls(objsubid, (_signed(packed >> 32, 32), _signed(packed, 32)))
        raise ValueError(f"objsubid {objsubid} is not an advisory lock key form")

    def __str__(self) -> str:
        if self.objsubid == BIGINT_KEY:
            return str(self.parts[0])
        return f"({self.parts[0]}, {self.parts[1]})"
