"""The check command: each target read once, reported as text for a person or as JSON."""

from __future__ import annotations

import functools
import json
import math
import sys
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TextIO

from .alerting.rules import Thresholds
from .collect.capacity import FULL_TABLE_NO_SESSION, FULL_TABLE_REFUSAL
from .collect.collection import Collection
from .collect.connection import Unanswered
from .collect.dead_client import Override, ReleaseSettings, read_overrides
from .collect.directory import Directory
from .collect.holds import NO_HOLDS, Holds
from .collect.pg_stat_statements import StatementsRead, read_once
from .collect.scheduling import CollectionPool, Watchdog
from .collect.series import KeyActivity, key_activity
from .collect.server import Server
from .collect.snapshot import ServerSnapshot, grant_read_all_stats
from .collect.vocabulary import NOTHING, format_age, format_held
from .config.settings import Config, TargetSettings
from .durations import format_duration
from .forensics.model import Forensics
from .forensics.page_json import forensics_json, statements_json
from .forensics.read import answer_kept
from .forensics.text import print_forensics, print_statements, table
from .keys import catalog
from .keys.appnames import RewriteRule, rewrite
from .keys.registry import NO_KEYS, Registry

EXIT_UNREACHABLE = 1
_TOP_APPLICATIONS = 10


@dataclass(frozen=True)
class Checked:
    """One target as `check` read it, or why it could not."""

    name: str
    role: str = ""
    snapshot: ServerSnapshot | None = None
    registry: Registry = NO_KEYS
    forensics: Forensics | None = None
    hygiene: Hygiene | None = None
    error: str | None = None
    holds: Holds = NO_HOLDS
    rules: tuple[RewriteRule, ...] = ()  # the target's application_name rewrites

    @property
    def grant(self) -> str | None:
        """The statement that lets the role read every session's state; None where it can."""
        if self.snapshot is None or self.snapshot.can_read_all_stats:
            return None
        return grant_read_all_stats(self.role)

    @functools.cached_property
    def key_activity(self) -> Mapping[tuple[str, str], KeyActivity]:
        """Each registered key's holders, waiters and longest hold by (database, key name),
        as the series count them: computed once for the sections that show them."""
        assert self.snapshot is not None
        return key_activity(self.snapshot, self.registry, self.holds)


def _header(checked: Checked, out: TextIO) -> None:
    snapshot = checked.snapshot
    assert snapshot is not None
    capacity = snapshot.lock_table_capacity
    out.write(f"Target {checked.name}: PostgreSQL {snapshot.server_version}\n")
    if snapshot.can_read_all_stats:
        out.write("  Privileges: the role can read every session's state\n")
    else:
        out.write(
            f"  Privileges: MISSING. Run {checked.grant}; until then states "
            "inside transactions are unknown and idle ages cannot be read\n"
        )
    use = f"{snapshot.lock_table_entries:,} entries"
    if capacity is not None:
        use += f" of {capacity:,} ({100 * snapshot.lock_table_entries / capacity:.1f}%)"
    out.write(f"  Lock table: {use}\n")
    out.write(
        f"  Busiest backend: {snapshot.backend_table_entries_max:,} entries "
        f"(max_locks_per_transaction = {snapshot.capacity_settings.max_locks_per_transaction})\n"
    )


def _registered_keys(checked: Checked, out: TextIO) -> None:
    registry = checked.registry
    own = [key for key in registry.entries if not key.catalog]
    if not own:
        return
    groups = checked.key_activity
    out.write(f"\n  Registered keys ({len(own)})\n")
    rows = [("KEY", "DATABASE", "HOLDERS", "WAITERS", "HELD FOR", "LIMIT")]
    for key in own:
        limit = format_duration(key.config.max_hold) if key.config.max_hold else NOTHING
        found = [(datname, group) for (datname, name), group in groups.items() if name == key.name]
        for datname, group in found:
            held_for = format_held(group.hold_max, True) if group.holders else NOTHING
            rows.append(
                (key.name, datname, str(group.holders), str(group.waiters), held_for, limit)
            )
        if not found:
            rows.append((key.name, NOTHING, "0", "0", NOTHING, limit))
    table(rows, out)


def _well_known_keys(checked: Checked, out: TextIO) -> None:
    """The catalog's keys that someone holds or awaits (they are many, and mostly idle)."""
    registry = checked.registry
    names = {key.name for key in registry.keys if key.catalog}
    if not names:
        return
    in_use = [
        (datname, name, group)
        for (datname, name), group in checked.key_activity.items()
        if name in names and (group.holders or group.waiters)
    ]
    out.write(f"\n  Well-known keys in use ({len(in_use)})\n")
    if in_use:
        table(
            [("KEY", "DATABASE", "HOLDERS", "WAITERS", "HELD FOR", "LIBRARY")]
            + [
                (
                    name,
                    datname,
                    str(group.holders),
                    str(group.waiters),
                    format_held(group.hold_max, True) if group.holders else NOTHING,
                    catalog.BY_NAME[name].library,
                )
                for datname, name, group in in_use
            ],
            out,
        )


def _top_applications(checked: Checked, out: TextIO) -> None:
    snapshot = checked.snapshot
    assert snapshot is not None
    apps: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0])
    for b in snapshot.backends:
        totals = apps[b.datname, rewrite(b.application_name, checked.rules)]
        totals[0] += b.held
        totals[1] += b.held > 0
        totals[2] += b.waiting
    top = sorted(apps.items(), key=lambda item: (-item[1][0], item[0]))[:_TOP_APPLICATIONS]
    out.write(f"\n  Top applications by advisory locks held ({len(apps)} in all)\n")
    if top:
        table(
            [("DATABASE", "APPLICATION", "LOCKS", "HOLDERS", "WAITERS")]
            + [
                (datname, repr(app), f"{held:,}", str(holders), str(waiting))
                for (datname, app), (held, holders, waiting) in top
            ],
            out,
        )


@dataclass(frozen=True)
class Hygiene:
    """What makes a leak likely or long on one server: the settings' overrides (read in
    check's session), and its risky statements (read as the daemon reads them, on a
    connection and within a deadline of their own; None with statements_interval 0)."""

    overrides: tuple[Override, ...]
    statements: StatementsRead | None = None


def _settings_words(settings: ReleaseSettings) -> str:
    return (
        f"tcp_keepalives_idle {settings.keepalives_idle}s, interval "
        f"{settings.keepalives_interval}s, count {settings.keepalives_count}; tcp_user_timeout "
        f"{settings.user_timeout_ms}ms; idle_session_timeout "
        f"{format_duration(settings.idle_session_timeout)}"
    )


def print_hygiene(snapshot: ServerSnapshot, hygiene: Hygiene, out: TextIO) -> None:
    """The hygiene section: how long a dead client's locks stay, and the risky statements."""
    out.write("\n  Hygiene\n")
    settings = snapshot.release_settings
    holders = snapshot.idle_session_holders
    bound = snapshot.dead_client_release_seconds
    if bound is not None:
        flag = "TOO LONG: " if bound > Thresholds().dead_client_release_after else ""
        out.write(
            f"    Dead client: {flag}a session idle outside a transaction keeps its locks "
            f"{format_age(bound)} after its client dies ({_settings_words(settings)}); "
            f"{holders} backends hold locks that way now\n"
        )
    else:
        out.write("    Dead client: the server cannot say its keepalive settings here\n")
    idle_in_transaction = snapshot.idle_in_transaction_release_seconds
    out.write(
        "    Idle in transaction: "
        + (
            "no limit (idle_in_transaction_session_timeout is 0)\n"
            if math.isinf(idle_in_transaction)
            else f"ended after {format_age(idle_in_transaction)}\n"
        )
    )
    for override in hygiene.overrides:
        out.write(f"    Set for some sessions only: {override}\n")
    print_statements(hygiene.statements, out)


def hygiene_json(snapshot: ServerSnapshot, hygiene: Hygiene) -> dict[str, Any]:
    settings = snapshot.release_settings
    idle_in_transaction = snapshot.idle_in_transaction_release_seconds
    return {
        "dead_client_release_seconds": snapshot.dead_client_release_seconds,
        "idle_in_transaction_release_seconds": (
            None if math.isinf(idle_in_transaction) else idle_in_transaction
        ),
        "idle_session_holders": snapshot.idle_session_holders,
        "settings": {
            "tcp_keepalives_idle": settings.keepalives_idle,
            "tcp_keepalives_interval": settings.keepalives_interval,
            "tcp_keepalives_count": settings.keepalives_count,
            "tcp_user_timeout_ms": settings.user_timeout_ms,
            "idle_session_timeout_seconds": settings.idle_session_timeout,
            "idle_in_transaction_session_timeout_seconds": (
                settings.idle_in_transaction_session_timeout
            ),
        },
        "overrides": [
            {"rolname": o.rolname, "datname": o.datname, "setting": o.setting}
            for o in hygiene.overrides
        ],
        "risky_statements": statements_json(hygiene.statements),
    }


def print_report(checked: Checked, out: TextIO) -> None:
    assert checked.snapshot is not None
    assert checked.forensics is not None
    _header(checked, out)
    print_forensics(checked.forensics, out)
    _registered_keys(checked, out)
    _well_known_keys(checked, out)
    _top_applications(checked, out)
    if checked.hygiene is not None:
        print_hygiene(checked.snapshot, checked.hygiene, out)
    out.write("\n")


def report_json(checked: Checked) -> dict[str, Any]:
    """One target as `check --format json` prints it."""
    if checked.error is not None:
        return {"target": checked.name, "error": checked.error}
    snapshot, forensics = checked.snapshot, checked.forensics
    assert snapshot is not None
    assert forensics is not None
    return {
        "target": checked.name,
        "server_version": snapshot.server_version,
        "can_read_all_stats": snapshot.can_read_all_stats,
        "grant": checked.grant,
        "lock_table_entries": snapshot.lock_table_entries,
        "lock_table_capacity": snapshot.lock_table_capacity,
        "backend_table_entries_max": snapshot.backend_table_entries_max,
        "max_locks_per_transaction": snapshot.capacity_settings.max_locks_per_transaction,
        **forensics_json(forensics),
        **({} if checked.hygiene is None else {"hygiene": hygiene_json(snapshot, checked.hygiene)}),
    }


def check_target(target: TargetSettings, pool: CollectionPool, watchdog: Watchdog) -> Checked:
    """One target as a scrape reads it, once: a collection of its own server (the statement,
    the holds, the poolers), then on the same connection the forensics read as /locks makes
    it and the settings' overrides; pg_stat_statements as the daemon reads it, on a
    connection of its own, so that no slow read of it can fail the check."""
    # The one rare read of pg_stat_statements is check's own, not the collection's.
    quiet = target.collection.model_copy(update={"statements_interval": 0.0})
    server = Server(
        target.model_copy(update={"collection": quiet}),
        pool,
        watchdog,
        Directory(),
        announce=False,
    )
    try:
        pending = server.begin(urgent=True)
        collection = pending if isinstance(pending, Collection) else pending.result()
        if collection.snapshot is None:
            return Checked(target.name, error=_check_error(collection))
        deadline = target.collection.collection_deadline
        forensics = answer_kept(
            target, server, watchdog, lambda: collection.holds, collection.poolers
        )
        overrides = server.between_collections(
            lambda reading: read_overrides(reading.conn), deadline
        )
    except Unanswered as exc:
        return Checked(target.name, error=str(exc))
    finally:
        server.close()
    statements = read_once(target, watchdog) if target.collection.statements_interval else None
    return Checked(
        target.name,
        server.role,
        collection.snapshot,
        server.registry,
        forensics,
        Hygiene(overrides, statements),
        holds=collection.holds,
        rules=target.collection.rewrite_rules,
    )


def _check_error(collection: Collection) -> str:
    """Why the collection failed, as a one-shot command says it: at a full lock table, that
    no new session can start, and that a running exporter can still read."""
    error = collection.error or "no snapshot"
    if collection.refused_for_full_table:
        return FULL_TABLE_NO_SESSION + error.removeprefix(FULL_TABLE_REFUSAL)
    return error


def run_check(config: Config, out: TextIO = sys.stdout, output: str = "text") -> int:
    watchdog, pool = Watchdog(), CollectionPool(1)
    results = []
    try:
        for target in config.targets:
            checked = check_target(target, pool, watchdog)
            results.append(checked)
            if output == "text":  # as each target is read: a person watches it come
                if checked.error is not None:
                    out.write(f"Target {checked.name}: cannot collect: {checked.error}\n\n")
                else:
                    print_report(checked, out)
    finally:
        pool.shutdown()
    if output == "json":
        out.write(json.dumps([report_json(checked) for checked in results], indent=2) + "\n")
    return 0 if all(checked.error is None for checked in results) else EXIT_UNREACHABLE
