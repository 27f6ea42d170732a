"""The JSON document of one read, for /locks and check --format json, in parts around its age."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from pg_advisory_exporter.collect import vocabulary
from pg_advisory_exporter.collect.pg_stat_statements import StatementsRead
from pg_advisory_exporter.hygiene.callers import Caller
from pg_advisory_exporter.hygiene.risky import RULES, SAFE_FORM, WHAT
from pg_advisory_exporter.keys.key import BIGINT_KEY

from . import words
from .glance import ChainNode, blocking_chains, held_per_group
from .model import Backend, ContendedKey, Forensics, LockEntry, Waiter


def _time(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _source(lock: LockEntry) -> str | None:
    """Where the key's name comes from: the catalog, the registry, or the key itself."""
    if lock.key_name is None:
        return None
    return "catalog" if lock.catalog else "packed" if lock.packed else "registry"


def _lock(lock: LockEntry) -> dict[str, Any]:
    found: dict[str, Any] = {
        "key": str(lock.key),
        "key_form": "bigint" if lock.key.objsubid == BIGINT_KEY else "int pair",
        "key_parts": list(lock.key.parts),
        "key_name": lock.key_name,
        "key_source": _source(lock),
        "mode": lock.mode,
        "granted": lock.granted,
    }
    if lock.held_seconds is not None:
        found["held_seconds"] = lock.held_seconds
    if not lock.granted:
        found["wait_start"] = _time(lock.wait_start)
        found["wait_seconds"] = lock.wait_seconds
    return found


def _caller(caller: Caller | None) -> dict[str, Any] | None:
    if caller is None:
        return None
    return {
        "text": caller.text,
        "styles": list(caller.styles),
        "tags": [[key, value] for key, value in caller.tags],
    }


def _backend(backend: Backend, query_text: bool) -> dict[str, Any]:
    pooled = backend.pooled
    found: dict[str, Any] = {
        "pid": backend.pid,
        "datname": backend.datname,
        "application_name": backend.series_name,
        "application_name_raw": backend.application_name,
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
        "caller": _caller(backend.caller),
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
        "held_seconds": backend.held_seconds,
        "held_at_least": backend.held_at_least,
        "leak_suspect": backend.leak_suspect,
        "idle_by_design": backend.idle_by_design or None,
        "locks": [_lock(lock) for lock in backend.held],
        "locks_left_out": backend.held_left_out,
        "key_groups": [{"group": g, "locks": n} for g, n in held_per_group(backend)],
    }


def _chain(node: ChainNode, names: Mapping[int, str]) -> dict[str, Any]:
    return {
        "pid": node.pid,
        "application_name": names.get(node.pid),
        "awaits": None if node.waiter is None else _lock(node.waiter.lock),
        "queued": node.queued,
        "repeat": node.repeat,
        "waiters": [_chain(child, names) for child in node.waiters],
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
    """The holders, waiters and contended keys, as /locks and `check --format json` give them
    (/locks adds the risky statements; check gives its own in its hygiene section)."""
    names = {b.pid: b.series_name for b in forensics.backends}
    return {
        "read_at": words.unix_time(forensics.read_at),
        "query_text": forensics.query_text,
        "backends_total": forensics.backends_total,
        "backends_left_out": forensics.backends_left_out,
        "waiters": [_waiter(w, forensics.query_text) for w in forensics.waiters],
        "holders": [_holder(b, forensics.query_text) for b in forensics.holders],
        "contended_keys": [_contended(key) for key in forensics.contended],
        "blocking_chains": [_chain(root, names) for root in blocking_chains(forensics.waiters)],
        "poolers": [{"name": view.name, "error": view.error} for view in forensics.poolers],
        "lock_table_holders": [
            {
                "pid": holder.pid,
                "entries": holder.entries,
                "datname": holder.datname,
                "application_name": holder.application_name,
                "state": vocabulary.state_word(holder.state, False),
                "terminate": holder.terminate,
            }
            for holder in forensics.table_holders
        ],
    }


def statements_json(read: StatementsRead | None) -> dict[str, Any] | None:
    """The last read of pg_stat_statements: its risky statements, or why there are none
    (None: not read, or never)."""
    if read is None:
        return None
    return {
        "error": read.error,
        "reads_all_texts": read.reads_all,
        "statements": [
            {
                "datname": found.datname,
                "user": found.rolname,
                "calls": found.calls,
                "rules": sorted(found.rules),
                "statement": found.text,
            }
            for found in read.risky
        ],
        "counts": [
            {"datname": datname, "rule": rule.value, "statements": count}
            for (datname, rule), count in sorted(read.counts.items())
        ],
        "risky_total": read.risky_total,
        "skipped": dict(sorted(read.skipped.items())),
        "rules": {rule.value: {"what": WHAT[rule], "safe_form": SAFE_FORM[rule]} for rule in RULES},
    }


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _json_value(value: Any) -> str:
    # A list's items one call each: the C encoder holds the GIL for all of one call, and a
    # list of 500 backends would hold up /metrics and liveness meanwhile.
    if isinstance(value, list):
        return "[" + ",".join(_compact(item) for item in value) + "]"
    return _compact(value)


def parts(forensics: Forensics) -> tuple[str, str]:
    """The JSON document of /locks, compact, before and after its age_seconds."""
    fields = "".join(
        f",{_compact(name)}:{_json_value(value)}"
        for name, value in (
            *forensics_json(forensics).items(),
            ("risky_statements", statements_json(forensics.statements)),
        )
    )
    return '{"target":' + _compact(forensics.target) + ',"age_seconds":', fields + "}"


def age(seconds: float) -> str:
    """The document's age_seconds, to the millisecond."""
    return _compact(round(seconds, 3))


def error(target: str, message: str | None) -> str:
    """The document of an answer that is an error."""
    return _compact({"target": target, "error": message})
