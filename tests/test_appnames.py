"""application_name rewriting and the cardinality cap."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from exporter.appnames import OTHER, RewriteRule, fold, rewrite

POD_SUFFIX = RewriteRule(re.compile(r"(.+)-[0-9a-f]{8,10}-[0-9a-z]{5}"), r"\1")


def test_rewrite_drops_a_pod_hash_and_leaves_other_names() -> None:
    assert rewrite("reward-points-7d9f8c6b5d-x2k4p", [POD_SUFFIX]) == "reward-points"
    assert rewrite("psql", [POD_SUFFIX]) == "psql"
    assert rewrite("", [POD_SUFFIX]) == ""


def test_rules_apply_in_order_each_to_the_previous_result() -> None:
    lower_env = RewriteRule(re.compile(r"(.+)-(staging|prod)"), r"\1")
    assert rewrite("billing-prod-5f6d7c8b9d-h3j8k", [POD_SUFFIX, lower_env]) == "billing"
    # The other order: the first rule does not match the whole name, so nothing changes.
    assert rewrite("billing-prod-5f6d7c8b9d-h3j8k", [lower_env]) == "billing-prod-5f6d7c8b9d-h3j8k"


def test_a_rule_must_match_the_whole_name() -> None:
    rule = RewriteRule(re.compile(r"worker"), "w")
    assert rewrite("worker-1", [rule]) == "worker-1"
    assert rewrite("worker", [rule]) == "w"


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
