"""How one server is read (`CollectionSettings`): timeouts, intervals, application_name limits."""

from __future__ import annotations

import functools
from typing import Annotated

from pydantic import AfterValidator, Field, ValidationInfo, field_validator

from pg_advisory_exporter.durations import PARSE_DURATION, duration_within
from pg_advisory_exporter.keys.appnames import RewriteRule, compile_pattern, parse_template
from pg_advisory_exporter.keys.idle_by_design import IdleByDesignConfig, check_unique
from pg_advisory_exporter.validation import Strict

from .markers import FileOnly


class RewriteRuleConfig(Strict):
    """One application_name rewrite: an RE2 pattern and its replacement."""

    pattern: str
    replacement: str

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, pattern: str) -> str:
        compile_pattern(pattern)
        return pattern

    @field_validator("replacement")
    @classmethod
    def _groups_exist(cls, replacement: str, info: ValidationInfo) -> str:
        if "pattern" in info.data:  # else the pattern's own error is reported
            parse_template(replacement, compile_pattern(info.data["pattern"]))
        return replacement

    def rule(self) -> RewriteRule:
        return RewriteRule.compile(self.pattern, self.replacement)


# PostgreSQL takes timeouts in whole milliseconds, and 0 turns one off: 1ms is the least.
# The most: a timeout longer than a scrape could ever wait is a typo, and a collection is
# reused for min_interval, so days of it would serve one collection forever.
_LEAST = 0.001
Timeout = Annotated[float, PARSE_DURATION, duration_within(_LEAST, 600.0)]
Interval = Annotated[float, PARSE_DURATION, duration_within(_LEAST, 3600.0)]


def _rarely(seconds: float) -> float:
    # pg_stat_statements' texts can be megabytes: read them at least a minute apart.
    if 0 < seconds < 60:
        raise ValueError("must be 0 (never) or at least 1m")
    return seconds


Rarely = Annotated[float, PARSE_DURATION, duration_within(0.0, 86400.0), AfterValidator(_rarely)]


class CollectionSettings(Strict):
    """How one server is read; set for all targets, and overridable per target.

    Each field is also a flag (--collection.min-interval) and an environment variable
    (PG_ADVISORY_EXPORTER_MIN_INTERVAL), unless it is marked FileOnly: see SETTINGS.
    """

    statement_timeout: Timeout = Field(
        default=5.0, description="server-side limit on one collection"
    )
    lock_timeout: Timeout = Field(
        default=1.0, description="server-side limit on waiting for a catalog lock"
    )
    connect_timeout: Timeout = Field(default=3.0, description="limit on opening a connection")
    min_interval: Interval = Field(
        default=5.0, description="scrapes within this time of the last collection reuse it"
    )
    reconnect_backoff_max: Interval = Field(
        default=30.0,
        description="longest wait between attempts to reach a server that is down",
    )
    statements_interval: Rarely = Field(
        default=600.0,
        description="how often pg_stat_statements is read for risky lock statements (0: never)",
    )
    application_name_limit: int = Field(
        default=100, ge=1, description="most distinct application_name values per target"
    )
    application_name_rewrites: Annotated[tuple[RewriteRuleConfig, ...], FileOnly()] = Field(
        default=(), description="rewrites of application_name before it becomes a label"
    )
    idle_by_design: Annotated[tuple[IdleByDesignConfig, ...], FileOnly()] = Field(
        default=(),
        description="applications that hold advisory locks on idle connections by design, "
        "by application_name or pattern, with the longest idle hold that is still normal",
    )

    @field_validator("idle_by_design")
    @classmethod
    def _idle_names_unique(
        cls, entries: tuple[IdleByDesignConfig, ...]
    ) -> tuple[IdleByDesignConfig, ...]:
        check_unique(entries)
        return entries

    @functools.cached_property
    def rewrite_rules(self) -> tuple[RewriteRule, ...]:
        """The application_name rewrites compiled, once for every reader of its names: the
        series, the server's log, /locks and check."""
        return tuple(rule.rule() for rule in self.application_name_rewrites)

    @property
    def collection_deadline(self) -> float:
        """How long a scrape waits for a collection before it reports the target down."""
        return self.connect_timeout + self.statement_timeout + 1.0
