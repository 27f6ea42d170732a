"""One read's forensics as check prints them: waiters, holders, contended keys, statements."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TextIO

from pg_advisory_exporter.collect.pg_stat_statements import StatementsRead
from pg_advisory_exporter.collect.snapshot import grant_read_all_stats
from pg_advisory_exporter.collect.vocabulary import NOTHING, format_age, format_held, state_word

from . import words
from .model import LEAK_AFTER, Backend, Forensics

_MOST_ROWS = 20  # of holders and of waiters; the report says how many it left out
_WAITER_COLUMNS = ("PID", "DATABASE", "APPLICATION", "WAITING", "KEY", "NAME", "MODE",
                   "BLOCKED BY", "QUEUED BEHIND", "CLIENT", "POOLER")  # fmt: skip
_HOLDER_COLUMNS = ("PID", "DATABASE", "APPLICATION", "STATE", "IN STATE", "HELD FOR", "KEY",
                   "NAME", "CLIENT", "POOLER", "LEVEL")  # fmt: skip


def table(rows: Sequence[Sequence[str]], out: TextIO) -> None:
    """`rows` (its headings first) under a section's heading, each column as wide as its
    widest cell, no line ending in spaces."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True))
        out.write(f"    {cells.rstrip()}\n")


def _left_out(count: int, out: TextIO) -> None:
    if count > _MOST_ROWS:
        out.write(f"    ... and {count - _MOST_ROWS} more\n")


def _application(backend: Backend) -> str:
    """Its name as the series give it, and as the client set it where a rewrite changed it."""
    name = repr(backend.series_name)
    raw = words.set_as(backend)
    return name if raw is None else f"{name} (set as {raw!r})"


def print_forensics(forensics: Forensics, out: TextIO) -> None:
    """The waiters, the holders and the contended keys, a section each."""
    _waiters(forensics, out)
    _holders(forensics, out)
    _callers(forensics, out)
    _contended(forensics, out)
    _table_holders(forensics, out)


def _waiters(forensics: Forensics, out: TextIO) -> None:
    waiters = forensics.waiters
    out.write(f"\n  Waiters ({len(waiters)}), the longest first\n")
    if waiters:
        table(
            [_WAITER_COLUMNS]
            + [
                (
                    str(w.backend.pid),
                    w.backend.datname,
                    _application(w.backend),
                    format_age(w.lock.wait_seconds),
                    str(w.lock.key),
                    words.blank(w.lock.key_name),
                    w.lock.mode,
                    words.pids(w.blocked_by, ","),
                    words.pids(w.queued_behind, ","),
                    words.blank(w.backend.client),
                    words.pool(w.backend, "STRANDED"),
                )
                for w in waiters[:_MOST_ROWS]
            ],
            out,
        )
        _left_out(len(waiters), out)


def _holders(forensics: Forensics, out: TextIO) -> None:
    holders = forensics.holders
    out.write(
        f"\n  Holders ({len(holders)}): those of awaited keys first, then the longest in "
        "their state; LEAKED?: idle over the leak alert's "
        f"{format_age(LEAK_AFTER)}\n"
    )
    if holders:
        table(
            [_HOLDER_COLUMNS]
            + [
                (
                    str(b.pid),
                    b.datname,
                    _application(b),
                    b.state_word + words.judged(b),
                    format_age(b.state_seconds),
                    format_held(b.held_seconds, b.held_at_least),
                    *words.first_key(b),
                    words.blank(b.client),
                    words.pool(b, "STRANDED"),
                    b.level,
                )
                for b in holders[:_MOST_ROWS]
            ],
            out,
        )
        _left_out(len(holders), out)
    if forensics.backends_left_out:
        out.write(f"    ({forensics.backends_left_out} more backends were not read)\n")
    for view in forensics.poolers:
        if view.error is not None:
            out.write(f"    pooler {view.name} could not be read: {view.error}\n")


def _callers(forensics: Forensics, out: TextIO) -> None:
    """The callers that the last statements of the waiters and holders listed name, a line
    each after the tables: a column of them would make every row as wide as the widest."""
    listed = [w.backend for w in forensics.waiters[:_MOST_ROWS]]
    listed += forensics.holders[:_MOST_ROWS]
    seen: set[int] = set()
    rows = []
    for backend in listed:
        if backend.caller is not None and backend.pid not in seen:
            seen.add(backend.pid)
            rows.append((str(backend.pid), backend.caller.text))
    if rows:
        out.write("\n  Callers, from the annotations of their last statements\n")
        table([("PID", "CALLER"), *rows], out)


def _contended(forensics: Forensics, out: TextIO) -> None:
    if not forensics.contended:
        return
    out.write(f"\n  Contended keys ({len(forensics.contended)})\n")
    table(
        [("KEY", "NAME", "DATABASE", "HOLDERS", "WAITERS")]
        + [
            (
                str(key.key),
                words.blank(key.key_name),
                key.datname,
                ",".join(f"{pid}:{mode}" for pid, mode in key.holders) or NOTHING,
                ",".join(f"{pid}:{mode}" for pid, mode in key.waiters),
            )
            for key in forensics.contended
        ],
        out,
    )


def _table_holders(forensics: Forensics, out: TextIO) -> None:
    """Who holds the most of the shared lock table, whatever they lock."""
    if not forensics.table_holders:
        return
    out.write("\n  Most lock table entries, all lock types\n")
    table(
        [("PID", "ENTRIES", "DATABASE", "APPLICATION", "STATE", "TO END IT")]
        + [
            (
                str(holder.pid),
                f"{holder.entries:,}",
                holder.datname,
                repr(holder.application_name),
                state_word(holder.state, False),
                holder.terminate,
            )
            for holder in forensics.table_holders
        ],
        out,
    )


def print_statements(read: StatementsRead | None, out: TextIO) -> None:
    """The risky statements of the server's last read of pg_stat_statements (hygiene.md)."""
    if read is None:
        out.write("    Risky statements: not read (statements_interval is 0)\n")
        return
    if read.error is not None:
        out.write(f"    Risky statements: pg_stat_statements cannot be read: {read.error}\n")
        return
    shown = f", the first {len(read.risky)} shown" if read.risky_total > len(read.risky) else ""
    out.write(
        f"    Risky statements in pg_stat_statements ({read.risky_total}{shown}), most called "
        "first\n"
    )
    if not read.reads_all:
        out.write("    (only the role's own statements: " + grant_read_all_stats(read.role) + ")\n")
    not_judged = words.not_judged(read)
    if not_judged:
        out.write(f"    Not judged: {not_judged}\n")
    if not read.risky:
        return
    table(
        [("RULES", "DATABASE", "USER", "CALLS", "STATEMENT")]
        + [(words.rules(r), r.datname, r.rolname, f"{r.calls:,}", r.text) for r in read.risky],
        out,
    )
    for rule in words.rules_broken(read):
        out.write(f"    {rule}: {words.advice(rule)}\n")
