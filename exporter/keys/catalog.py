"""The catalog as the configuration uses it: entries by name, the `catalog` setting, their keys.

The entries themselves, each with where in its library's source it was read, are in
well_known_keys.py; what an entry is, in catalog_entry.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Annotated

from pydantic import BeforeValidator

from .catalog_entry import CatalogEntry
from .idle_by_design import CATALOG as IDLE_BY_DESIGN
from .idle_by_design import CATALOG_NAMES as IDLE_BY_DESIGN_NAMES
from .idle_by_design import IdleByDesignConfig
from .key_config import KeyConfig
from .well_known_keys import ENTRIES

BY_NAME = {entry.name: entry for entry in ENTRIES}
NAMES: tuple[str, ...] = tuple(entry.name for entry in ENTRIES)
# The migration tools' keys: never a leak, and PgAdvisoryMigrationLockStuck's.
MIGRATION_KEYS: tuple[str, ...] = tuple(entry.name for entry in ENTRIES if entry.migration)
DEFAULTS: tuple[CatalogEntry, ...] = tuple(entry for entry in ENTRIES if entry.default)


def _choice(value: object) -> object:
    """true, false, or a list of entry names (opt-in ones included, and the applications idle
    by design), each at most once."""
    if isinstance(value, bool):
        return value
    if not isinstance(value, list | tuple) or not all(isinstance(n, str) for n in value):
        raise ValueError("expected true, false or a list of catalog entry names")
    seen: set[str] = set()
    for name in value:
        if name not in BY_NAME and name not in IDLE_BY_DESIGN_NAMES:
            every = ", ".join((*NAMES, *IDLE_BY_DESIGN_NAMES))
            raise ValueError(f"unknown catalog entry {name!r}; the entries are {every}")
        if name in seen:
            raise ValueError(f"catalog entry {name!r} is listed twice")
        seen.add(name)
    return tuple(value)


CatalogChoice = Annotated[bool | tuple[str, ...], BeforeValidator(_choice)]
"""The `catalog` setting: true (the default entries), false (none), or the entries to keep."""


def selected(choice: bool | tuple[str, ...] | None) -> tuple[CatalogEntry, ...]:
    """The entries a setting keeps, in catalog order; None (not set) keeps the defaults."""
    if choice is None or choice is True:
        return DEFAULTS
    if choice is False:
        return ()
    return tuple(entry for entry in ENTRIES if entry.name in choice)


def selected_idle_by_design(
    choice: bool | tuple[str, ...] | None,
) -> tuple[IdleByDesignConfig, ...]:
    """The catalog's applications idle by design that a setting keeps: every one unless it
    is false or a list that does not name it."""
    if choice is None or choice is True:
        return IDLE_BY_DESIGN
    if choice is False:
        return ()
    return tuple(entry for entry in IDLE_BY_DESIGN if entry.name in choice)


def needs_databases(entries: Iterable[CatalogEntry]) -> bool:
    """Whether some entry's key depends on the database, so the server's list is needed."""
    return any(entry.describe()["per_database"] == "yes" for entry in entries)


def key_configs(entries: Sequence[CatalogEntry], databases: Iterable[str]) -> list[KeyConfig]:
    """Registry entries for these catalog entries on a server with these databases.

    A fixed key counts in every database; a computed one only in the database it was
    computed for (a per-database form is written out for each database by the registry, as
    the user's are). Built without validation: every value is in range (the tests check that
    each one validates), and a server may have thousands of databases.
    """
    names = sorted(set(databases))
    configs: list[KeyConfig] = []
    for entry in entries:
        if entry.per_database is not None:
            compute = entry.per_database
            configs.extend(entry.config(key=compute(name), databases=(name,)) for name in names)
        elif entry.key is not None:
            configs.append(entry.config(key=entry.key))
        else:
            configs.append(entry.config())
    return configs
