"""The /locks page of one target: its forensics as JSON, or as a self-contained HTML page,
rendered once per answer and format for every request that gets the answer."""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from .forensics import Answer, Backend, ContendedKey, Forensics, LockEntry, Waiter
from .keys import BIGINT_KEY
from .vocabulary import format_age

# Every value on the page comes from the server, and clients choose their own
# application_name and query text: each is escaped, and the page may run no script at all.
CONTENT_SECURITY_POLICY = "default-src 'none'; style-src 'unsafe-inline'"


def _time(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _unix(value: float) -> str:
    return datetime.fromtimestamp(value, UTC).isoformat(timespec="seconds")


def _lock(lock: LockEntry) -> dict[str, Any]:
    found: dict[str, Any] = {
        "key": str(lock.key),
        "key_form": "bigint" if lock.key.objsubid == BIGINT_KEY else "int pair",
        "key_parts": list(lock.key.parts),
        "key_name": lock.key_name,
        "key_source": None
        if lock.key_name is None
        else ("catalog" if lock.catalog else "registry"),
        "mode": lock.mode,
        "granted": lock.granted,
    }
    if not lock.granted:
        found["wait_start"] = _time(lock.wait_start)
        found["wait_seconds"] = lock.wait_seconds
    return found


def _backend(backend: Backend, query_text: bool) -> dict[str, Any]:
    pooled = backend.pooled
    found: dict[str, Any] = {
        "pid": backend.pid,
        "datname": backend.datname,
        "application_name": backend.application_name,
        "client_addr": backend.client_addr,
        "client_port": backend.client_port,
        "backend_start": _time(backend.backend_start),
        "state": backend.state_word,
        "state_seconds": backend.state_seconds,
        "xact_start": _time(backend.xact_start),
        "session_level": backend.session_level,
        "pooler": None
        if pooled is None
        else {
            "name": pooled.pooler,
            "pool": pooled.pool,
            "pool_mode": pooled.pool_mode,
            "stranded": backend.stranded,
        },
        "terminate": backend.terminate,
    }
    if query_text:  # absent, not null, where it is off: nothing was read
        found["query"] = backend.query
    return found


def _waiter(waiter: Waiter, query_text: bool) -> dict[str, Any]:
    return {
        **_backend(waiter.backend, query_text),
        "awaits": _lock(waiter.lock),
        "blocked_by": list(waiter.blocked_by),
        "queued_behind": list(waiter.queued_behind),
    }


def _holder(backend: Backend, query_text: bool) -> dict[str, Any]:
    return {
        **_backend(backend, query_text),
        "held_entries": backend.held_entries,
        "locks": [_lock(lock) for lock in backend.held],
        "locks_left_out": backend.held_left_out,
    }


def _contended(key: ContendedKey) -> dict[str, Any]:
    return {
        "datname": key.datname,
        "key": str(key.key),
        "key_name": key.key_name,
        "holders": [{"pid": pid, "mode": mode} for pid, mode in key.holders],
        "waiters": [{"pid": pid, "mode": mode} for pid, mode in key.waiters],
    }


def forensics_json(forensics: Forensics) -> dict[str, Any]:
    """The holders, waiters and contended keys, as /locks and `check --format json` give them."""
    return {
        "read_at": _unix(forensics.read_at),
        "query_text": forensics.query_text,
        "backends_total": forensics.backends_total,
        "backends_left_out": forensics.backends_left_out,
        "waiters": [_waiter(w, forensics.query_text) for w in forensics.waiters],
        "holders": [_holder(b, forensics.query_text) for b in forensics.holders],
        "contended_keys": [_contended(key) for key in forensics.contended],
        "poolers": [{"name": view.name, "error": view.error} for view in forensics.poolers],
    }


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _json_value(value: Any) -> str:
    # A list's items one call each: the C encoder holds the GIL for all of one call, and a
    # list of 500 backends would hold up /metrics and liveness meanwhile.
    if isinstance(value, list):
        return "[" + ",".join(_compact(item) for item in value) + "]"
    return _compact(value)


def _json_parts(forensics: Forensics) -> tuple[str, str]:
    """The JSON document of /locks, compact, before and after its age_seconds."""
    fields = "".join(
        f",{_compact(name)}:{_json_value(value)}"
        for name, value in forensics_json(forensics).items()
    )
    return '{"target":' + _compact(forensics.target) + ',"age_seconds":', fields + "}"


# -- HTML ----------------------------------------------------------------------------------

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #1d1d1f; background: #fff; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.6em; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.9em; }
th, td { border: 1px solid #c8c8cc; padding: 0.3em 0.6em; text-align: left;
         vertical-align: top; }
th { background: #e8eef7; }
tr:nth-child(even) td { background: #f7f7f9; }
code { font-family: ui-monospace, monospace; white-space: pre-wrap; word-break: break-all; }
code.statement { white-space: nowrap; word-break: normal; }
.note { color: #55555a; } .warn { color: #a01010; font-weight: bold; }
"""


def _e(value: object) -> str:
    return html.escape("-" if value is None or value == "" else str(value))


def _moment(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat(sep=" ", timespec="seconds")


def _key(lock: LockEntry) -> str:
    name = "" if lock.key_name is None else f" ({html.escape(lock.key_name)})"
    return f"<code>{_e(lock.key)}</code>{name}"


def _pooler(backend: Backend) -> str:
    if backend.pool is None:
        return "-"
    return _e(backend.pool) + (' <span class="warn">stranded</span>' if backend.stranded else "")


def _pids(pids: Iterable[int]) -> str:
    return ", ".join(str(pid) for pid in pids) or "-"


def _table(headings: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headings)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>\n" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead>\n<tbody>\n{body}</tbody></table>\n"


def _query(backend: Backend, query_text: bool) -> list[str]:
    return [f"<code>{_e(backend.query)}</code>"] if query_text else []


def _waiters_table(forensics: Forensics) -> str:
    if not forensics.waiters:
        return '<p class="note">Nobody waits for an advisory lock.</p>\n'
    headings = ["PID", "Blocked by", "Queued behind", "Key", "Mode", "Waiting", "Database",
                "Application", "Client", "Pooler", "State"]  # fmt: skip
    headings += ["Query"] * forensics.query_text + ["To end it"]
    rows = [
        [
            _e(w.backend.pid),
            f"<strong>{_pids(w.blocked_by)}</strong>",
            _pids(w.queued_behind),
            _key(w.lock),
            _e(w.lock.mode),
            _e(format_age(w.lock.wait_seconds)),
            _e(w.backend.datname),
            _e(w.backend.application_name),
            _e(w.backend.client or "-"),
            _pooler(w.backend),
            _e(w.backend.state_word),
            *_query(w.backend, forensics.query_text),
            f'<code class="statement">{_e(w.backend.terminate)}</code>',
        ]
        for w in forensics.waiters
    ]
    return _table(headings, rows)


def _held(backend: Backend) -> str:
    keys = ", ".join(f"{_key(lock)} {_e(lock.mode)}" for lock in backend.held)
    if backend.held_left_out:
        keys += f' <span class="note">and {backend.held_left_out:,} more</span>'
    return keys


def _holders_table(forensics: Forensics) -> str:
    holders = forensics.holders
    if not holders:
        return '<p class="note">Nobody holds an advisory lock.</p>\n'
    headings = ["PID", "Entries", "Keys", "Level", "Database", "Application", "Client",
                "Pooler", "Backend start", "State", "In state", "Transaction start"]  # fmt: skip
    headings += ["Query"] * forensics.query_text + ["To end it"]
    rows = [
        [
            _e(b.pid),
            _e(f"{b.held_entries:,}"),
            _held(b),
            _e(b.level),
            _e(b.datname),
            _e(b.application_name),
            _e(b.client or "-"),
            _pooler(b),
            _e(_moment(b.backend_start)),
            _e(b.state_word),
            _e(format_age(b.state_seconds)),
            _e(_moment(b.xact_start)),
            *_query(b, forensics.query_text),
            f'<code class="statement">{_e(b.terminate)}</code>',
        ]
        for b in holders
    ]
    return _table(headings, rows)


def _contended_table(forensics: Forensics) -> str:
    if not forensics.contended:
        return '<p class="note">No key is awaited.</p>\n'
    rows = [
        [
            _e(key.datname),
            f"<code>{_e(key.key)}</code>",
            _e(key.key_name),
            _e(", ".join(f"{pid} ({mode})" for pid, mode in key.holders) or "-"),
            _e(", ".join(f"{pid} ({mode})" for pid, mode in key.waiters)),
        ]
        for key in forensics.contended
    ]
    return _table(["Database", "Key", "Name", "Holders", "Waiters"], rows)


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


def _html_parts(forensics: Forensics) -> tuple[str, str]:
    """The HTML page, before and after its age."""
    target = html.escape(forensics.target)
    notes = [
        f"Read at {_e(_unix(forensics.read_at))} ({_AGE} ago); "
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
        + f"<h2>Waiters ({len(forensics.waiters)})</h2>\n{_waiters_table(forensics)}"
        + f"<h2>Holders ({len(forensics.holders)})</h2>\n{_holders_table(forensics)}"
        + f"<h2>Contended keys ({len(forensics.contended)})</h2>\n{_contended_table(forensics)}"
        + '<p class="note">"Level": a backend outside any transaction holds only '
        "session-level locks; inside one, pg_locks cannot tell session from transaction "
        'level. "To end it" is shown, never run.</p>\n'
    )
    before, _, after = _document(f"Advisory locks of {forensics.target}", body).partition(_AGE)
    return before, after


def _error_html(target: str, error: str) -> str:
    body = (
        f"<h1>Advisory locks of <code>{html.escape(target)}</code></h1>\n"
        f'<p class="warn">Cannot read the server: {html.escape(error)}</p>\n'
    )
    return _document(f"Advisory locks of {target}", body)


@dataclass(frozen=True)
class Page:
    """One answer's page in one format, as bytes. The age of the answer, the one part that
    changes from one request to the next, goes between `parts` (an error has no age)."""

    status: str
    content_type: str
    parts: tuple[bytes, ...]
    as_json: bool

    def body(self, age: float) -> list[bytes]:
        """The chunks to send: the parts themselves, never a copy of them per request."""
        if len(self.parts) == 1:
            return list(self.parts)
        before, after = self.parts
        written = _compact(round(age, 3)) if self.as_json else _e(format_age(age))
        return [before, written.encode(), after]


def render(target: str, answer: Answer, as_json: bool) -> Page:
    """The page of `answer`; `target` names it where the answer is an error."""
    forensics = answer.forensics
    if forensics is None:
        if as_json:
            error = _compact({"target": target, "error": answer.error})
            return Page(_UNAVAILABLE, "application/json", (error.encode(),), as_json)
        page = _error_html(target, answer.error or "")
        return Page(_UNAVAILABLE, _HTML, (page.encode(),), as_json)
    if as_json:
        parts, content_type = _json_parts(forensics), "application/json"
    else:
        parts, content_type = _html_parts(forensics), _HTML
    return Page("200 OK", content_type, tuple(part.encode() for part in parts), as_json)


_UNAVAILABLE = "503 Service Unavailable"
_HTML = "text/html; charset=utf-8"
