"""The caller parsed from a statement's annotations (hygiene/callers.py): the four styles as
their libraries write them, several comments, none, statements cut by the server, and
hostile annotations. Pure logic: the fast tier."""

from __future__ import annotations

import pytest

from pg_advisory_exporter.hygiene.callers import (
    CALLER_LENGTH,
    DJANGO_PGLOCKS,
    KEY_LENGTH,
    MAX_TAGS,
    RAILS,
    SQLCOMMENTER,
    VALUE_LENGTH,
    Caller,
    caller_of,
)

LOCK = "SELECT pg_advisory_lock(42)"


def _caller(statement: str) -> Caller:
    found = caller_of(statement)
    assert found is not None, statement
    return found


# (statement as the library writes it, its styles, its tags). Sources:
# - google/sqlcommenter python, generate_sql_comment: ' /*' + ','.join(key=repr(value)) + '*/'
#   sorted by key, URL-quoted with each '%' doubled (its Django middleware appends it);
# - Rails 7.1+ QueryLogs, SQLCommenter formatter: key='url_encoded value', sorted, appended or,
#   with prepend_comment, "#{comment} #{sql}"; LegacyFormatter: key:value as given;
# - django-pgware (django-pglocks 2) locks/_lock.py build_comment: f"-- {lock_id!r} @ file:line".
STYLES = [
    (
        f"{LOCK} /*controller='orders%3Acreate',framework='django%%3A5.2.19',"
        "route='%%5Eorders/%%24'*/",
        (SQLCOMMENTER,),
        (("controller", "orders:create"), ("framework", "django:5.2.19"), ("route", "^orders/$")),
    ),
    (
        f"/*action='create',application='Shop',controller='orders'*/ {LOCK}",
        (SQLCOMMENTER,),
        (("action", "create"), ("application", "Shop"), ("controller", "orders")),
    ),
    (
        f"{LOCK} /*application:Shop,controller:orders,action:create*/",
        (RAILS,),
        (("application", "Shop"), ("controller", "orders"), ("action", "create")),
    ),
    (
        "SELECT pg_advisory_lock($1) -- 'nightly' @ /srv/app/jobs/billing.py:42",
        (DJANGO_PGLOCKS,),
        (("lock_id", "'nightly'"), ("location", "/srv/app/jobs/billing.py:42")),
    ),
    (
        "SELECT pg_advisory_lock($1, $2) -- (1, -2) @ /srv/my app @ v2/jobs.py:7",
        (DJANGO_PGLOCKS,),
        (("lock_id", "(1, -2)"), ("location", "/srv/my app @ v2/jobs.py:7")),
    ),
]


@pytest.mark.parametrize(("statement", "styles", "tags"), STYLES)
def test_each_style_as_its_library_writes_it(
    statement: str, styles: tuple[str, ...], tags: tuple[tuple[str, str], ...]
) -> None:
    found = _caller(statement)
    assert (found.styles, found.tags) == (styles, tags)
    assert found.text == ", ".join(f"{key}={value}" for key, value in tags)


def test_url_encoding_and_escaped_quotes_are_read_back() -> None:
    found = _caller(f"{LOCK} /*a%20key='caf%C3%A9%2C%20%27bar%27',quoted='Joe\\'s Crab Shack'*/")
    assert found.tags == (("a key", "café, 'bar'"), ("quoted", "Joe's Crab Shack"))


def test_several_comments_are_read_in_order_and_prose_is_not_a_caller() -> None:
    found = _caller(
        "/*application:Shop,controller:orders*/ /* TODO: fix, later */ SELECT "
        "'/*not=''a comment''*/', pg_advisory_lock(1) /* fast path */ "
        "/*traceparent='00-4bf9-00f0-01'*/"
    )
    assert found.styles == (RAILS, SQLCOMMENTER)
    assert found.tags == (
        ("application", "Shop"),
        ("controller", "orders"),
        ("traceparent", "00-4bf9-00f0-01"),
    )


@pytest.mark.parametrize(
    "statement",
    [
        None,
        "",
        LOCK,
        f"{LOCK} /* fast path */",
        f"{LOCK} /* TODO: fix */",
        f"{LOCK} -- just a note",
        f"{LOCK} -- 'nightly'",  # django-pgware without a frame: too bare to tell
        "SELECT '/*controller=''orders''*/'",  # in a literal, not a comment
        "<insufficient privilege>",
        "x" * 10_000,
    ],
)
def test_no_caller(statement: str | None) -> None:
    assert caller_of(statement) is None


@pytest.mark.parametrize(
    "cut",
    [
        "/*application:Shop,controller:orders*/ SELECT pg_advisory_lock(1), 'a long lit",
        '/*application:Shop,controller:orders*/ SELECT "unterminated name',
        "/*application:Shop,controller:orders*/ SELECT $$body of a func",
        "/*application:Shop,controller:orders*/ SELECT 1 /*action:crea",
    ],
)
def test_a_statement_cut_by_the_server_keeps_its_leading_comment(cut: str) -> None:
    found = _caller(cut)
    assert found.tags == (("application", "Shop"), ("controller", "orders"))


def test_a_trailing_comment_cut_short_is_dropped_not_read_half() -> None:
    assert caller_of(f"{LOCK} /*action='create',controller='ord") is None
    assert caller_of(f"{LOCK} /*action='create',controller='ord'") is None


def test_hostile_values_are_bounded_escaped_and_stay_on_one_line() -> None:
    script = "<script>alert('x')</script>"
    encoded = script.replace("'", "%27")
    found = _caller(
        f"{LOCK} /*a='{'v' * 10_000}',b='line%0Abreak\r\nhere',c='{encoded}',"
        f"d='bad%zz%C3%28%',{'k' * 500}='1',e='\u202etxt.exe',f='%1B%5B31mred'*/"
    )
    values = dict(found.tags)
    assert values["a"] == "v" * (VALUE_LENGTH - 1) + "…"
    assert values["b"] == "line\\nbreak\\r\\nhere"
    assert values["c"] == script  # as written: escaping is the page's, at output
    assert values["d"] == "bad%zz\ufffd(%"  # invalid encoding kept, invalid UTF-8 replaced
    assert ("k" * (KEY_LENGTH - 1) + "…", "1") in found.tags
    assert values["e"] == "\\u202etxt.exe"
    assert values["f"] == "\\x1b[31mred"  # no terminal escape reaches check's output
    assert len(found.text) <= CALLER_LENGTH
    assert found.text.endswith("…")
    assert "\n" not in found.text
    assert "\r" not in found.text


def test_at_most_max_tags_are_kept() -> None:
    pairs = ",".join(f"k{n:03}='{n}'" for n in range(500))
    found = _caller(f"{LOCK} /*{pairs}*/")
    assert [key for key, _ in found.tags] == [f"k{n:03}" for n in range(MAX_TAGS)]


def test_unicode_around_and_inside_the_annotation() -> None:
    found = _caller("SELECT 'ünïcødé 😀' /*controller='%E8%A8%82%E5%96%AE',emoji='😀'*/")
    assert found.tags == (("controller", "訂單"), ("emoji", "😀"))


def test_a_lone_surrogate_is_no_caller_and_no_error() -> None:
    assert caller_of(f"{LOCK} /*a='\ud800'*/") is None
