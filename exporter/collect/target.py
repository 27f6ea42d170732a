"""A target: what one name answers for (a whole server, or one database of it), read from the
server's shared collections."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from dataclasses import dataclass
from urllib.parse import quote

from pg_advisory_exporter.config.collection import CollectionSettings
from pg_advisory_exporter.config.settings import TargetSettings
from pg_advisory_exporter.endpoints import LOCKS_PATH
from pg_advisory_exporter.metrics import Sample, locks_page_info
from pg_advisory_exporter.serverlog.counting import ServerLog

from .collection import Collection
from .holds import NO_HOLDS, Holds
from .pg_stat_statements import StatementsRead, statements_samples
from .scheduling import Priority, Task
from .series import server_samples, target_series
from .server import Server


@dataclass(frozen=True)
class Health:
    target: str
    up: bool
    last_collection_unix: float | None
    last_success_unix: float | None
    duration_seconds: float | None
    error: str | None


class Target:
    """One name's series, mapped from its server's collections.

    A target answers for its whole server (`database` None: every configured target, and a
    probe that names no database), or for one database of it. Of all the targets that read
    one server, one answers for the server itself, its *server target*: the series that
    describe the whole server (the lock table, its settings' info, the exporter's own
    collection series) appear there only, so that they are counted once however many of its
    databases are probed. It is the one first in `rank` (directory.py), which each
    collection names.

    A target is given its server (arrangement.py's for a configured target, the auth
    module's for a discovered one), which whoever made it closes.
    """

    def __init__(
        self,
        config: TargetSettings,
        external_url: str | None = None,
        *,
        server: Server,
        database: str | None = None,
        rank: tuple[int, ...] = (0,),
    ) -> None:
        self.name = config.name
        self.config = config
        self.database = database
        self._rank = rank
        self.server = server
        # Where the target's /locks page is, where the exporter knows its own URL: a series
        # for alert descriptions to link to, made once here rather than at every scrape.
        self._locks_page = (
            []
            if external_url is None
            else [
                locks_page_info(self.name, f"{external_url}{LOCKS_PATH}?target={quote(self.name)}")
            ]
        )
        self._rules = self.settings.rewrite_rules
        # The server's own log, where the target names it: read on a thread of its own.
        self._server_log = (
            None
            if config.server_log is None
            else ServerLog(
                self.name,
                config.server_log,
                self._rules,
                self.settings.application_name_limit,
                lambda: self.server.reading_server().registry,
            )
        )
        if self._server_log is not None:
            self._server_log.start()
        # The series of the last collection mapped, reused by the scrapes that share it.
        self._mapped_lock = threading.Lock()
        self._mapped: tuple[Collection, bool, list[Sample]] | None = None
        self.server.directory.attach(self, self.server)

    @property
    def settings(self) -> CollectionSettings:
        return self.config.collection

    @property
    def rank(self) -> tuple[int, ...]:
        return self._rank

    @rank.setter
    def rank(self, rank: tuple[int, ...]) -> None:
        """A reload may reorder the targets: the next collection of its server says anew
        which answers for it."""
        self._rank = rank

    # -- scrapes ---------------------------------------------------------------------------

    def begin(
        self, urgent: bool = False, queue: list[tuple[Task[Collection], Priority]] | None = None
    ) -> Collection | Future[Collection]:
        """Its server's last collection if recent enough, else the running (or a new) one."""
        return self.server.begin(urgent, queue)

    def late(self) -> Collection:
        return self.server.reading_server().late()

    def series(self, collection: Collection) -> list[Sample]:
        """All series of this target for one scrape: those of the collection (mapped once
        for the scrapes that share it), then what its server's log counted until now."""
        server_wide = collection.answering is self
        with self._mapped_lock:
            mapped = self._mapped
            cached = mapped is not None and mapped[0] is collection and mapped[1] == server_wide
        if cached:
            assert mapped is not None
            samples = mapped[2]
        else:
            samples = self._map(collection, server_wide)
            with self._mapped_lock:
                self._mapped = (collection, server_wide, samples)
        if self._server_log is None:
            return samples
        return samples + self._server_log.samples()

    def _map(self, collection: Collection, server_wide: bool) -> list[Sample]:
        snapshot = collection.snapshot
        server: list[Sample] = []
        folded = 0
        if snapshot is not None and self.database is None and not server_wide:
            # Another name for a server that an earlier target of the file answers for:
            # its databases are that one's to count, and this one says it was read.
            server = [Sample("pg_advisory_up", (self.name,), 1)]
        elif snapshot is not None:
            mapped = server_samples(
                self.name,
                snapshot,
                self._rules,
                self.settings.application_name_limit,
                collection.registry,
                holds=collection.holds,
                poolers=collection.poolers,
                database=self.database,
                server_wide=server_wide,
                idle_by_design=self.config.idle_by_design,
            )
            server, folded = mapped.samples, mapped.folded_application_names
            server += statements_samples(
                self.name, collection.statements, self.database, server_wide
            )
        return target_series(
            self.name,
            server,
            duration=collection.duration,
            errors_total=collection.errors_total,
            last_success_unix=collection.last_success_unix,
            insufficient_privilege=None if snapshot is None else not snapshot.can_read_all_stats,
            folded_application_names=folded,
            server_wide=server_wide,
            refused_for_full_table=collection.refused_for_full_table,
        ) + (self._locks_page if server_wide else [])

    def statements(self) -> StatementsRead | None:
        """Its server's last rare read of pg_stat_statements, if one was made."""
        return self.server.reading_server().statements()

    def holds(self) -> Holds:
        """How long its server's locks had been held at the last successful collection."""
        last = self.server.reading_server().last()
        return NO_HOLDS if last is None or last.snapshot is None else last.holds

    def health(self) -> Health:
        last = self.server.reading_server().last()
        return Health(
            target=self.name,
            up=last is not None and last.ok,
            last_collection_unix=None if last is None else last.last_collection_unix,
            last_success_unix=None if last is None else last.last_success_unix,
            duration_seconds=None if last is None else last.duration,
            error=None if last is None else last.error,
        )

    def close(self) -> None:
        """No longer served: it leaves its server's directory (whoever made the server
        closes it, once no target of theirs is left on it)."""
        if self._server_log is not None:
            self._server_log.close()
        self.server.directory.detach(self)
