"""What a server's collection gives (`Collection`: what it saw, or why it saw nothing), and
what a read between two collections works with (`Reading`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from pg_advisory_exporter.keys.registry import NO_KEYS, Registry

from .databases import Databases
from .directory import View
from .holds import NO_HOLDS, Holds
from .pg_stat_statements import StatementsRead
from .poolers import PoolerView
from .snapshot import ServerSnapshot


@dataclass(frozen=True)
class Collection:
    """The outcome of one collection from one server: what it saw, or why it saw nothing."""

    finished_at: float  # monotonic clock
    duration: float
    snapshot: ServerSnapshot | None = None  # None on failure
    poolers: tuple[PoolerView, ...] = ()
    error: str | None = None
    # The last read of pg_stat_statements when the collection ended (read apart, rarely).
    statements: StatementsRead | None = None
    holds: Holds = NO_HOLDS  # how long each lock seen has been held (holds.py)
    # The target that answers for the server (it carries the whole server's series), as the
    # server's directory decided when the collection ended (directory.py).
    answering: View | None = None
    registry: Registry = NO_KEYS  # the one its keys were matched with
    # A failed one: whether the server refused it because its lock table is full (its read,
    # or a new connection: capacity.refused_for_full_table). A snapshot says it of itself.
    refused_for_full_table: bool = False
    # The server's collections so far, as of this one: failed ones, the last that succeeded.
    errors_total: int = 0
    last_collection_unix: float | None = None
    last_success_unix: float | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class Reading:
    """What a read between collections works with: the kept connection, the key registry
    resolved on it and the server's list of databases (databases.py)."""

    conn: psycopg.Connection[Any]
    registry: Registry
    databases: Databases


class ReadThrough(Exception):
    """A server found to be another one under a second address (server.py): its answer is
    that one's collection."""

    def __init__(self, collection: Collection) -> None:
        super().__init__()
        self.collection = collection
