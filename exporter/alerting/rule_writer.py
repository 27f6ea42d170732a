"""How a rule is written: its thresholds' spelling (`RuleValues`), the shared labels and texts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

# A rule as the rule file holds it: alert, expr, for, labels, annotations.
Rule = dict[str, Any]


class RuleValues(Protocol):
    """How the rules spell each threshold: its value (the rules the exporter prints), or a
    template that computes it (the Helm chart's)."""

    def seconds(self, name: str) -> str:
        """A duration as a number of seconds, for PromQL: 900."""
        ...

    def duration(self, name: str) -> str:
        """A duration as Prometheus writes it, for `for` and for people: 15m."""
        ...

    def number(self, name: str) -> str: ...

    def percent(self, name: str) -> str:
        """A share as a percentage: 60%."""
        ...

    def text(self, name: str) -> str: ...

    def quoted(self, name: str) -> str:
        """A string as a PromQL string literal."""
        ...

    def group_labels(self) -> str:
        """The group labels, each after a comma: ", namespace, pod, cluster"."""
        ...

    def selector(self, metric: str, matchers: str) -> str:
        """The metric with these matchers and the threshold `selector`'s."""
        ...


# The labels that name a server (the exporter's target), and an application in one of its
# databases.
SERVER = ("job", "instance", "target")
HOLDER = (*SERVER, "datname", "application_name")
# A series that a server's target carries and no other target of that server does (of the
# targets that read one server, one answers for it: its whole-server probe, or else the
# first of its databases' probes): joined with it, an alert about the server fires once
# however many of its databases are probed.
ANSWERS_FOR_SERVER = "pg_advisory_exporter_collect_duration_seconds"
# The link to the target's /locks page, where the exporter knows its external URL: the
# exporter's own series says where that page is (--web.external-url), found by a query
# when the alert fires; without that series the description ends before it.
_LOCKS_PAGE_LINK = (
    '{{ with printf "pg_advisory_exporter_locks_page_info{job=%q, instance=%q, target=%q}" '
    "$labels.job $labels.instance $labels.target | query }}"
    ' Holders and waiters: {{ . | first | label "url" }}{{ end }}'
)


# What an alert's text says of its series, from the labels Prometheus gives every alert.
WHERE = "in database {{ $labels.datname }} on {{ $labels.target }}"
APP = "{{ $labels.application_name }}"
VALUE = "{{ $value }}"
# A count of events from increase(), which extrapolates to the ends of its window: on
# Prometheus 3, whose ranges leave out the sample at their start, 2 deadlocks scraped every
# minute over 10m come out as 2.222. Events are whole: shown rounded.
COUNT = '{{ $value | printf "%.0f" }}'
AGE = "{{ $value | humanizeDuration }}"


@dataclass(frozen=True)
class RuleWriter:
    """Rules with the thresholds spelled by `v`: what every group of alerts writes them with."""

    v: RuleValues

    def sel(self, metric: str, matchers: str = "") -> str:
        return self.v.selector(metric, matchers)

    def by(self, *labels: str) -> str:
        """An aggregation's or a join's labels, the group labels after them."""
        return f"({', '.join(labels)}{self.v.group_labels()})"

    def alert(
        self,
        name: str,
        expr: str,
        *,
        for_: str,
        severity: str,
        summary: str,
        description: str,
        locks_page: bool = True,
    ) -> Rule:
        return {
            "alert": name,
            "expr": expr,
            "for": self.v.duration(for_) if for_ else "0s",
            "labels": {"severity": severity},
            "annotations": {
                "summary": summary,
                "description": description + (_LOCKS_PAGE_LINK if locks_page else ""),
                "runbook_url": f"{self.v.text('runbook_url')}#{name.lower()}",
            },
        }
