"""The key registry: names for advisory lock keys, and the form pg_locks shows each key in."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from pg_advisory_exporter.schema import Duration, Strict

from .key import (
    BIGINT_KEY,
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    INT_PAIR_KEY,
    bigint_of_oids,
    oid,
    oids_of_bigint,
    oids_of_pair,
    signed,
)

Int32 = Annotated[int, Field(ge=INT32_MIN, le=INT32_MAX)]
Int64 = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]

# hashtextextended() is internal to PostgreSQL and has changed between major versions, so
# the exporter asks the server for it (after every connect) rather than computing it.
HASH_TEXTS_SQL = """
SELECT pg_catalog.hashtextextended(t.text, t.seed)
FROM unnest(%(texts)s::text[], %(seeds)s::bigint[]) WITH ORDINALITY AS t(text, seed, n)
ORDER BY t.n
"""


class KeyConfig(Strict):
    """One registered key: its name and exactly one of key, pair, namespace or text."""

    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.:-]{0,99}$")
    key: Int64 | None = None
    pair: tuple[Int32, Int32] | None = None
    namespace: Int32 | None = None
    text: str | None = None
    hash: Literal["md5", "hashtextextended"] | None = None
    seed: Int64 = 0
    databases: tuple[str, ...] = ()
    long_lived: bool = False
    expect_held: bool = False
    max_hold: Duration | None = None

    @model_validator(mode="after")
    def _one_form(self) -> KeyConfig:
        forms = [f for f in ("key", "pair", "namespace", "text") if getattr(self, f) is not None]
        if len(forms) != 1:
            raise ValueError(
                "give exactly one of key, pair, namespace or text"
                + (f" (got {', '.join(forms)})" if forms else "")
            )
        if (self.text is None) != (self.hash is None):
            raise ValueError("text and hash go together: hash is md5 or hashtextextended")
        if self.seed and self.hash != "hashtextextended":
            raise ValueError("seed only applies to hash: hashtextextended")
        return self

    def describe(self) -> str:
        """The key as its entry wrote it, for messages."""
        if self.key is not None:
            return f"key {self.key}"
        if self.pair is not None:
            return f"pair ({self.pair[0]}, {self.pair[1]})"
        if self.namespace is not None:
            return f"namespace {self.namespace}"
        if self.hash == "md5":
            return f"md5 of {self.text!r}"
        return f"hashtextextended({self.text!r}, {self.seed})"


def md5_key(text: str) -> int:
    """`('x' || left(md5(text), 16))::bit(64)::bigint`: documented functions, stable."""
    return signed(int(hashlib.md5(text.encode()).hexdigest()[:16], 16), 64)


@dataclass(frozen=True)
class RegisteredKey:
    """A registry entry in pg_locks' terms: objsubid, classid and objid (None: any)."""

    config: KeyConfig
    objsubid: int
    classid: int  # unsigned, as the oid column holds it
    objid: int | None  # None for a namespace: every pair whose first int is classid
    catalog: bool = False  # from the built-in catalog (catalog.py), not the user's registry

    @property
    def name(self) -> str:
        return self.config.name

    def overlaps(self, other: RegisteredKey) -> bool:
        """Whether some lock would match both entries."""
        if (self.objsubid, self.classid) != (other.objsubid, other.classid):
            return False
        return self.objid is None or other.objid is None or self.objid == other.objid


def _bigint(config: KeyConfig, value: int) -> RegisteredKey:
    return RegisteredKey(config, BIGINT_KEY, *oids_of_bigint(value))


def _locally_resolved(config: KeyConfig) -> RegisteredKey | None:
    if config.key is not None:
        return _bigint(config, config.key)
    if config.pair is not None:
        first, second = config.pair
        return RegisteredKey(config, INT_PAIR_KEY, *oids_of_pair(first, second))
    if config.namespace is not None:
        return RegisteredKey(config, INT_PAIR_KEY, oid(config.namespace), None)
    if config.hash == "md5":
        assert config.text is not None
        return _bigint(config, md5_key(config.text))
    return None  # hashtextextended: only the server knows


def _clash(a: KeyConfig, b: KeyConfig) -> ValueError:
    return ValueError(
        f"keys {a.name!r} ({a.describe()}) and {b.name!r} ({b.describe()}) name the same lock"
    )


def _check_overlaps(keys: Sequence[RegisteredKey]) -> None:
    for i, first in enumerate(keys):
        for second in keys[i + 1 :]:
            if first.overlaps(second):
                raise _clash(first.config, second.config)


def check_configs(configs: Sequence[KeyConfig]) -> None:
    """Reject a name used twice, or two entries that would match the same lock.

    hashtextextended keys are only known once a server is asked: two with the same text
    and seed are caught here, a clash with an entry of another form when the target
    connects (the collection then fails with the same message).
    """
    names: dict[str, KeyConfig] = {}
    texts: dict[tuple[str | None, int], KeyConfig] = {}
    for config in configs:
        if names.setdefault(config.name, config) is not config:
            raise ValueError(f"key name {config.name!r} is used twice")
        if config.hash == "hashtextextended":
            first = texts.setdefault((config.text, config.seed), config)
            if first is not config:
                raise _clash(first, config)
    _check_overlaps([key for key in map(_locally_resolved, configs) if key is not None])


HashTexts = Callable[[Sequence[str], Sequence[int]], Sequence[int]]
Note = Callable[[str], None]
_Columns = tuple[int, int, int | None]  # a lock's objsubid, classid and objid


def _ignore(_message: str) -> None:
    pass


def _where(config: KeyConfig) -> str:
    return f" in database {config.databases[0]!r}" if config.databases else ""


def with_catalog(
    keys: tuple[RegisteredKey, ...], catalog: Sequence[KeyConfig], note: Note = _ignore
) -> tuple[RegisteredKey, ...]:
    """The user's keys, then the catalog's entries for locks that none of them names.

    The collection matches a lock to one entry whatever its database, so no two entries
    may name the same lock: the user's entry wins over the catalog's, and of two catalog
    entries the first is kept (the same entry computed for two databases becomes one
    entry for both). `note` hears of each entry left out. Catalog keys are all bigint keys
    known here, so a lookup by pg_locks' columns finds every clash, for thousands of
    databases as cheaply as for one.
    """
    mine: dict[_Columns, RegisteredKey] = {
        (k.objsubid, k.classid, k.objid): k for k in keys if k.objid is not None
    }
    kept: dict[_Columns, RegisteredKey] = {}
    for config in catalog:
        assert config.key is not None, "catalog entries have bigint keys"
        key = replace(_bigint(config, config.key), catalog=True)
        column_values = (key.objsubid, key.classid, key.objid)
        owner = mine.get(column_values)
        first = kept.get(column_values)
        if owner is not None:
            note(
                f"key {owner.name!r} ({owner.config.describe()}) of the registry names the "
                f"lock of the catalog's {config.name!r}{_where(config)}: it keeps its name"
            )
        elif first is None:
            kept[column_values] = key
        elif first.name == config.name:
            databases = first.config.databases + config.databases
            merged = first.config.model_copy(update={"databases": databases})
            kept[column_values] = replace(first, config=merged)
        else:
            note(
                f"the catalog's {first.name!r}{_where(first.config)} and {config.name!r}"
                f"{_where(config)} name the same lock ({config.describe()}): "
                f"it is named {first.name!r}"
            )
    return keys + tuple(kept.values())


@dataclass(frozen=True)
class Registry:
    """The resolved registry of one target, in configuration order."""

    keys: tuple[RegisteredKey, ...] = ()

    @classmethod
    def resolve(
        cls,
        configs: Sequence[KeyConfig],
        hash_texts: HashTexts,
        catalog: Sequence[KeyConfig] = (),
        note: Note = _ignore,
    ) -> Registry:
        """Resolve every entry; `hash_texts` asks the server for hashtextextended values.

        `catalog` (from catalog.key_configs) follows the user's entries: see with_catalog.
        """
        server_side = [c for c in configs if c.hash == "hashtextextended"]
        hashed: Mapping[str, int] = {}
        if server_side:
            values = hash_texts([c.text or "" for c in server_side], [c.seed for c in server_side])
            hashed = {c.name: value for c, value in zip(server_side, values, strict=True)}
        keys = tuple(_locally_resolved(c) or _bigint(c, hashed[c.name]) for c in configs)
        _check_overlaps(keys)
        return cls(with_catalog(keys, catalog, note) if catalog else keys)

    @functools.cached_property
    def _by_columns(self) -> dict[_Columns, RegisteredKey]:
        # Built once per registry: a forensics answer names up to tens of thousands of
        # entries, and the catalog puts keys for every database on each target.
        return {(k.objsubid, k.classid, k.objid): k for k in reversed(self.keys)}

    def lookup(self, objsubid: int, classid: int, objid: int, datname: str) -> RegisteredKey | None:
        """The entry that names the lock with these pg_locks columns in database `datname`.

        The same match as the collection's: an exact key, else a namespace (every pair whose
        first int is classid); an entry restricted to `databases` names it only there.
        """
        found = self._by_columns.get((objsubid, classid, objid))
        if found is None and objsubid == INT_PAIR_KEY:
            found = self._by_columns.get((objsubid, classid, None))
        if found is None or (found.config.databases and datname not in found.config.databases):
            return None
        return found

    def sql_parameters(self) -> dict[str, list[Any]]:
        """The registry as the arrays the collection statement matches locks against.

        A key's index is its position in the registry. Bigint keys and int pairs are given
        packed as `(classid::bigint << 32) | objid::bigint`, which is how the statement packs
        a lock's columns (signed: a key with the high bit set is negative); namespaces by
        their classid. `objid` holds every exact key's objid, which the statement screens
        lock rows by before it compares whole keys.
        """
        bigint: list[tuple[int, int]] = []
        pairs: list[tuple[int, int]] = []
        spaces: list[tuple[int, int]] = []
        for i, k in enumerate(self.keys):
            if k.objid is None:
                spaces.append((i, k.classid))
            else:
                packed = bigint_of_oids(k.classid, k.objid)
                (bigint if k.objsubid == BIGINT_KEY else pairs).append((i, packed))
        return {
            "bigint_index": [i for i, _ in bigint],
            "bigint_key": [v for _, v in bigint],
            "pair_index": [i for i, _ in pairs],
            "pair_key": [v for _, v in pairs],
            "namespace_index": [i for i, _ in spaces],
            "namespace_classid": [v for _, v in spaces],
            "objid": sorted({k.objid for k in self.keys if k.objid is not None}),
        }


NO_KEYS = Registry()
