"""The server's databases by oid, kept between collections: the collection statement reads no
shared catalog (so that it still runs when the lock table is full), and names the databases
it sees from this list, read on its own whenever the lock table has room."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import psycopg

# pg_database is a shared catalog: reading it takes an entry in the shared lock table (a
# shared relation's lock never takes a backend's fast path), so it fails when the table is
# full, and it is read apart from the collection statement.
DATABASES_SQL = "SELECT oid::bigint, datname, datistemplate FROM pg_catalog.pg_database"

# The most of its capacity the lock table may hold for the list to be read: the read takes an
# entry for a moment, and the exporter takes none from a table that is this full (nor does it
# send a statement that would fail, and log an error on the server, at every collection).
ROOM_TO_READ = 0.9


def unseen(oid: int) -> str:
    """The label of a database the list has not seen yet (one created while the lock table
    was too full to read the list again): its oid, until the list can be read."""
    return f"oid:{oid}"


class OddDatabases(Exception):
    """pg_database answered with something other than what was asked for."""


@dataclass(frozen=True)
class Databases:
    """The server's databases as last read: each oid's name, and which are templates."""

    names: Mapping[int, str] = field(default_factory=dict)
    templates: frozenset[int] = frozenset()

    def name(self, oid: int | None) -> str:
        """A database's name; '' for no database (a background worker's, shared objects')."""
        if not oid:
            return ""
        found = self.names.get(oid)
        return unseen(oid) if found is None else found

    @property
    def worked_in(self) -> dict[int, str]:
        """The databases but the templates (which are copied, not worked in)."""
        return {oid: name for oid, name in self.names.items() if oid not in self.templates}

    def lacks(self, oids: Iterable[int | None]) -> bool:
        """Whether one of these oids is a database this list has not seen."""
        return any(oid and oid not in self.names for oid in oids)


NO_DATABASES = Databases()


def read_databases(conn: psycopg.Connection[Any]) -> Databases:
    """The list, read now (psycopg.Error if the server refuses: at a full lock table, 53200)."""
    rows = conn.execute(DATABASES_SQL).fetchall()
    if not all(
        type(oid) is int and isinstance(name, str) and type(template) is bool
        for oid, name, template in rows
    ):
        raise OddDatabases(f"pg_database gave {rows[:3]!r}")
    return Databases(
        {oid: name for oid, name, _ in rows},
        frozenset(oid for oid, _, template in rows if template),
    )
