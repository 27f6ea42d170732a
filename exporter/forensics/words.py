"""How check (text.py) and /locks (page_html.py, page_json.py) spell what both show."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import UTC, datetime

from pg_advisory_exporter.collect.pg_stat_statements import RiskyStatement, StatementsRead
from pg_advisory_exporter.collect.vocabulary import NOTHING
from pg_advisory_exporter.hygiene.risky import SAFE_FORM, WHAT, Rule

from .model import Backend


def blank(value: object) -> str:
    """A value as shown: NOTHING where there is none."""
    return NOTHING if value is None or value == "" else str(value)


def unix_time(value: float) -> str:
    """A Unix time as an ISO 8601 moment in UTC, to the second."""
    return datetime.fromtimestamp(value, UTC).isoformat(timespec="seconds")


def pids(found: Iterable[int], separator: str) -> str:
    """Backends by pid, in their order; NOTHING for none. check's text tables join them with
    a bare comma, to keep their columns narrow."""
    return separator.join(str(pid) for pid in found) or NOTHING


def pool(backend: Backend, stranded: str, escape: Callable[[str], str] = str) -> str:
    """The pool that owns the backend, in words (`escape`d), then `stranded` where its session
    locks are stranded there; NOTHING where no pooler owns it."""
    if backend.pool is None:
        return NOTHING
    return escape(backend.pool) + (f" {stranded}" if backend.stranded else "")


def set_as(backend: Backend) -> str | None:
    """Its application_name as the client set it, where a rewrite changed it (the series and
    both pages name it as rewritten)."""
    return None if backend.series_name == backend.application_name else backend.application_name


def judged(backend: Backend) -> str:
    """What a holder's state says of it in `check`'s table: a likely leak, or an application
    idle by design (its entry named), or nothing."""
    if backend.leak_suspect:
        return " LEAKED?"
    return f" (by design: {backend.idle_by_design})" if backend.idle_by_design else ""


def first_key(backend: Backend) -> tuple[str, str]:
    """The first key it holds, with how many more, and that key's name."""
    held = backend.held
    if not held:
        return NOTHING, NOTHING
    more = backend.held_entries - 1
    return str(held[0].key) + (f" (+{more} more)" if more > 0 else ""), blank(held[0].key_name)


def rules(found: RiskyStatement) -> str:
    """The rules a risky statement breaks."""
    return ", ".join(sorted(found.rules))


def rules_broken(read: StatementsRead) -> list[Rule]:
    """Every rule that a risky statement shown breaks, each once: those whose advice follows."""
    return sorted({rule for found in read.risky for rule in found.rules})


def advice(rule: Rule) -> str:
    """What is wrong with breaking `rule`, and the safe form."""
    return f"{WHAT[rule]} Safe form: {SAFE_FORM[rule]}"


def not_judged(read: StatementsRead) -> str:
    """How many texts were not judged, by reason ("" where every one was)."""
    return ", ".join(f"{n} {reason}" for reason, n in sorted(read.skipped.items()) if n)
