"""Risky advisory-lock statements: each rule's forms and their safe rewrites (the manual's
examples, queues, UPDATE and DELETE, CTEs, set operations, joins) as pg_stat_statements
shows them, lookalikes that the parser tells apart (comments, strings, other schemas' and
quoted functions, hashtextextended, a hash beside a lock rather than in its key), and
hostile texts (too long, cut, too deep, NUL, lone surrogates, a spent budget, a key traced
through thousands of levels), none of which may raise."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

import pytest
from pglast import parser

from pg_advisory_exporter.hygiene import risky
from pg_advisory_exporter.hygiene.risky import (
    MAX_STATEMENT_BYTES,
    RULES,
    SAFE_FORM,
    WHAT,
    Judge,
    Rule,
    Skip,
    Verdict,
    shorten,
)

LIMITED, WHERE, HASHTEXT = Rule.LOCK_IN_LIMITED_SCAN, Rule.LOCK_IN_WHERE, Rule.HASHTEXT_KEY
BUDGET = 60.0  # seconds: more than any test's texts take
SMALL_STACK = 256 * 1024  # bytes: a thread's stack as small as musl's default, twice over


def rules(text: str) -> set[Rule]:
    verdict = Judge(BUDGET).judge(text)
    assert verdict.skipped is None, verdict
    return set(verdict.rules)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # The manual's "danger!" example and its safe form.
        ("SELECT pg_advisory_lock(id) FROM foo WHERE id > 12345 LIMIT 100;", {LIMITED}),
        (
            "SELECT pg_advisory_lock(q.id) FROM (SELECT id FROM foo WHERE id > 12345 LIMIT 100) q;",
            set(),
        ),
        # As pg_stat_statements shows them.
        ("SELECT pg_advisory_lock(id) FROM foo WHERE id > $1 LIMIT $2", {LIMITED}),
        ("SELECT pg_try_advisory_lock($1) FROM jobs WHERE id = $2 LIMIT $3", {LIMITED}),
        ("SELECT PG_ADVISORY_LOCK(ID) FROM FOO LIMIT 1", {LIMITED}),
        ("SELECT pg_catalog.pg_advisory_xact_lock(id) FROM foo LIMIT 1", {LIMITED}),
        ("SELECT PG_CATALOG.PG_TRY_ADVISORY_LOCK_SHARED(id) FROM foo LIMIT 1", {LIMITED}),
        # No LIMIT, or one that limits nothing: every row scanned is returned.
        ("SELECT pg_advisory_lock(id) FROM foo WHERE id > $1", set()),
        ("SELECT pg_advisory_lock(id) FROM foo LIMIT ALL", set()),
        # FETCH FIRST is a LIMIT.
        ("SELECT pg_advisory_lock(id) FROM foo ORDER BY id FETCH FIRST 10 ROWS ONLY", {LIMITED}),
        (
            "SELECT pg_advisory_lock(id) FROM foo ORDER BY id FETCH FIRST 3 ROWS WITH TIES",
            {LIMITED},
        ),
        # The queue: a lock in WHERE under a LIMIT breaks both; the safe form picks first.
        ("SELECT id FROM jobs WHERE pg_try_advisory_lock(id) LIMIT 10", {LIMITED, WHERE}),
        ("SELECT id FROM jobs WHERE state = $1 AND pg_try_advisory_xact_lock(id)", {WHERE}),
        (
            "WITH q AS (SELECT id FROM jobs WHERE state = $1 ORDER BY id LIMIT $2"
            " FOR UPDATE SKIP LOCKED) SELECT id, pg_try_advisory_xact_lock(id) FROM q",
            set(),
        ),
        # The CTE that picks and locks at once is the risky level.
        (
            "WITH picked AS (SELECT id FROM jobs WHERE pg_try_advisory_lock(id) LIMIT $1)"
            " SELECT * FROM picked",
            {LIMITED, WHERE},
        ),
        # Without FROM, no scan: one row, one call.
        ("SELECT pg_try_advisory_lock($1)", set()),
        ("SELECT 1 WHERE pg_try_advisory_lock($1)", set()),
        ("SELECT pg_advisory_lock($1) LIMIT 1", set()),
        # A nested sub-SELECT is a level of its own, both ways.
        (
            "SELECT * FROM jobs WHERE id IN (SELECT id FROM t WHERE pg_try_advisory_lock(id))",
            {WHERE},
        ),
        ("SELECT (SELECT pg_advisory_lock($1)) FROM foo LIMIT 5", set()),
        ("SELECT 1 FROM foo WHERE EXISTS (SELECT pg_try_advisory_lock($1))", set()),
        # UPDATE and DELETE scan their target: a lock in their WHERE is risky, in SET not.
        ("UPDATE jobs SET state = $1 WHERE id = $2 AND pg_try_advisory_xact_lock(id)", {WHERE}),
        ("DELETE FROM jobs WHERE pg_try_advisory_lock(id) AND state = $1", {WHERE}),
        (
            "DELETE FROM jobs j USING runs r WHERE j.id = r.id AND pg_try_advisory_lock(r.id)",
            {WHERE},
        ),
        ("UPDATE jobs SET locked = pg_try_advisory_lock(id) WHERE id = $1", set()),
        (
            "UPDATE t SET a = $1 FROM u JOIN v ON pg_try_advisory_lock(v.id) WHERE t.id = u.id",
            {WHERE},
        ),
        (
            "MERGE INTO t USING s ON t.id = s.id AND pg_try_advisory_lock(s.id)"
            " WHEN MATCHED THEN DO NOTHING",
            {WHERE},
        ),
        # A join's ON, at any depth of the FROM's joins.
        (
            "SELECT j.id FROM jobs j JOIN runs r ON r.job_id = j.id AND pg_try_advisory_lock(j.id)",
            {WHERE},
        ),
        (
            "SELECT j.id FROM jobs j JOIN runs r ON r.job_id = j.id LEFT JOIN x"
            " ON x.id = pg_try_advisory_lock(j.id)::int LIMIT 3",
            {LIMITED, WHERE},
        ),
        # HAVING runs per group under the LIMIT; it is not a scan's WHERE.
        ("SELECT k FROM t GROUP BY k HAVING pg_try_advisory_lock(k) LIMIT 1", {LIMITED}),
        # A set operation's LIMIT cuts its branches' scans.
        (
            "SELECT pg_advisory_lock(id) FROM a UNION ALL SELECT pg_advisory_lock(id) FROM b"
            " LIMIT 5",
            {LIMITED},
        ),
        (
            "SELECT 1 FROM a UNION SELECT 2 FROM b"
            " UNION SELECT pg_advisory_lock(id) FROM c LIMIT 1",
            {LIMITED},
        ),
        ("SELECT pg_advisory_lock(id) FROM a UNION ALL SELECT pg_advisory_lock(id) FROM b", set()),
        (
            "SELECT id FROM a WHERE pg_try_advisory_lock(id) UNION SELECT id FROM b LIMIT 1",
            {LIMITED, WHERE},
        ),
        ("(SELECT id FROM a LIMIT 1) UNION SELECT pg_advisory_lock(id) FROM b", set()),
        # Where a statement holds another.
        (
            "INSERT INTO claimed (id, ok) SELECT id, pg_try_advisory_lock(id) FROM jobs LIMIT $1",
            {LIMITED},
        ),
        ("EXPLAIN SELECT pg_advisory_lock(id) FROM foo LIMIT 1", {LIMITED}),
        ("CREATE TABLE x AS SELECT id FROM jobs WHERE pg_try_advisory_lock(id)", {WHERE}),
        (
            "PREPARE p AS SELECT id FROM jobs WHERE pg_try_advisory_lock(id) LIMIT 1",
            {LIMITED, WHERE},
        ),
        # An unlock takes nothing.
        ("SELECT pg_advisory_unlock(id) FROM foo WHERE pg_advisory_unlock(id) LIMIT 1", set()),
        # The key: hashtext computes an argument of an advisory function that takes one
        # (test_a_key_from_an_undocumented_hash has every form).
        ("SELECT pg_advisory_lock(hashtext($1))", {HASHTEXT}),
        ("SELECT pg_advisory_unlock(pg_catalog.hashtext($1))", {HASHTEXT}),
        (
            "WITH k AS (SELECT hashtext($1) AS h) SELECT pg_advisory_xact_lock(k.h) FROM k",
            {HASHTEXT},
        ),
        # pg_advisory_unlock_all takes no key: the hash only filters the rows.
        ("SELECT pg_advisory_unlock_all() FROM t WHERE x = hashtext($1)", set()),
        ("SELECT pg_advisory_lock(hashtextextended($1, 0))", set()),
        ("SELECT pg_advisory_lock(myschema.hashtext($1))", set()),
        ("SELECT hashtext($1)", set()),
        # Several statements: each judged, the rules together; the key is per statement.
        (
            "SELECT pg_advisory_lock(hashtext($1));"
            " SELECT id FROM jobs WHERE pg_try_advisory_lock(id)",
            {HASHTEXT, WHERE},
        ),
        ("SELECT hashtext($1); SELECT pg_advisory_lock($2)", set()),
        ("", set()),
        (";;", set()),
    ],
)
def test_the_rules_a_statement_breaks(text: str, expected: set[Rule]) -> None:
    assert rules(text) == expected


@pytest.mark.parametrize(
    ("text", "keyed"),
    [
        # The two lookalikes: a hash beside a lock, a hash that filters the rows.
        ("SELECT hashtext($1), pg_advisory_xact_lock($2)", False),
        ("SELECT pg_advisory_xact_lock(id) FROM t WHERE hashtext(state) <> $1", False),
        # Other places where a hash is no key: a condition, an order, a filter, an
        # unrelated column of the same subquery or CTE, a WHERE of the sub-select that
        # gives the key, a SET beside the lock, a lock of another statement.
        ("SELECT pg_advisory_lock(CASE WHEN hashtext($1) > $2 THEN $3 ELSE $4 END)", False),
        ("SELECT pg_advisory_lock(id) FROM t ORDER BY hashtext(name)", False),
        ("SELECT pg_advisory_lock(max(id) FILTER (WHERE hashtext(s) > $1)) FROM t", False),
        ("SELECT pg_advisory_lock(id) FROM (SELECT hashtext($1) AS h, $2 AS id) s", False),
        (
            "WITH k AS (SELECT hashtext($1) AS h, $2 AS id) SELECT pg_advisory_lock(k.id) FROM k",
            False,
        ),
        ("SELECT pg_advisory_lock((SELECT id FROM accounts WHERE hashtext(name) = $1))", False),
        ("SELECT pg_advisory_lock(id) FROM t, LATERAL (SELECT hashtext(t.name) AS h) x", False),
        ("UPDATE t SET a = pg_try_advisory_lock(id), b = hashtext(name) WHERE id = $1", False),
        ("UPDATE t SET a = pg_try_advisory_lock(id) WHERE hashtext(name) = $1", False),
        ("SELECT pg_advisory_lock(id), hashtext(name) FROM t", False),
        (
            "WITH RECURSIVE k(h) AS (SELECT $1::int UNION ALL SELECT h + 1 FROM k WHERE"
            " hashtext(h::text) > $2) SELECT pg_advisory_lock(h) FROM k",
            False,
        ),
        # A name the server finds in a table of this level, not the outer subquery's.
        ("SELECT (SELECT pg_advisory_lock(h) FROM jobs) FROM (SELECT hashtext($1) AS h) s", False),
        ("SELECT pg_advisory_lock(myschema.hashtext($1))", False),
        ("SELECT pg_advisory_lock(hashtextextended($1, 0))", False),
        # The true forms: nested in the arguments, through a cast, inside an expression.
        ("SELECT pg_advisory_lock(1001, hashtext(x)) FROM t", True),
        ("SELECT pg_advisory_xact_lock(hashtext(a || b)::bigint) FROM t", True),
        ("SELECT pg_advisory_lock(CAST(hashtext($1) AS bigint))", True),
        ("SELECT pg_advisory_lock((hashtext($1) & $2)::bigint << $3)", True),
        ("SELECT pg_try_advisory_xact_lock($1, abs(hashtext(lower($2))))", True),
        ("SELECT pg_advisory_lock(key => hashtext($1))", True),
        ("SELECT pg_advisory_lock(COALESCE(hashtext($1), $2))", True),
        ("SELECT pg_advisory_lock(CASE WHEN $1 THEN hashtext($2) ELSE $3 END)", True),
        ('SELECT pg_advisory_lock(hashtext($1 COLLATE "C"))', True),
        ("SELECT pg_advisory_unlock_shared(hashbpchar($1))", True),
        ("SELECT pg_advisory_lock(hashname($1::name))", True),
        # Through a scalar sub-select, a subquery's, a CTE's, a VALUES' or a function's
        # column, by name or by the alias's columns, through a star, a UNION, a recursion.
        ("SELECT pg_advisory_lock((SELECT hashtext(name) FROM accounts WHERE id = $1))", True),
        ("SELECT pg_advisory_lock(h) FROM (SELECT hashtext($1) AS h) s", True),
        ("SELECT pg_advisory_lock(s.k) FROM (SELECT hashtext($1)) AS s(k)", True),
        ("SELECT pg_advisory_lock(hashtext) FROM (SELECT hashtext($1)) s", True),
        ("SELECT pg_advisory_lock(h) FROM (SELECT * FROM (SELECT hashtext($1) AS h) a) b", True),
        ("SELECT pg_advisory_lock(h) FROM (SELECT $1 AS h UNION SELECT hashtext($2)) s", True),
        ("SELECT pg_advisory_lock(v.h) FROM (VALUES ($1), (hashtext($2))) AS v(h)", True),
        ("SELECT pg_advisory_lock(column1) FROM (VALUES (hashtext($1))) v", True),
        ("SELECT pg_advisory_lock(h) FROM hashtext($1) AS h", True),
        ("SELECT pg_advisory_lock(x.h) FROM t, LATERAL (SELECT hashtext(t.name) AS h) x", True),
        (
            "SELECT pg_advisory_lock(s.h) FROM (SELECT hashtext($1) AS h) s JOIN u ON u.id = $2",
            True,
        ),
        ("WITH k(h) AS (SELECT hashtext($1)) SELECT pg_advisory_xact_lock(h) FROM k", True),
        (
            "WITH a AS (SELECT hashtext($1) AS h), b AS (SELECT h + $2 AS g FROM a)"
            " SELECT pg_advisory_lock(g) FROM b",
            True,
        ),
        (
            "WITH RECURSIVE k(h) AS (SELECT hashtext($1) UNION ALL SELECT h FROM k)"
            " SELECT pg_advisory_lock(h) FROM k",
            True,
        ),
        (
            "WITH k AS (INSERT INTO t VALUES ($1) RETURNING hashtext(x) AS h)"
            " SELECT pg_advisory_lock(h) FROM k",
            True,
        ),
        ("SELECT (SELECT pg_advisory_lock(s.h) FROM jobs) FROM (SELECT hashtext($1) AS h) s", True),
        ("UPDATE t SET a = pg_try_advisory_lock(hashtext(name)) WHERE id = $1", True),
        ("CALL p(pg_advisory_lock(hashtext($1)))", True),
    ],
)
def test_a_key_from_an_undocumented_hash(text: str, keyed: bool) -> None:
    assert (HASHTEXT in rules(text)) is keyed


def _cpu_seconds(run: Callable[[], object]) -> float:
    """The CPU seconds `run` takes: this process's, which other processes' work on the
    machine does not add to."""
    started = time.process_time()
    run()
    return time.process_time() - started


def _fit(make: Callable[[int], str]) -> str:
    """The longest text `make` writes within MAX_STATEMENT_BYTES (its size doubled until
    too long, then halved: never a text much longer built)."""
    low = 1
    while len(make(2 * low).encode()) <= MAX_STATEMENT_BYTES:
        low *= 2
    high = 2 * low - 1
    while low < high:
        middle = (low + high + 1) // 2
        if len(make(middle).encode()) <= MAX_STATEMENT_BYTES:
            low = middle
        else:
            high = middle - 1
    return make(low)


def _nested(n: int) -> str:
    """Levels of scalar sub-selects, each with a subquery in FROM and a lock of a name none
    has: every name looked for outwards."""
    inner = "".join(f" FROM (SELECT 1) s{i}), pg_advisory_lock(c{i})" for i in range(1, n))
    return "SELECT hashtext($1), " + "(SELECT " * (n - 1) + "pg_advisory_lock(c0)" + inner


def _wide(n: int) -> str:
    """A subquery per lock, all in one FROM, each lock naming a column none has."""
    locks = ", ".join(f"pg_advisory_lock(x{i})" for i in range(n))
    sources = ", ".join(f"(SELECT hashtext($1) AS y{i}) s{i}" for i in range(n))
    return f"SELECT {locks} FROM {sources}"


def _chain(n: int) -> str:
    """CTEs each reading the one before, twice, the first a hash: the last one's key."""
    ctes = ["c0 AS (SELECT hashtext($1) AS h)"] + [
        f"c{i} AS (SELECT h FROM c{i - 1} UNION ALL SELECT h + 1 FROM c{i - 1})"
        for i in range(1, n)
    ]
    return f"WITH {', '.join(ctes)} SELECT pg_advisory_lock(h) FROM c{n - 1}"


def _with_everywhere(n: int) -> str:
    """A WITH at every level of sub-selects: each FROM looks for its CTE outwards."""
    outer = "".join(f"WITH w{i} AS (SELECT 1) SELECT (" for i in range(n - 1, 0, -1))
    inner = "".join(f") FROM w{i}, t{i}" for i in range(1, n))
    return outer + "SELECT pg_advisory_lock(q) FROM t0 WHERE hashtext(q::text) > 0" + inner


@pytest.mark.parametrize(
    ("make", "keyed"),
    [(_nested, False), (_wide, False), (_chain, True), (_with_everywhere, False)],
    ids=lambda value: getattr(value, "__name__", str(value)),
)
def test_tracing_a_key_through_a_hostile_statement_stays_bounded(
    make: Callable[[int], str], keyed: bool
) -> None:
    """The trace of a key through 64 KiB built to make it work hard (a thousand levels,
    sources or CTEs, each name looked up) costs a few times what parsing the text costs, as
    the rules' own walk does; a lookup through every level or every source for every name
    took 40 to 150 times as long."""
    text = _fit(make)
    verdicts: list[Verdict] = []
    judged = _cpu_seconds(lambda: verdicts.append(Judge(BUDGET).judge(text)))
    parsed = _cpu_seconds(lambda: risky._decode(parser.parse_sql_json(text)))
    assert verdicts[0].skipped is None
    assert (HASHTEXT in verdicts[0].rules) is keyed
    assert judged < 25 * parsed + 0.05, (judged, parsed)


def test_a_key_at_the_bottom_of_a_deep_expression_is_found() -> None:
    """A key that is a chain of concatenations thousands of levels deep (a tree json.loads
    refuses): the hash at its bottom computes it; in the WHERE beside it, it does not."""
    deep = "$1 || " * 2_000
    keyed = f"SELECT pg_advisory_lock({deep}hashtext($2))"
    with pytest.raises(RecursionError):
        json.loads(parser.parse_sql_json(keyed))
    assert rules(keyed) == {HASHTEXT}
    assert rules(f"SELECT pg_advisory_lock({deep}$2) WHERE hashtext($3) > $4") == set()


@pytest.mark.parametrize(
    "text",
    [
        "SELECT id FROM foo -- pg_advisory_lock(id) LIMIT\nWHERE id > $1",
        "SELECT id /* pg_try_advisory_lock(id) */ FROM foo WHERE /* x */ id > $1 LIMIT 1",
        "SELECT id FROM foo /* nested /* pg_advisory_lock(hashtext(id)) */ */ LIMIT 1",
        "SELECT 'pg_advisory_lock(id)' FROM foo LIMIT 1",
        "SELECT id FROM t WHERE note = 'pg_try_advisory_lock(id) LIMIT 1' LIMIT 1",
        "SELECT $$pg_advisory_lock(hashtext(x))$$ FROM t WHERE $q$pg_try_advisory_lock(1)$q$ > ''",
        "SELECT E'\\' pg_advisory_lock(id) FROM foo LIMIT 1' FROM t LIMIT 1",
        "SELECT myschema.pg_advisory_lock(id) FROM foo"
        " WHERE myschema.pg_try_advisory_lock(id) LIMIT 1",
        'SELECT "PG_ADVISORY_LOCK"(id) FROM foo WHERE "Pg_Try_Advisory_Lock"(id) LIMIT 1',
        "SELECT db.pg_catalog.pg_advisory_lock(id) FROM foo LIMIT 1",
        "SELECT pg_advisory_lock FROM t WHERE pg_try_advisory_lock LIMIT 1",  # columns
        "SELECT * FROM pg_advisory_lock WHERE pg_advisory_lock.id > $1 LIMIT 1",  # a table
        "SELECT f.pg_advisory_lock(id) FROM foo f LIMIT 1",
        "SELECT * FROM pg_try_advisory_lock($1) LIMIT 1",  # a call in FROM: no scan to cut
        "SELECT pg_advisory_lock(hashtextextended($1, 0)) FROM t LIMIT ALL",
        "SELECT hashtext(name) FROM t WHERE hashtext(name) > $1 LIMIT 1",
        # PL/pgSQL is a string to the SQL parser: not looked into.
        "DO $$BEGIN PERFORM pg_advisory_lock(hashtext(x)) FROM foo"
        " WHERE pg_try_advisory_lock(id) LIMIT 1; END$$",
        "CREATE FUNCTION f() RETURNS void LANGUAGE plpgsql AS"
        " 'BEGIN PERFORM pg_advisory_lock(id) FROM foo LIMIT 1; END'",
    ],
)
def test_lookalikes_are_not_calls(text: str) -> None:
    assert rules(text) == set()


def test_a_statement_too_long_is_measured_in_utf8_bytes() -> None:
    head = "SELECT pg_advisory_lock(hashtext($1)) --"
    fits = head + "é" * ((MAX_STATEMENT_BYTES - len(head)) // 2)  # two bytes each
    assert len(fits.encode()) == MAX_STATEMENT_BYTES
    assert Judge(BUDGET).judge(fits) == Verdict(frozenset({HASHTEXT}))
    over = fits + "é"
    assert len(over) < MAX_STATEMENT_BYTES < len(over.encode())
    assert Judge(BUDGET).judge(over) == Verdict(skipped=Skip.TOO_LONG)
    # A lone surrogate, which str allows and UTF-8 does not, counts its three bytes.
    surrogates = "SELECT 1 --" + "\ud800" * (MAX_STATEMENT_BYTES // 3)
    assert Judge(BUDGET).judge(surrogates) == Verdict(skipped=Skip.TOO_LONG)
    assert Judge(BUDGET).judge("x" * 10_000_000) == Verdict(skipped=Skip.TOO_LONG)


@pytest.mark.parametrize(
    "text",
    [
        "SELECT pg_advisory_lock(id) FROM foo WHERE id > $1 LIM",  # cut
        "SELECT pg_advisory_lock(id) FROM foo WHERE id > $1 LIMIT 100 AND (",
        "SELECT pg_advisory_lock(hashtext('unterminated",
        "/* an unterminated comment pg_advisory_lock(id)",
        "pg_advisory_lock(hashtext($1))",  # a fragment, no statement
        "SELECT 1; SELECT pg_advisory_lock(id) FROM foo LIMIT",  # one good, one cut
        "SELECT 1 \x00; SELECT pg_advisory_lock(hashtext($1))",  # the parser would stop at NUL
        "SELECT \ud800 FROM t",  # a lone surrogate: not UTF-8
        "SELECT " + "+".join(["1"] * 32_000),  # 64 KiB of depth: libpg_query's stack check
        "SELECT " + "(" * 32_000 + "1" + ")" * 32_000,  # the grammar's stack: "memory exhausted"
        "SELECT " + "NOT " * 16_000 + "true",
        "SELECT " + "(SELECT " * 7_000 + "1" + ")" * 7_000,
    ],
)
def test_what_the_parser_refuses_is_unparsable(text: str) -> None:
    assert Judge(BUDGET).judge(text) == Verdict(skipped=Skip.UNPARSABLE)


@pytest.mark.parametrize(
    "text",
    [
        "SELECT " + "(" * 5_000 + "pg_advisory_lock(hashtext($1))" + ")" * 5_000,
        "SELECT " + "+".join(["pg_advisory_lock(hashtext($1))"] * 2_000),
        "SELECT 1 FROM t WHERE a IN (" + ", ".join(f"${i}" for i in range(1, 9_000)) + ")",
        "\ufeffSELECT pg_advisory_lock(hashtext('\U0010ffff\u202e\u0301'))",
        "SELECT pg_advisory_lock(hashtext($1)) -- \udfff \x7f \x1b[2J",
        'SELECT pg_advisory_lock(hashtext("\u00e9t\u00e9"))',
    ],
)
def test_deep_long_and_odd_texts_never_raise(text: str) -> None:
    verdict = Judge(BUDGET).judge(text)
    assert verdict.skipped in (None, Skip.UNPARSABLE)
    assert verdict.rules <= {HASHTEXT}


def test_a_deep_tree_is_refused_on_a_small_thread_stack() -> None:
    """libpg_query checks its depth against the stack of the thread it runs on (pglast 8.5
    on; 8.4 kills the process here): a daemon's thread may have far less than the main
    thread's 8 MiB."""
    deep = "SELECT " + "+".join(["1"] * 32_000)
    verdicts: list[Verdict] = []
    previous = threading.stack_size(SMALL_STACK)
    try:
        thread = threading.Thread(target=lambda: verdicts.append(Judge(BUDGET).judge(deep)))
        thread.start()
        thread.join()
    finally:
        threading.stack_size(previous)
    assert verdicts == [Verdict(skipped=Skip.UNPARSABLE)]


def test_a_tree_deeper_than_json_loads_goes_is_still_judged() -> None:
    """A long UNION chain is a left-deep tree that json.loads refuses (RecursionError): it is
    read again without recursion, and its LIMIT found cutting a branch that locks."""
    text = "SELECT pg_advisory_lock(id) FROM t" + " UNION ALL SELECT id FROM t" * 2_000 + " LIMIT 1"
    assert len(text.encode()) <= MAX_STATEMENT_BYTES
    with pytest.raises(RecursionError):
        json.loads(parser.parse_sql_json(text))
    assert rules(text) == {LIMITED}
    assert rules(text.removesuffix(" LIMIT 1")) == set()


def test_the_flat_decoder_reads_what_json_loads_reads() -> None:
    document = parser.parse_sql_json(
        "WITH k AS (SELECT hashtext(E'\\\"}]\\u00e9', 'x') AS h, -1.5e3, true, NULL)"
        " SELECT pg_advisory_lock(k.h) FROM k, LATERAL (SELECT '{[:,') q LIMIT $1"
    )
    assert risky._decode_flat(document) == json.loads(document)
    spaced = '{ "a" : [ 1 , { } , [ ] , "b" , null , false ] , "c" : { "d" : -2 } }'
    assert risky._decode_flat(spaced) == json.loads(spaced)


@pytest.mark.parametrize("error", [MemoryError, RecursionError, ValueError, KeyError])
def test_whatever_the_parser_raises_is_unparsable(
    monkeypatch: pytest.MonkeyPatch, error: type[Exception]
) -> None:
    def failing(text: str) -> str:
        raise error("from the parser")

    monkeypatch.setattr(parser, "parse_sql_json", failing)
    assert Judge(BUDGET).judge("SELECT 1") == Verdict(skipped=Skip.UNPARSABLE)


class SteppedClock:
    """A clock that moves one second each time it is read."""

    def __init__(self) -> None:
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return float(self.reads)


def test_once_the_budget_is_spent_nothing_is_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = SteppedClock()
    judge = Judge(3.0, clock)
    risky = "SELECT pg_advisory_lock(hashtext($1))"
    for spent in (1.0, 2.0, 3.0):  # a read before and after each parse: one second each
        assert judge.judge(risky) == Verdict(frozenset({HASHTEXT}))
        assert judge.spent == spent
    parses: list[str] = []
    monkeypatch.setattr(parser, "parse_sql_json", parses.append)
    for text in (risky, "SELECT 1", "x" * 100_000, "SELECT \x00"):
        assert judge.judge(text) == Verdict(skipped=Skip.OVER_BUDGET)
    assert (parses, clock.reads, judge.spent) == ([], 6, 3.0)


def test_a_text_not_parsed_spends_nothing() -> None:
    clock = SteppedClock()
    judge = Judge(1.0, clock)
    assert judge.judge("x" * (MAX_STATEMENT_BYTES + 1)) == Verdict(skipped=Skip.TOO_LONG)
    assert judge.judge("SELECT \x00") == Verdict(skipped=Skip.UNPARSABLE)
    assert (clock.reads, judge.spent) == (0, 0.0)
    assert judge.judge("SELECT (") == Verdict(skipped=Skip.UNPARSABLE)  # parsed, refused
    assert (clock.reads, judge.spent) == (2, 1.0)


def test_one_judge_judges_thousands_of_statements() -> None:
    judge = Judge(BUDGET)
    texts = [
        "SELECT id FROM jobs WHERE pg_try_advisory_lock(id) AND kind = $1 LIMIT $2",
        "SELECT pg_advisory_lock(hashtext($1))",
        "UPDATE jobs SET state = $1 WHERE id = $2",
        "SELECT pg_advisory_lock(id) FROM foo WHERE",
        "SELECT pg_advisory_unlock($1)",
    ] * 1_000
    verdicts = [judge.judge(text) for text in texts]
    assert verdicts[:5] == [
        Verdict(frozenset({LIMITED, WHERE})),
        Verdict(frozenset({HASHTEXT})),
        Verdict(),
        Verdict(skipped=Skip.UNPARSABLE),
        Verdict(),
    ]
    assert verdicts == verdicts[:5] * 1_000
    assert 0 < judge.spent < BUDGET


def test_every_rule_says_what_is_wrong_and_the_safe_form() -> None:
    assert RULES == (LIMITED, WHERE, HASHTEXT)
    assert set(WHAT) == set(SAFE_FORM) == set(RULES)
    assert "77,000" in WHAT[HASHTEXT]
    assert "undocumented" in WHAT[HASHTEXT]
    # Each safe form's SQL, after its sentence, is what the rules let pass.
    for rule in RULES:
        sql = SAFE_FORM[rule].split(": ", 1)[1].replace("...", "x = $1")
        assert rules(sql) == set(), (rule, sql)


def test_shorten_puts_a_statement_on_one_line() -> None:
    assert shorten("SELECT 1") == "SELECT 1"
    assert shorten("  SELECT\n\tid\r\n  FROM   foo \n") == "SELECT id FROM foo"
    long = "SELECT " + ", ".join(f"c{i}" for i in range(100))
    assert shorten(long) == long[:159] + "…"
    assert len(shorten(long)) == 160
    assert shorten("SELECT\n" + "x" * 20, limit=10) == "SELECT xx…"
    assert shorten("x" * 10, limit=10) == "x" * 10
