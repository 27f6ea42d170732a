"""Risky advisory-lock statements in the texts pg_stat_statements keeps, recognised by
PostgreSQL's own parser (pglast, which embeds libpg_query: the server's grammar, 18) and a
walk over the tree it gives; never by matching the text, which comments and string literals
can make look like anything.

The texts are normalised (constants are `$1`, `$2`), may be cut or invalid, and are
whatever the applications sent: `Judge.judge` never raises, and a text it cannot judge is
skipped with the reason (`Skip`).

The tree is read from libpg_query's JSON (`pglast.parser.parse_sql_json`), not from
`pglast.parse_sql`'s nodes: parse_sql builds its Python nodes by a recursion in C that no
depth check guards, and a 64 KiB text of a long left-deep expression (`SELECT 1+1+...`,
25,000 terms) overflows the C stack and kills the process (pglast 8.8, measured on an
8 MiB stack). libpg_query's JSON output checks its depth against the headroom of the
calling thread's real stack and fails with "stack depth limit exceeded" instead (from
pglast 8.5; 8.4's crashes too, on a thread of 1 MiB), and the grammar's own stack stops at
10,000 open levels ("memory exhausted"). `json.loads` raises RecursionError past the
interpreter's limit (a few hundred levels of a tree); such a tree is read again without
recursion (`_decode_flat`). The JSON route is also about five times faster than parse_sql's
nodes.

The tree is read by parse_tree.py; where a lock's key comes from, by key_source.py.
"""

from __future__ import annotations

import enum
import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from pglast import parser

from .key_source import UNDOCUMENTED_HASHES, hash_keyed
from .parse_tree import (
    ADVISORY,
    ARMS,
    LOCKING,
    NO_SET_OPERATION,
    SELECT,
    Fields,
    as_list,
    function,
    node,
    walk,
)


class Rule(enum.StrEnum):
    LOCK_IN_LIMITED_SCAN = "lock_in_limited_scan"
    LOCK_IN_WHERE = "lock_in_where"
    HASHTEXT_KEY = "hashtext_key"


RULES: tuple[Rule, ...] = tuple(Rule)

WHAT: Mapping[Rule, str] = MappingProxyType(
    {
        Rule.LOCK_IN_LIMITED_SCAN: (
            "A lock function in the select list, WHERE, HAVING or join condition of a query"
            " with a LIMIT may run for rows the LIMIT then drops (the planner may evaluate it"
            " before the limit, under a sort for one), so the statement holds locks that no"
            " row it returned tells of."
        ),
        Rule.LOCK_IN_WHERE: (
            "A lock function in a WHERE or join condition runs for each row the scan"
            " examines, in an order the planner chooses, so it can lock rows that another"
            " condition then rejects, and those locks stay held with nothing to show for them."
        ),
        Rule.HASHTEXT_KEY: (
            "The key comes from hashtext(), which is undocumented, only 32 bits wide (two"
            " keys collide more likely than not past about 77,000 keys) and whose output has"
            " changed between major versions, so two names can share one lock."
        ),
    }
)

SAFE_FORM: Mapping[Rule, str] = MappingProxyType(
    {
        Rule.LOCK_IN_LIMITED_SCAN: (
            "pick the rows in a subquery first, then lock in the outer select list:"
            " SELECT pg_advisory_lock(q.id) FROM (SELECT id FROM foo WHERE ... LIMIT 100) AS q"
        ),
        Rule.LOCK_IN_WHERE: (
            "pick the rows first (a subquery or CTE, with FOR UPDATE SKIP LOCKED for a queue),"
            " then lock in the outer select list: WITH q AS (SELECT id FROM jobs WHERE ..."
            " LIMIT 10 FOR UPDATE SKIP LOCKED) SELECT id, pg_try_advisory_xact_lock(id) FROM q"
        ),
        Rule.HASHTEXT_KEY: (
            "derive the key with the 64-bit, seeded hashtextextended(), or take it from a table"
            " or a sequence: SELECT pg_advisory_lock(hashtextextended($1, 0))"
        ),
    }
)


class Skip(enum.StrEnum):
    TOO_LONG = "too_long"  # over MAX_STATEMENT_BYTES (UTF-8 bytes)
    UNPARSABLE = "unparsable"  # the parser refused it (cut, invalid, too deep, anything it raised)
    OVER_BUDGET = "over_budget"  # the total parse budget of this read was spent


# Per statement; longer texts are not parsed (the reader also filters by it server-side).
# Within it, the worst text found (`$1 || $1 || ...`, 16,000 levels deep, read by
# _decode_flat) takes a third of a second and 33 MiB of Python heap to judge.
MAX_STATEMENT_BYTES = 65536
_MAX_UTF8_BYTES_PER_CHARACTER = 4  # a lone surrogate, written through, takes 3


@dataclass(frozen=True)
class Verdict:
    rules: frozenset[Rule] = frozenset()  # empty: nothing risky found
    skipped: Skip | None = None


_TOO_LONG = Verdict(skipped=Skip.TOO_LONG)
_UNPARSABLE = Verdict(skipped=Skip.UNPARSABLE)
_OVER_BUDGET = Verdict(skipped=Skip.OVER_BUDGET)


class Judge:
    """Judges the statements of one read of pg_stat_statements within a total time budget."""

    def __init__(
        self, budget_seconds: float, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self._budget = budget_seconds
        self._clock = clock
        self._spent = 0.0

    @property
    def spent(self) -> float:
        """The clock's seconds spent parsing and judging so far."""
        return self._spent

    def judge(self, text: str) -> Verdict:
        """What is risky in `text`, or why it was not judged; never raises. Once the budget
        is spent, no text is parsed any more: a read of thousands of statements costs at
        most the budget and one statement."""
        if self._spent >= self._budget:
            return _OVER_BUDGET
        if _too_long(text):
            return _TOO_LONG
        if "\x00" in text:
            # The parser reads a C string, which would end at the NUL and leave the rest
            # unjudged; the server keeps no NUL in a text, so this one was not from it.
            return _UNPARSABLE
        start = self._clock()
        try:
            rules: frozenset[Rule] | None = _rules(text)
        except Exception:  # whatever pglast, the JSON or the walk raises: never the caller
            rules = None
        self._spent += max(0.0, self._clock() - start)
        return _UNPARSABLE if rules is None else Verdict(rules)


def shorten(text: str, limit: int = 160) -> str:
    """The statement on one line (whitespace runs collapsed), cut at `limit` characters with
    "…" — for check and /locks; never for a label."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: max(0, limit - 1)] + "…"


def _too_long(text: str) -> bool:
    """Whether the text is over MAX_STATEMENT_BYTES in UTF-8, without encoding a text that a
    count of its characters settles (a megabyte one), and without raising on a lone
    surrogate, which str allows and UTF-8 does not (written through, as three bytes)."""
    if len(text) > MAX_STATEMENT_BYTES:
        return True
    if len(text) * _MAX_UTF8_BYTES_PER_CHARACTER <= MAX_STATEMENT_BYTES:
        return False
    return len(text.encode("utf-8", "surrogatepass")) > MAX_STATEMENT_BYTES


def _rules(text: str) -> frozenset[Rule]:
    """The rules the text's statements break, together (a text may hold several)."""
    tree = _decode(parser.parse_sql_json(text))
    found: set[Rule] = set()
    statements = tree.get("stmts") if isinstance(tree, dict) else None
    for raw in statements if isinstance(statements, list) else ():
        if isinstance(raw, dict):
            found |= _statement_rules(raw.get("stmt"))
    return frozenset(found)


def _decode(document: str) -> object:
    try:
        return json.loads(document)
    except RecursionError:
        return _decode_flat(document)


_SCALARS = json.JSONDecoder()


def _decode_flat(document: str) -> object:
    """json.loads without recursion, for a tree deeper than the interpreter lets json.loads
    go: the containers on a list of its own, the scalars (strings, numbers, true, false,
    null) read by json's own scanner, which does not recurse for them."""
    root: list[object] = []
    open_: list[list[object] | Fields] = [root]
    keys: list[str | None] = [None]  # each open object's key awaiting its value
    at, end = 0, len(document)
    while at < end:
        char = document[at]
        if char in " \t\r\n,:":
            at += 1
            continue
        if char in "]}":
            open_.pop()
            keys.pop()
            at += 1
            continue
        value: object
        if char in "[{":
            value, at = ([] if char == "[" else {}), at + 1
        else:
            value, at = _SCALARS.raw_decode(document, at)
        container, key = open_[-1], keys[-1]
        if isinstance(container, list):
            container.append(value)
        elif key is None:
            keys[-1] = str(value)
            continue
        else:
            container[key] = value
            keys[-1] = None
        if isinstance(value, list | dict):
            open_.append(value)
            keys.append(None)
    return root[0]


def _statement_rules(statement: object) -> set[Rule]:
    """The rules one statement breaks: each of its levels (every SELECT, UPDATE, DELETE and
    MERGE in it: CTEs, subqueries, sub-links, INSERT ... SELECT, under EXPLAIN or CREATE
    TABLE AS) judged on its own, and its function calls anywhere for the key. A DO block's
    or a function's PL/pgSQL body is a string to the parser, and is not looked into."""
    found: set[Rule] = set()
    advisory = hashes = False
    for kind, fields in walk(statement, into_queries=True):
        if kind == "FuncCall":
            name = function(fields)
            advisory = advisory or name in ADVISORY
            hashes = hashes or name in UNDOCUMENTED_HASHES
        elif kind == SELECT:
            found |= _select_rules(fields)
        elif kind in _SCANNING_CONDITIONS:
            where, from_items = _SCANNING_CONDITIONS[kind](fields)
            # An UPDATE, a DELETE and a MERGE always scan their target.
            if _locks([where, *_join_conditions(from_items)]):
                found.add(Rule.LOCK_IN_WHERE)
    # Where a hash and an advisory function meet, whether the one computes the other's key.
    if advisory and hashes and hash_keyed(statement):
        found.add(Rule.HASHTEXT_KEY)
    return found


# The condition of each statement that scans its target, and the FROM items whose joins'
# conditions run per row too.
_SCANNING_CONDITIONS: Mapping[str, Callable[[Fields], tuple[object, object]]] = {
    "UpdateStmt": lambda fields: (fields.get("whereClause"), fields.get("fromClause")),
    "DeleteStmt": lambda fields: (fields.get("whereClause"), fields.get("usingClause")),
    "MergeStmt": lambda fields: (fields.get("joinCondition"), [fields.get("sourceRelation")]),
}


def _select_rules(fields: Fields) -> set[Rule]:
    """The rules one SELECT level breaks by its own clauses (its nested SELECTs are levels
    of their own)."""
    found: set[Rule] = set()
    scans = bool(as_list(fields.get("fromClause")))
    conditions = [fields.get("whereClause"), *_join_conditions(fields.get("fromClause"))]
    if scans and _locks(conditions):
        found.add(Rule.LOCK_IN_WHERE)
    if not _limited(fields):
        return found
    if fields.get("op", NO_SET_OPERATION) != NO_SET_OPERATION:
        # The LIMIT cuts the scans of the branches, whose select lists and conditions lock.
        if any(_locks(_own_clauses(branch)) for branch in _branches(fields)):
            found.add(Rule.LOCK_IN_LIMITED_SCAN)
    elif scans and _locks(_own_clauses(fields)):
        found.add(Rule.LOCK_IN_LIMITED_SCAN)
    return found


def _limited(fields: Fields) -> bool:
    """Whether the level has a row count (LIMIT, FETCH FIRST): LIMIT ALL and LIMIT NULL,
    a null constant, limit nothing."""
    count = node(fields.get("limitCount"))
    if count is None:
        return False
    kind, constant = count
    return not (kind == "A_Const" and constant.get("isnull") is True)


def _own_clauses(fields: Fields) -> list[object]:
    """A SELECT level's clauses that run per row it scans: the select list, WHERE, HAVING
    and its joins' conditions."""
    return [
        fields.get("targetList"),
        fields.get("whereClause"),
        fields.get("havingClause"),
        *_join_conditions(fields.get("fromClause")),
    ]


def _branches(fields: Fields) -> Iterator[Fields]:
    """The SELECTs a set operation combines, through nested set operations, except those
    under a set operation with a LIMIT of its own: that one is judged as a level, and its
    branches' locks would tell nothing new (and judging them again for every enclosing
    LIMIT would cost the square of the nesting)."""
    pending = [fields]
    while pending:
        level = pending.pop()
        if level.get("op", NO_SET_OPERATION) == NO_SET_OPERATION:
            yield level
        elif level is fields or not _limited(level):
            pending.extend(arm for name in ARMS if isinstance(arm := level.get(name), dict))


def _join_conditions(from_items: object) -> list[object]:
    """The ON conditions of the joins among FROM items (a subquery's are its own)."""
    found: list[object] = []
    pending = as_list(from_items)[:]
    while pending:
        item = node(pending.pop())
        if item is not None and item[0] == "JoinExpr":
            found.append(item[1].get("quals"))
            pending += [item[1].get("larg"), item[1].get("rarg")]
    return found


def _locks(clauses: Iterable[object]) -> bool:
    """Whether any of the clauses calls a lock-taking advisory function at this level."""
    return any(
        kind == "FuncCall" and function(fields) in LOCKING
        for clause in clauses
        for kind, fields in walk(clause, into_queries=False)
    )
