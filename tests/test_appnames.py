"""application_name rewriting and the cardinality cap."""

from __future__ import annotations

import re
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pg_advisory_exporter.keys.appnames import OTHER, RewriteRule, fold, rewrite

POD_SUFFIX = RewriteRule.compile(r"(.+)-[0-9a-f]{8,10}-[0-9a-z]{5}", r"\1")


def test_rewrite_drops_a_pod_hash_and_leaves_other_names() -> None:
    assert rewrite("reward-points-7d9f8c6b5d-x2k4p", [POD_SUFFIX]) == "reward-points"
    assert rewrite("psql", [POD_SUFFIX]) == "psql"
    assert rewrite("", [POD_SUFFIX]) == ""


def test_rules_apply_in_order_each_to_the_previous_result() -> None:
    lower_env = RewriteRule.compile(r"(.+)-(staging|prod)", r"\1")
    assert rewrite("billing-prod-5f6d7c8b9d-h3j8k", [POD_SUFFIX, lower_env]) == "billing"
    # The other order: the first rule does not match the whole name, so nothing changes.
    assert rewrite("billing-prod-5f6d7c8b9d-h3j8k", [lower_env]) == "billing-prod-5f6d7c8b9d-h3j8k"


def test_a_rule_must_match_the_whole_name() -> None:
    rule = RewriteRule.compile(r"worker", "w")
    assert rewrite("worker-1", [rule]) == "worker-1"
    assert rewrite("worker", [rule]) == "w"


@pytest.mark.timeout(5)
def test_a_pathological_pattern_matches_in_linear_time() -> None:
    # With a backtracking engine this one name takes minutes: 2**40 ways to split the a's.
    rule = RewriteRule.compile(r"(a+)+$", "matched")
    started = time.monotonic()
    assert rewrite("a" * 40 + "!", [rule]) == "a" * 40 + "!"
    assert rewrite("a" * 40, [rule]) == "matched"
    assert time.monotonic() - started < 1


@pytest.mark.parametrize(
    ("pattern", "replacement", "name", "expected"),
    [
        (r"(?P<app>[a-z]+)-(\d+)", r"\g<app>/\2", "worker-12", "worker/12"),
        (r"(\w+)-(\d+)", r"\g<2>0\g<1>", "w-1", "10w"),  # \g<2> before a digit
        (r"(a)|(b)", r"[\1\2]", "b", "[b]"),  # a group that took no part inserts nothing
        (r"(.+)", r"C:\\\1", "dir", "C:\\dir"),  # \\ is one backslash
        (r".+", r"\g<0>!", "whole", "whole!"),
        (r"app-(.)", r"\1", "app-é", "é"),  # matched as text, not bytes
    ],
)
def test_replacement_syntax(pattern: str, replacement: str, name: str, expected: str) -> None:
    assert RewriteRule.compile(pattern, replacement).apply(name) == expected


@pytest.mark.parametrize(
    ("pattern", "replacement", "problem"),
    [
        (r"(a)\1", "x", "bad regular expression"),  # a backreference
        (r"(?=a)a", "x", "bad regular expression"),  # a lookahead
        (r"(?<!a)b", "x", "bad regular expression"),  # a lookbehind
        (r"(\C)", "x", r"\C (any byte) is not supported"),
        (r"(a)", r"\2", r"\2 refers to group 2, but the pattern has 1"),
        (r"(a)", r"\g<9>", r"\g<9> refers to group 9"),
        (r"(?P<a>a)", r"\g<b>", "no group named 'b'"),
        (r"(a)", r"\n", r"unknown escape \n"),
        (r"(a)", r"\0", r"unknown escape \0"),
        (r"(a)", r"\g<1", r"unknown escape \g"),
        (r"(a)", "trailing\\", "unknown escape"),
    ],
)
def test_rules_that_cannot_work_are_refused(pattern: str, replacement: str, problem: str) -> None:
    with pytest.raises(ValueError, match=re.escape(problem)):
        RewriteRule.compile(pattern, replacement)


def test_an_escaped_backslash_before_c_is_not_the_any_byte_escape() -> None:
    assert RewriteRule.compile(r"a\\C", "x").apply("a\\C") == "x"


def test_under_the_cap_nothing_is_folded() -> None:
    folding = fold({"a": 1, "b": 2}, limit=2)
    assert folding.folded == 0
    assert dict(folding.labels) == {"a": "a", "b": "b"}


def test_over_the_cap_the_names_with_most_locks_stay() -> None:
    folding = fold({"quiet": 1, "busy": 50, "medium": 5, "idle": 0}, limit=3)
    assert dict(folding.labels) == {
        "busy": "busy",
        "medium": "medium",
        "quiet": OTHER,
        "idle": OTHER,
    }
    assert folding.folded == 2


@given(
    st.dictionaries(
        st.text(max_size=63).filter(lambda name: name != OTHER), st.integers(0, 10**6), max_size=60
    ),
    st.integers(1, 30),
)
def test_fold_never_exceeds_the_limit_and_keeps_the_biggest(
    counts: dict[str, int], limit: int
) -> None:
    folding = fold(counts, limit)
    labels = set(folding.labels.values())
    assert len(labels) <= limit
    assert folding.folded == sum(1 for label in folding.labels.values() if label == OTHER)
    kept = [name for name, label in folding.labels.items() if label != OTHER]
    folded = [name for name, label in folding.labels.items() if label == OTHER]
    if kept and folded:
        assert min(counts[name] for name in kept) >= max(counts[name] for name in folded)
