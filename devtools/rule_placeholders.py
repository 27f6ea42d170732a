"""The alert rules with each threshold as a placeholder, for the generators that write them in
another language (the Helm chart's templates, the monitoring mixin's jsonnet): each swaps
every placeholder for an expression that computes the threshold, so that their rules follow
from the same code as `pg-advisory-exporter rules` prints."""

from __future__ import annotations

import re
from typing import Any

from pg_advisory_exporter.alerting.rules import groups_of

# A placeholder: its kind (a RuleValues method's name, or how a selector sits) and threshold.
PLACEHOLDER = re.compile(r"@@(\w+):(\w*)@@")


class Placeholders:
    """Each threshold as a placeholder: text that no rule contains otherwise, so that a
    generator dumps the rules first (YAML quotes the text around a placeholder as it would
    the value) and puts its expressions in after."""

    def seconds(self, name: str) -> str:
        return f"@@seconds:{name}@@"

    def duration(self, name: str) -> str:
        return f"@@duration:{name}@@"

    def number(self, name: str) -> str:
        return f"@@number:{name}@@"

    def percent(self, name: str) -> str:
        return f"@@percent:{name}@@"

    def text(self, name: str) -> str:
        return f"@@text:{name}@@"

    def quoted(self, name: str) -> str:
        return f"@@quoted:{name}@@"

    def group_labels(self) -> str:
        return "@@group_labels:@@"

    def selector(self, metric: str, matchers: str) -> str:
        if matchers:
            return f"{metric}{{{matchers}@@selector_after:@@}}"
        return f"{metric}@@selector_alone:@@"


def placeholder_groups() -> list[dict[str, Any]]:
    """The rule groups, each threshold a placeholder."""
    return groups_of(Placeholders())
