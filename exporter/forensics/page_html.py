"""The /locks page of one read as HTML: self-contained, no script, every value escaped."""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime

from pg_advisory_exporter.collect.pg_stat_statements import StatementsRead
from pg_advisory_exporter.collect.vocabulary import NOTHING, format_age, format_held, state_word

from . import words
from .glance import Awaited, ChainNode, awaited_locks, blocking_chains, held_per_group, split_held
from .model import LEAK_AFTER, Backend, Forensics, LockEntry

# Fits a 1,280 px window whatever the values: tables as wide as the page with fixed column
# widths, and long values (keys, names, statements) wrapped anywhere.
_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #1d1d1f; background: #fff;
       overflow-wrap: break-word; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.6em; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.9em; width: 100%;
        table-layout: fixed; }
th, td { border: 1px solid #c8c8cc; padding: 0.3em 0.6em; text-align: left;
         vertical-align: top; overflow-wrap: break-word; }
th { background: #e8eef7; }
tr:nth-child(even) td { background: #f7f7f9; }
code { font-family: ui-monospace, monospace; white-space: pre-wrap; word-break: break-all; }
code.key { white-space: nowrap; word-break: normal; }
code.statement { word-break: normal; overflow-wrap: anywhere; font-size: 0.85em; }
.note { color: #55555a; } .warn { color: #a01010; font-weight: bold; }
.line { display: block; }
ul.groups { display: inline; margin: 0; padding: 0; }
ul.groups li { display: inline; } ul.groups li + li::before { content: ", "; }
details { margin-top: 0.2em; } summary { cursor: pointer; color: #1a4f9c; }
ol.keys { margin: 0.2em 0; padding-left: 2.2em; max-height: 24em; overflow-y: auto; }
ul.chains, ul.chains ul { list-style: none; margin: 0; padding-left: 1.6em; }
ul.chains { padding-left: 0; }
ul.chains li { margin: 0.15em 0; }
ul.chains ul { border-left: 2px solid #c8c8cc; margin-left: 0.5em; }
ul.chains ul > li::before { content: "\\2190  "; color: #55555a; }
"""


def _e(value: object) -> str:
    return html.escape(words.blank(value))


_STRANDED = '<span class="warn">stranded</span>'


def _moment(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat(sep=" ", timespec="seconds")


def _key(lock: LockEntry) -> str:
    name = "" if lock.key_name is None else f" ({html.escape(lock.key_name)}"
    if lock.key_name is not None and lock.held_seconds is not None:
        name += f", held {_e(format_age(lock.held_seconds))}"
    name += ")" if name else ""
    return f'<code class="key">{_e(lock.key)}</code>{name}'


def _table(headings: Sequence[tuple[str, str]], rows: Iterable[Sequence[str]]) -> str:
    """A table of the page's width: each heading with its column's width (CSS, or "" for a
    share of what the others leave)."""
    cols = "".join(f'<col style="width:{w}">' if w else "<col>" for _, w in headings)
    head = "".join(f"<th>{html.escape(h)}</th>" for h, _ in headings)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>\n" for row in rows)
    return (
        f"<table><colgroup>{cols}</colgroup><thead><tr>{head}</tr></thead>\n"
        f"<tbody>\n{body}</tbody></table>\n"
    )


def _query(backend: Backend, query_text: bool) -> list[str]:
    return [f"<code>{_e(backend.query)}</code>"] if query_text else []


def _who(backend: Backend, started: bool = False) -> str:
    """Application, database, client, the caller its last statement names and pooler (and
    when it started), a line each."""
    lines = [_e(backend.series_name)]
    raw = words.set_as(backend)
    if raw is not None:
        lines.append(f'<span class="note">as set</span> {_e(raw)}')
    lines += [
        f'<span class="note">db</span> {_e(backend.datname)}',
        f'<span class="note">from</span> {_e(backend.client)}',
    ]
    if backend.caller is not None:
        lines.append(f'<span class="note">caller</span> {_e(backend.caller.text)}')
    if backend.pool is not None:
        lines.append(f'<span class="note">pool</span> {words.pool(backend, _STRANDED, _e)}')
    if started:
        lines.append(f'<span class="note">since</span> {_e(_moment(backend.backend_start))}')
        if backend.xact_start is not None:
            lines.append(f'<span class="note">transaction</span> {_e(_moment(backend.xact_start))}')
    return "".join(f'<span class="line">{line}</span>' for line in lines)


def _end_it(backend: Backend) -> str:
    return f'<code class="statement">{_e(backend.terminate)}</code>'


def _query_heading(forensics: Forensics) -> list[tuple[str, str]]:
    return [("Query", "")] * forensics.query_text


_WHO = ("Application, database, client", "15em")
_END_IT = ("To end it", "15.5em")


def _waiters_table(forensics: Forensics) -> str:
    if not forensics.waiters:
        return '<p class="note">Nobody waits for an advisory lock.</p>\n'
    # No "to end it": ending a waiter releases nothing; its blockers are the holders below.
    headings = [("PID", "4.5em"), ("Blocked by", "6.5em"), ("Queued behind", "6.5em"),
                ("Key", ""), ("Mode", "6.5em"), ("Waiting", "6em"), _WHO,
                ("State", "8em")]  # fmt: skip
    headings += _query_heading(forensics)
    rows = [
        [
            _e(w.backend.pid),
            f"<strong>{words.pids(w.blocked_by, ', ')}</strong>",
            words.pids(w.queued_behind, ", "),
            _key(w.lock),
            _e(w.lock.mode),
            _e(format_age(w.lock.wait_seconds)),
            _who(w.backend),
            _e(w.backend.state_word),
            *_query(w.backend, forensics.query_text),
        ]
        for w in forensics.waiters
    ]
    return _table(headings, rows)


def _keys_list(locks: Iterable[LockEntry]) -> str:
    return ", ".join(f"{_key(lock)} {_e(lock.mode)}" for lock in locks)


# The keys a holder's line shows before its disclosure (the awaited and contended ones are
# always shown, besides these).
FIRST_KEYS = 5


def _held(backend: Backend, awaited: Awaited) -> str:
    """Its keys at a glance: counts per group, the contended keys and the key it awaits,
    the first few others, and every listed key behind a disclosure (no script)."""
    groups = "".join(
        f'<li><span class="group">{_e(group)}</span>: <span class="count">{count:,}</span></li>'
        for group, count in held_per_group(backend)
    )
    summary = f'<ul class="groups">{groups}</ul>'
    if backend.held_left_out:
        summary += f'; <span class="note">{backend.held_left_out:,} more not read</span>'
    lines = [f'<span class="line summary">{summary}</span>']
    hot, rest = split_held(backend, awaited)
    if hot:
        lines.append(f'<span class="line contended"><strong>awaited by others:</strong> '
                     f"{_keys_list(hot)}</span>")  # fmt: skip
    if backend.awaited is not None:
        lines.append(f'<span class="line awaits"><strong>awaits:</strong> '
                     f"{_keys_list([backend.awaited])}</span>")  # fmt: skip
    first = rest[:FIRST_KEYS]
    if first:
        more = " …" if len(rest) > len(first) or backend.held_left_out else ""
        lines.append(f'<span class="line first">{_keys_list(first)}{more}</span>')
    if len(rest) > len(first):
        items = "".join(f"<li>{_key(lock)} {_e(lock.mode)}</li>" for lock in backend.held)
        read = f"all {len(backend.held):,} keys read"
        if backend.held_left_out:
            read += f" (of {backend.held_entries:,})"
        lines.append(f'<details><summary>{read}</summary><ol class="keys">{items}</ol></details>')
    return "".join(lines)


def _holders_table(forensics: Forensics) -> str:
    holders = forensics.holders
    if not holders:
        return '<p class="note">Nobody holds an advisory lock.</p>\n'
    awaited = awaited_locks(forensics)
    headings = [("PID", "4.5em"), ("Entries", "5.5em"), ("Keys", ""), ("State", "11em"),
                _WHO, *_query_heading(forensics), _END_IT]  # fmt: skip
    rows = [
        [
            _e(b.pid),
            _e(f"{b.held_entries:,}"),
            _held(b, awaited),
            _state(b),
            _who(b, started=True),
            *_query(b, forensics.query_text),
            _end_it(b),
        ]
        for b in holders
    ]
    return _table(headings, rows)


def _state(backend: Backend) -> str:
    """Its state and for how long, how long it has held advisory locks, and their level, a
    line each."""
    held = format_held(backend.held_seconds, backend.held_at_least)
    lines = [
        f'<span class="state">{_e(backend.state_word)}</span>',
        f'<span class="note">for</span> {_e(format_age(backend.state_seconds))}',
        f'<span class="note">held</span> <span class="held">{_e(held)}</span>',
        f'<span class="note">level</span> {_e(backend.level)}',
    ]
    if backend.leak_suspect:
        lines.append(
            f'<span class="warn leak">likely leaked: idle over {_e(format_age(LEAK_AFTER))}</span>'
        )
    elif backend.idle_by_design:
        lines.append(f'<span class="note">idle by design</span> {_e(backend.idle_by_design)}')
    return "".join(f'<span class="line">{line}</span>' for line in lines)


def _chain_item(node: ChainNode, backends: Mapping[int, Backend]) -> str:
    backend = backends.get(node.pid)
    who = "" if backend is None else f" {_e(backend.series_name)} ({_e(backend.state_word)}"
    if backend is not None:
        who += f" for {_e(format_age(backend.state_seconds))})"
    text = f"<strong>{node.pid}</strong>{who}"
    if node.waiter is not None:
        lock = node.waiter.lock
        how = "queued for" if node.queued else "awaits"
        text += f", {how} {_key(lock)} {_e(lock.mode)} for {_e(format_age(lock.wait_seconds))}"
    if node.repeat == "cycle":
        text += ' <span class="warn">waits on itself through the chain: a deadlock</span>'
    elif node.repeat == "seen":
        text += ' <span class="note">(shown above)</span>'
    elif node.repeat == "continued":
        text += ' <span class="note">(its waiters: below, from here on)</span>'
    nested = "".join(_chain_item(child, backends) for child in node.waiters)
    inner = f"<ul>{nested}</ul>" if nested else ""
    kind = f' class="{node.repeat}"' if node.repeat else ""
    return f'<li data-pid="{node.pid}"{kind}>{text}{inner}</li>\n'


def _chains(forensics: Forensics) -> str:
    roots = blocking_chains(forensics.waiters)
    if not roots:
        return '<p class="note">Nobody waits for an advisory lock.</p>\n'
    backends = {b.pid: b for b in forensics.backends}
    items = "".join(_chain_item(root, backends) for root in roots)
    return (
        '<p class="note">Each backend that holds others back, with its waiters under it '
        "(and theirs under them); a waiter held back only by earlier waiters is "
        '"queued".</p>\n'
        f'<ul class="chains">\n{items}</ul>\n'
    )


def _contended_table(forensics: Forensics) -> str:
    if not forensics.contended:
        return '<p class="note">No key is awaited.</p>\n'
    rows = [
        [
            _e(key.datname),
            f"<code>{_e(key.key)}</code>",
            _e(key.key_name),
            _e(", ".join(f"{pid} ({mode})" for pid, mode in key.holders) or NOTHING),
            _e(", ".join(f"{pid} ({mode})" for pid, mode in key.waiters)),
        ]
        for key in forensics.contended
    ]
    headings = [("Database", "12%"), ("Key", "18%"), ("Name", "15%"), ("Holders", ""),
                ("Waiters", "")]  # fmt: skip
    return _table(headings, rows)


def _table_holders_table(forensics: Forensics) -> str:
    """Who holds the most of the shared lock table, whatever they lock: when it is full, the
    backends to end."""
    if not forensics.table_holders:
        return '<p class="note">No backend holds an entry of the shared lock table.</p>\n'
    rows = [
        [
            _e(holder.pid),
            _e(f"{holder.entries:,}"),
            _e(holder.application_name),
            _e(holder.datname),
            _e(state_word(holder.state, False)),
            f'<code class="statement">{_e(holder.terminate)}</code>',
        ]
        for holder in forensics.table_holders
    ]
    headings = [("pid", "7%"), ("Entries", "9%"), ("Application", ""), ("Database", "12%"),
                ("State", "12%"), _END_IT]  # fmt: skip
    return _table(headings, rows)


def _statements_section(read: StatementsRead | None) -> str:
    """The risky statements of the server's last read of pg_stat_statements (hygiene.md)."""
    if read is None:
        return ""
    if read.error is not None:
        return (
            "<h2>Risky lock statements</h2>\n"
            f'<p class="note">pg_stat_statements cannot be read: {_e(read.error)}</p>\n'
        )
    heading = f"<h2>Risky lock statements ({read.risky_total})</h2>\n"
    notes = []
    if read.risky_total > len(read.risky):
        notes.append(f"The {len(read.risky)} most called are shown.")
    if not read.reads_all:
        notes.append("Only the monitoring role's own statements could be read (it lacks "
                     "pg_read_all_stats).")  # fmt: skip
    not_judged = words.not_judged(read)
    if not_judged:
        notes.append(f"Not judged: {not_judged}.")
    if not read.risky:
        notes.append("No statement judged breaks a rule.")
    heading += "".join(f'<p class="note">{_e(note)}</p>\n' for note in notes)
    if not read.risky:
        return heading
    rows = [
        [
            _e(words.rules(found)),
            _e(found.datname),
            _e(found.rolname),
            _e(f"{found.calls:,}"),
            f'<code class="statement">{_e(found.text)}</code>',
        ]
        for found in read.risky
    ]
    headings = [("Rule", "16%"), ("Database", "10%"), ("User", "10%"), ("Calls", "7%"),
                ("Statement", "")]  # fmt: skip
    safe = "".join(
        f"<li><code>{_e(rule)}</code>: {_e(words.advice(rule))}</li>"
        for rule in words.rules_broken(read)
    )
    return heading + _table(headings, rows) + f'<ul class="note">{safe}</ul>\n'


def _document(title: str, body: str) -> str:
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)}</title>
<style>{_STYLE}</style></head>
<body>
{body}</body></html>
"""


# Where the page's age goes, until the page is cut there: only the target's name comes before
# it, and a name cannot hold a NUL.
_AGE = "\0"


def parts(forensics: Forensics) -> tuple[str, str]:
    """The HTML page, before and after its age."""
    target = html.escape(forensics.target)
    notes = [
        f"Read at {_e(words.unix_time(forensics.read_at))} ({_AGE} ago); "
        f"{forensics.backends_total:,} backends hold or await advisory locks."
    ]
    if forensics.backends_left_out:
        notes.append(
            f'<span class="warn">{forensics.backends_left_out:,} backends are left out</span> '
            "(waiters and the holders of awaited keys are always listed)."
        )
    notes += [
        f'<span class="warn">Pooler {_e(view.name)} could not be read: {_e(view.error)}</span>'
        for view in forensics.poolers
        if view.error is not None
    ]
    body = (
        f"<h1>Advisory locks of <code>{target}</code></h1>\n"
        + "".join(f'<p class="note">{note}</p>\n' for note in notes)
        + f"<h2>Who blocks whom</h2>\n{_chains(forensics)}"
        + f"<h2>Waiters ({len(forensics.waiters)})</h2>\n{_waiters_table(forensics)}"
        + f"<h2>Holders ({len(forensics.holders)})</h2>\n{_holders_table(forensics)}"
        + f"<h2>Contended keys ({len(forensics.contended)})</h2>\n{_contended_table(forensics)}"
        + "<h2>Most lock table entries, all lock types</h2>\n"
        + _table_holders_table(forensics)
        + _statements_section(forensics.statements)
        + '<p class="note">"Held": how long a holder has held advisory locks, at least as '
        "long as the exporter has seen it hold them, and since it went idle if that was "
        'earlier ("at least": it held them when the exporter began to watch). "Level": a '
        "backend outside any transaction holds only session-level locks; inside one, "
        'pg_locks cannot tell session from transaction level. "To end it" is shown, never '
        "run, and only for holders: ending a backend that only waits releases nothing.</p>\n"
    )
    before, _, after = _document(f"Advisory locks of {forensics.target}", body).partition(_AGE)
    return before, after


def error(target: str, message: str) -> str:
    """The page of an answer that is an error."""
    body = (
        f"<h1>Advisory locks of <code>{html.escape(target)}</code></h1>\n"
        f'<p class="warn">Cannot read the server: {html.escape(message)}</p>\n'
    )
    return _document(f"Advisory locks of {target}", body)


def age(seconds: float) -> str:
    """The page's age, as the page says every other age."""
    return _e(format_age(seconds))
