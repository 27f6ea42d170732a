"""One entry of the well-known keys' catalog (`CatalogEntry`), and the hashes libraries key with."""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from .key import signed, unsigned
from .key_config import KeyConfig, Level


def crc32(text: str) -> int:
    """The IEEE CRC-32 of the UTF-8 text: Ruby's Zlib.crc32, Go's crc32.ChecksumIEEE, and
    Rust's crc::CRC_32_ISO_HDLC give this same value."""
    return zlib.crc32(text.encode())


def golang_migrate_key(name: str, *additional: str) -> int:
    """golang-migrate's GenerateAdvisoryLockId: CRC-32 of the names joined with NUL (the
    additional names first), times the salt 1486364155, in uint32 arithmetic."""
    joined = "\x00".join([*additional, name])
    return unsigned(crc32(joined) * 1486364155, 32)


def java_string_hash(text: str) -> int:
    """Java's String.hashCode() (31 * h + char over UTF-16 units), a signed 32-bit int."""
    data = text.encode("utf-16-be")
    value = 0
    for i in range(0, len(data), 2):
        value = unsigned(31 * value + int.from_bytes(data[i : i + 2], "big"), 32)
    return signed(value, 32)


def fnv1_32(text: str) -> int:
    """32-bit FNV-1 (multiply, then xor: Go's hash/fnv New32, not New32a)."""
    value = 0x811C9DC5
    for byte in text.encode():
        value = unsigned(value * 0x01000193, 32) ^ byte
    return value


# What a lock guards, which decides how the exporter judges a holder of it:
# - migration: a schema migration (or install). Its holder may sit idle on purpose while the
#   migration runs on another connection (Rails), so it never counts as a leaked lock;
#   PgAdvisoryMigrationLockStuck pages on how long it has been held instead.
# - maintenance: long work on the database (a repack, partition maintenance).
# - queue: a job queue's short critical sections, or its per-job locks.
# - leader: a leader election's lock, held for as long as its holder leads.
# - mutex: a distributed mutex around one critical section (a scheduler's included).
# Only a migration's kind changes the judging; a holder of any other kind is judged as any
# lock's, but for an entry whose holder idles on purpose (idle_holder: a leader that holds
# its lock on a connection of its own, a queue whose dispatcher holds its jobs' locks).
Kind = Literal["migration", "maintenance", "queue", "leader", "mutex"]


@dataclass(frozen=True)
class CatalogEntry:
    """One library's lock: a fixed key, one computed from the database's name, or one that
    the registry's own forms describe (`form`: a namespace, a digest, hashtext())."""

    name: str  # the `key` label value; a contract: alerts and dashboards match on it
    library: str
    versions: str
    key_text: str  # the key, or how it is computed, as docs/configuration.md shows it
    level: str  # how the library takes the lock, in words
    kind: Kind
    # The level where the library always takes the lock at one level: a transaction-level
    # lock was taken within its holder's transaction (see collect/holds.py).
    lock_level: Level | None
    key: int | None = None  # the same in every database
    per_database: Callable[[str], int] | None = None  # database name -> key
    form: KeyConfig | None = None  # a registry form (its name is replaced by the entry's)
    default: bool = True  # on unless the configuration lists the entries to keep
    # Its holder sits idle on purpose while the work runs on other connections (besides a
    # migration's, which may): never a leaked lock.
    idle_holder: bool = False
    # The project as the README lists it, where `library` says more than its name (by
    # default the library's words before " (").
    project_name: str = ""

    @property
    def project(self) -> str:
        return self.project_name or self.library.split(" (")[0]

    def describe(self) -> dict[str, str]:
        """The entry as the table of docs/configuration.md shows it."""
        per_database = self.per_database is not None or (
            self.form is not None and self.form.per_database
        )
        return {
            "name": self.name,
            "library": self.library,
            "versions": self.versions,
            "key": self.key_text,
            "per_database": "yes" if per_database else "no",
            "level": self.level,
            "kind": self.kind,
            "default": "on" if self.default else "opt-in",
        }

    def config(self, **fields: object) -> KeyConfig:
        """A registry entry for this entry's key (built without validation: the tests check
        that every one validates): a migration's key, and one whose holder idles on purpose,
        is long-lived, its holder never counted as a leak."""
        base = self.form if self.form is not None else KeyConfig.model_construct(name=self.name)
        long_lived = self.migration or self.idle_holder
        update = {"name": self.name, "level": self.lock_level, "long_lived": long_lived}
        return base.model_copy(update={**update, **fields})

    @property
    def migration(self) -> bool:
        return self.kind == "migration"
