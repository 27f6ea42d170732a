"""`pg-advisory-exporter check`: one collection, printed for a person at a terminal."""

from __future__ import annotations

import sys
import threading
from collections import defaultdict
from collections.abc import Sequence
from typing import Any, TextIO

import psycopg

from . import catalog
from .capacity import lock_table_capacity
from .config import Config, TargetConfig, redact
from .connection import CannotCollect, interrupt, open_session
from .metrics import IDLE_STATES, counted_uses, key_groups, state_label
from .registry import Registry
from .scheduling import Watchdog
from .snapshot import BackendLocks, ServerSnapshot, read_snapshot

EXIT_UNREACHABLE = 1
_TOP_APPLICATIONS = 10
_MOST_ROWS = 20  # of idle holders and of waiters; the report says how many it left out


def format_seconds(seconds: float | None) -> str:
    """3725.4 -> "1h2m5s"; None -> "unknown"."""
    if seconds is None:
        return "unknown"
    whole = int(seconds)
    if whole < 60:
        return f"{seconds:.1f}s"
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [(days, "d"), (hours, "h"), (minutes, "m"), (secs, "s")]
    first = next(i for i, (value, _) in enumerate(parts) if value)
    return "".join(f"{value}{unit}" for value, unit in parts[first:] if value)


def _table(rows: Sequence[Sequence[str]], out: TextIO) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True))
        out.write(f"    {cells.rstrip()}\n")


def _left_out(count: int, out: TextIO) -> None:
    if count > _MOST_ROWS:
        out.write(f"    ... and {count - _MOST_ROWS} more\n")


def _key_level(backend: BackendLocks) -> str:
    # Outside a transaction only session-level locks can be held; inside, pg_locks
    # cannot tell the two kinds apart.
    return "session" if not backend.in_transaction else "session or transaction"


def _keys(backend: BackendLocks) -> str:
    if backend.held_key is None:
        return "-"
    more = backend.held - 1
    return str(backend.held_key) + (f" (+{more} more)" if more > 0 else "")


def _registered(backend: BackendLocks, registry: Registry, *, awaited: bool) -> str:
    names = [
        key.name
        for key, use in counted_uses(backend, registry)
        if (use.awaited if awaited else use.held)
    ]
    return ", ".join(names) or "-"


def _header(name: str, role: str, snapshot: ServerSnapshot, out: TextIO) -> None:
    capacity = lock_table_capacity(snapshot.capacity_settings)
    out.write(f"Target {name}: PostgreSQL {snapshot.server_version}\n")
    if snapshot.can_read_all_stats:
        out.write("  Privileges: the role can read every session's state\n")
    else:
        out.write(
            f'  Privileges: MISSING. Run GRANT pg_read_all_stats TO "{role}"; until then states '
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


def _idle_holders(snapshot: ServerSnapshot, registry: Registry, out: TextIO) -> None:
    idle = sorted(
        (b for b in snapshot.backends if b.held and state_label(b) in IDLE_STATES),
        key=lambda b: -(b.state_seconds or 0.0),
    )
    out.write(f"\n  Idle holders ({len(idle)}): sessions holding advisory locks between queries\n")
    if idle:
        _table(
            [("PID", "DATABASE", "APPLICATION", "STATE", "AGE", "KEY", "REGISTERED", "LEVEL")]
            + [
                (
                    str(b.pid),
                    b.datname,
                    repr(b.application_name),
                    state_label(b),
                    format_seconds(b.state_seconds),
                    _keys(b),
                    _registered(b, registry, awaited=False),
                    _key_level(b),
                )
                for b in idle[:_MOST_ROWS]
            ],
            out,
        )
        _left_out(len(idle), out)


def _waiters(snapshot: ServerSnapshot, registry: Registry, out: TextIO) -> None:
    waiters = sorted(
        (b for b in snapshot.backends if b.waiting), key=lambda b: -(b.wait_seconds or 0.0)
    )
    out.write(f"\n  Waiters ({len(waiters)})\n")
    if waiters:
        _table(
            [("PID", "DATABASE", "APPLICATION", "WAITING", "KEY", "REGISTERED", "MODE")]
            + [
                (
                    str(b.pid),
                    b.datname,
                    repr(b.application_name),
                    format_seconds(b.wait_seconds),
                    str(b.awaited_key) if b.awaited_key else "-",
                    _registered(b, registry, awaited=True),
                    (b.awaited_mode or "").removesuffix("Lock").lower(),
                )
                for b in waiters[:_MOST_ROWS]
            ],
            out,
        )
        _left_out(len(waiters), out)


def _registered_keys(snapshot: ServerSnapshot, registry: Registry, out: TextIO) -> None:
    own = [key for key in registry.keys if not key.catalog]
    if not own:
        return
    groups = key_groups(snapshot, registry)
    out.write(f"\n  Registered keys ({len(own)})\n")
    rows = [("KEY", "DATABASE", "HOLDERS", "WAITERS", "HELD FOR", "LIMIT")]
    for key in own:
        limit = format_seconds(key.config.max_hold) if key.config.max_hold else "-"
        found = [(datname, group) for (datname, name), group in groups.items() if name == key.name]
        for datname, group in found:
            held_for = format_seconds(group.hold_max) if group.holders else "-"
            rows.append(
                (key.name, datname, str(group.holders), str(group.waiters), held_for, limit)
            )
        if not found:
            rows.append((key.name, "-", "0", "0", "-", limit))
    _table(rows, out)


def _well_known_keys(snapshot: ServerSnapshot, registry: Registry, out: TextIO) -> None:
    """The catalog's keys that someone holds or awaits (they are many, and mostly idle)."""
    names = {key.name for key in registry.keys if key.catalog}
    if not names:
        return
    in_use = [
        (datname, name, group)
        for (datname, name), group in key_groups(snapshot, registry).items()
        if name in names and (group.holders or group.waiters)
    ]
    out.write(f"\n  Well-known keys in use ({len(in_use)})\n")
    if in_use:
        _table(
            [("KEY", "DATABASE", "HOLDERS", "WAITERS", "HELD FOR", "LIBRARY")]
            + [
                (
                    name,
                    datname,
                    str(group.holders),
                    str(group.waiters),
                    format_seconds(group.hold_max) if group.holders else "-",
                    catalog.BY_NAME[name].library,
                )
                for datname, name, group in in_use
            ],
            out,
        )


def _top_applications(snapshot: ServerSnapshot, out: TextIO) -> None:
    apps: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0])
    for b in snapshot.backends:
        totals = apps[b.datname, b.application_name]
        totals[0] += b.held
        totals[1] += b.held > 0
        totals[2] += b.waiting
    top = sorted(apps.items(), key=lambda item: (-item[1][0], item[0]))[:_TOP_APPLICATIONS]
    out.write(f"\n  Top applications by advisory locks held ({len(apps)} in all)\n")
    if top:
        _table(
            [("DATABASE", "APPLICATION", "LOCKS", "HOLDERS", "WAITERS")]
            + [
                (datname, repr(app), f"{held:,}", str(holders), str(waiting))
                for (datname, app), (held, holders, waiting) in top
            ],
            out,
        )


def print_report(
    name: str, role: str, snapshot: ServerSnapshot, registry: Registry, out: TextIO
) -> None:
    _header(name, role, snapshot, out)
    _idle_holders(snapshot, registry, out)
    _waiters(snapshot, registry, out)
    _registered_keys(snapshot, registry, out)
    _well_known_keys(snapshot, registry, out)
    _top_applications(snapshot, out)
    out.write("\n")


def check_target(target: TargetConfig, out: TextIO, watchdog: Watchdog) -> bool:
    assert target.collection is not None
    deadline = target.collection.scrape_wait
    conninfo = target.dsn
    opened: list[psycopg.Connection[Any]] = []
    expired = threading.Event()

    def expire() -> None:  # a stopped backend or a hung proxy: give up, as the daemon does
        expired.set()
        for conn in opened:
            interrupt(conn)

    alarm = watchdog.arm(deadline, expire)
    try:
        conninfo = target.conninfo()
        entries = catalog.selected(target.catalog)
        session = open_session(
            conninfo, target.collection, target.keys, opened.append, entries=entries
        )
        try:
            snapshot = read_snapshot(session.conn, session.registry, with_keys=True)
        finally:
            watchdog.disarm(alarm)
            session.conn.close()
    except (psycopg.Error, CannotCollect, ValueError) as exc:
        watchdog.disarm(alarm)
        error = f"no answer within {deadline:g}s" if expired.is_set() else str(exc).strip()
        out.write(f"Target {target.name}: cannot collect: {redact(error, conninfo)}\n\n")
        return False
    print_report(target.name, session.role, snapshot, session.registry, out)
    return True


def run_check(config: Config, out: TextIO = sys.stdout) -> int:
    watchdog = Watchdog()
    results = [check_target(target, out, watchdog) for target in config.targets]
    return 0 if all(results) else EXIT_UNREACHABLE
