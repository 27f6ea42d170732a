"""The key registry resolved: each entry's key in pg_locks' terms, each lock named once."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .derive import for_database, local_parts
from .key import (
    BIGINT_KEY,
    INT_PAIR_KEY,
    bigint_of_oids,
    oid,
    oids_of_bigint,
    oids_of_pair,
)
from .key_config import KeyConfig

# hashtext() and hashtextextended() are internal to PostgreSQL (changed between major
# versions before, and dependent on the server's byte order), so the exporter asks the server
# for them, after every connect, in one statement: hashtext where no seed is given.
HASH_TEXTS_SQL = """
SELECT CASE WHEN t.seed IS NULL THEN pg_catalog.hashtext(t.text)::bigint
            ELSE pg_catalog.hashtextextended(t.text, t.seed) END
FROM unnest(%(texts)s::text[], %(seeds)s::bigint[]) WITH ORDINALITY AS t(text, seed, n)
ORDER BY t.n
"""


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


def _key(config: KeyConfig, parts: Sequence[int]) -> RegisteredKey:
    """The entry for the key these parts make in its form."""
    if config.form == "pair" or config.pair is not None:
        first, second = parts
        return RegisteredKey(config, INT_PAIR_KEY, *oids_of_pair(first, second))
    if config.form == "namespace" or config.namespace is not None:
        return RegisteredKey(config, INT_PAIR_KEY, oid(parts[0]), None)
    return RegisteredKey(config, BIGINT_KEY, *oids_of_bigint(parts[0]))


def _locally_resolved(config: KeyConfig) -> RegisteredKey | None:
    """The entry, unless only the server can compute its key, or its text is per database
    (its keys are known once the server's databases are)."""
    if config.key is not None:
        return _key(config, (config.key,))
    if config.pair is not None:
        return _key(config, config.pair)
    if config.namespace is not None:
        return _key(config, (config.namespace,))
    if config.server_side or config.per_database:
        return None
    assert config.hash is not None
    assert config.text is not None
    return _key(config, local_parts(config.hash, config.text, config.form, config.byte_order))


def _clash(a: KeyConfig, b: KeyConfig) -> ValueError:
    return ValueError(
        f"keys {a.name!r} ({a.describe()}){_where(a)} and {b.name!r} ({b.describe()})"
        f"{_where(b)} name the same lock"
    )


_Columns = tuple[int, int, int | None]  # a lock's objsubid, classid and objid


class _Claims:
    """The locks that entries claim, found in constant time: by their exact columns, and
    namespaces (and the pairs under them) by their first int, so that thousands of
    per-database keys are checked as cheaply as a handful."""

    def __init__(self) -> None:
        self._exact: dict[_Columns, RegisteredKey] = {}
        self._spaces: dict[int, RegisteredKey] = {}
        self._pairs: dict[int, RegisteredKey] = {}  # the first exact pair of each first int

    def owner(self, key: RegisteredKey) -> RegisteredKey | None:
        """An entry that names some lock `key` names too."""
        if key.objid is None:
            return self._spaces.get(key.classid) or self._pairs.get(key.classid)
        found = self._exact.get((key.objsubid, key.classid, key.objid))
        if found is None and key.objsubid == INT_PAIR_KEY:
            found = self._spaces.get(key.classid)
        return found

    def add(self, key: RegisteredKey) -> None:
        if key.objid is None:
            self._spaces[key.classid] = key
            return
        self._exact[key.objsubid, key.classid, key.objid] = key
        if key.objsubid == INT_PAIR_KEY:
            self._pairs.setdefault(key.classid, key)

    def merge(self, first: RegisteredKey, key: RegisteredKey) -> RegisteredKey:
        """One entry computed for two databases that gave the same key: one entry for both."""
        databases = first.config.databases + key.config.databases
        merged = replace(first, config=first.config.model_copy(update={"databases": databases}))
        self.add(merged)
        return merged


def _columns(key: RegisteredKey) -> _Columns:
    return key.objsubid, key.classid, key.objid


def _same_entry(first: RegisteredKey, key: RegisteredKey) -> bool:
    """Two keys of one entry computed for two databases (which merge), not two entries."""
    return (
        first.name == key.name
        and _columns(first) == _columns(key)
        and bool(first.config.databases)
        and bool(key.config.databases)
    )


def _kept(
    keys: Iterable[RegisteredKey], clash: Callable[[RegisteredKey, RegisteredKey], None]
) -> list[RegisteredKey]:
    """The keys in order, each lock named once: an entry's keys for two databases that
    coincide become one key for both; a key that names a lock an earlier entry names is left
    out, and `clash` hears of it (it may raise)."""
    claims = _Claims()
    found: list[RegisteredKey] = []
    positions: dict[_Columns, int] = {}
    for key in keys:
        first = claims.owner(key)
        if first is None:
            claims.add(key)
            positions[_columns(key)] = len(found)
            found.append(key)
        elif _same_entry(first, key):
            found[positions[_columns(first)]] = claims.merge(first, key)
        else:
            clash(first, key)
    return found


def _refuse(first: RegisteredKey, key: RegisteredKey) -> None:
    raise _clash(first.config, key.config)


def check_configs(configs: Sequence[KeyConfig]) -> None:
    """Reject a name used twice, or two entries that would match the same lock.

    Keys computed by the server, or per database, are only known once a server is asked:
    two with the same text are caught here, a clash with an entry of another form when the
    target connects (the collection then fails with the same message).
    """
    names: dict[str, KeyConfig] = {}
    texts: dict[tuple[object, ...], KeyConfig] = {}
    for config in configs:
        if names.setdefault(config.name, config) is not config:
            raise ValueError(f"key name {config.name!r} is used twice")
        if config.text is not None:
            same = (config.text, config.hash, config.seed, config.form, config.byte_order)
            first = texts.setdefault(same, config)
            if first is not config and not (set(first.databases) ^ set(config.databases)):
                raise _clash(first, config)
    _kept([key for key in map(_locally_resolved, configs) if key is not None], _refuse)


# Asks the server for hashtext (a None seed) or hashtextextended values of these texts.
HashTexts = Callable[[Sequence[str], Sequence[int | None]], Sequence[int]]
Note = Callable[[str], None]


def _ignore(_message: str) -> None:
    pass


def _where(config: KeyConfig) -> str:
    if not config.databases:
        return ""
    if len(config.databases) == 1:
        return f" in database {config.databases[0]!r}"
    return f" in databases {', '.join(map(repr, config.databases))}"


def expand(configs: Sequence[KeyConfig], databases: Iterable[str]) -> list[KeyConfig]:
    """The entries with each per-database text written out for every database it counts in:
    those it lists, else every one of the server's `databases`. Built without validation:
    the entry was validated, and a server may have thousands of databases."""
    names = sorted(set(databases))
    found: list[KeyConfig] = []
    for config in configs:
        if not config.per_database:
            found.append(config)
            continue
        assert config.text is not None
        for database in config.databases or names:
            text = for_database(config.text, database)
            found.append(
                config.model_copy(
                    update={"text": text, "per_database": False, "databases": (database,)}
                )
            )
    return found


def resolved(
    configs: Sequence[KeyConfig], hash_texts: HashTexts | None
) -> list[RegisteredKey | None]:
    """Each entry's key (per-database texts written out already), in order: the server is
    asked once for every key only it can compute; without `hash_texts` those are None."""
    server_side = [c for c in configs if c.server_side]
    values: Sequence[int] = ()
    if server_side and hash_texts is not None:
        values = hash_texts(
            [c.text or "" for c in server_side],
            [c.seed if c.hash == "hashtextextended" else None for c in server_side],
        )
    computed = iter(values)
    found: list[RegisteredKey | None] = []
    for config in configs:
        if not config.server_side:
            found.append(_locally_resolved(config))
        else:
            found.append(None if hash_texts is None else _key(config, (next(computed),)))
    return found


def with_catalog(
    keys: Sequence[RegisteredKey], catalog: Sequence[RegisteredKey], note: Note = _ignore
) -> tuple[RegisteredKey, ...]:
    """The user's keys, then the catalog's entries for locks that none of them names.

    The collection matches a lock to one entry whatever its database, so no two entries
    may name the same lock: the user's entry wins over the catalog's, and of two catalog
    entries the first is kept (the same entry computed for two databases becomes one
    entry for both). `note` hears of each entry left out.
    """
    mine = _Claims()
    for key in keys:
        mine.add(key)
    free = []
    for key in catalog:
        owner = mine.owner(key)
        if owner is None:
            free.append(key)
        else:
            note(
                f"key {owner.name!r} ({owner.config.describe()}) of the registry names the "
                f"lock of the catalog's {key.name!r}{_where(key.config)}: it keeps its name"
            )

    def same_lock(first: RegisteredKey, key: RegisteredKey) -> None:
        note(
            f"the catalog's {first.name!r}{_where(first.config)} and {key.name!r}"
            f"{_where(key.config)} name the same lock ({key.config.describe()}): "
            f"it is named {first.name!r}"
        )

    return (*keys, *_kept(free, same_lock))


@dataclass(frozen=True)
class Registry:
    """The resolved registry of one target, in configuration order."""

    keys: tuple[RegisteredKey, ...] = ()

    @classmethod
    def resolve(
        cls,
        configs: Sequence[KeyConfig],
        hash_texts: HashTexts | None,
        catalog: Sequence[KeyConfig] = (),
        note: Note = _ignore,
        databases: Iterable[str] = (),
    ) -> Registry:
        """Resolve every entry: per-database texts for each of the server's `databases`, the
        keys only the server computes asked of it through `hash_texts` (once for all; left
        out where it is None). A clash between the user's entries raises ValueError.

        `catalog` (from catalog.key_configs) follows the user's entries: see with_catalog.
        """
        databases = tuple(databases)
        mine, theirs = expand(configs, databases), expand(catalog, databases)
        keys = resolved([*mine, *theirs], hash_texts)
        own = _kept([k for k in keys[: len(mine)] if k is not None], _refuse)
        catalog_keys = [replace(k, catalog=True) for k in keys[len(mine) :] if k is not None]
        return cls(with_catalog(own, catalog_keys, note))

    @property
    def entries(self) -> tuple[RegisteredKey, ...]:
        """One key of each entry (one computed per database has a key per database), in
        order: what is said of an entry, its max_hold, is said once."""
        seen: dict[str, RegisteredKey] = {}
        for key in self.keys:
            seen.setdefault(key.name, key)
        return tuple(seen.values())

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
