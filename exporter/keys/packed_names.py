"""Names that a library packs into the key itself, read back without any registry entry.

DistributedLock.Postgres (.NET, PostgresAdvisoryLockKey) packs a name of up to 9 ASCII
characters into 64 bits, 7 bits a character from the top, then one 0 bit, then a 7-bit
group of 1s for each character short of 9, and takes it as an (int, int) pair: the high 32
bits and the low 32. Any pair reads back as some string, so a name is only shown when every
character is one that names are written with (letters, digits, `_-.:/`): a pair of hashes
passes that test about once in a thousand, where a name always does.
"""

from __future__ import annotations

import string

from .key import INT_PAIR_KEY, AdvisoryKey

_CHAR_BITS = 7
_ONES = (1 << _CHAR_BITS) - 1
_LONGEST = 64 // _CHAR_BITS  # 9
NAME_CHARACTERS = frozenset(string.ascii_letters + string.digits + "_-.:/")


def distributed_lock_name(key: AdvisoryKey) -> str | None:
    """The name DistributedLock.Postgres packed into this pair key, or None."""
    if key.objsubid != INT_PAIR_KEY:
        return None
    first, second = key.parts
    bits = ((first & 0xFFFFFFFF) << 32) | (second & 0xFFFFFFFF)
    length = _LONGEST
    while length and bits & _ONES == _ONES:
        length -= 1
        bits >>= _CHAR_BITS
    if bits & 1:  # the 0 that ends the name
        return None
    bits >>= 1
    name = "".join(chr((bits >> (_CHAR_BITS * (length - 1 - i))) & _ONES) for i in range(length))
    if not name or not NAME_CHARACTERS.issuperset(name):
        return None
    return name
