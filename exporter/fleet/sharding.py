"""Which replica of a sharded fleet collects a configured target: jump consistent hash.

Lamping and Veach, "A Fast, Minimal Memory, Consistent Hash Algorithm" (2014): going from
N to N+1 shards moves about 1/(N+1) of the targets, all of them to the new shard, and
needs no table that the replicas would have to share.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

_MASK_64 = (1 << 64) - 1
_JUMP_MULTIPLIER = 2862933555777941757  # the paper's linear congruential generator
# A StatefulSet names its pods NAME-0, NAME-1 ...
_ORDINAL = re.compile(r"-([0-9]+)$")


def target_key(name: str) -> int:
    """A 64-bit hash of a target's name: the first 8 bytes of its SHA-256, big-endian.

    Not Python's hash(), which is salted per process: every replica must compute the same.
    """
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big")


def jump_hash(key: int, buckets: int) -> int:
    """The bucket in [0, buckets) of a 64-bit key."""
    if buckets < 1:
        raise ValueError(f"{buckets} buckets: there must be at least one")
    bucket, candidate = -1, 0
    while candidate < buckets:
        bucket = candidate
        key = (key * _JUMP_MULTIPLIER + 1) & _MASK_64
        candidate = int((bucket + 1) * ((1 << 31) / ((key >> 33) + 1)))
    return bucket


def ordinal_of(host_name: str) -> int:
    """The ordinal a StatefulSet gives its pod, from the name's trailing -N: exp-2 -> 2."""
    found = _ORDINAL.search(host_name)
    if found is None:
        raise ValueError(
            f"the host name {host_name!r} does not end in -N (as a StatefulSet's pod "
            "name-0, name-1 ... does): give the index as a number"
        )
    return int(found.group(1))


@dataclass(frozen=True)
class Shard:
    """This replica's part of the configured targets: shard `index` of `total`."""

    index: int = 0
    total: int = 1

    def owner(self, name: str) -> int:
        """The shard that collects the target of this name."""
        return jump_hash(target_key(name), self.total)

    def owns(self, name: str) -> bool:
        return self.owner(name) == self.index
