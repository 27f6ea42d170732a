"""Applications that hold advisory locks on idle connections by design (`IdleByDesignConfig`),
told by their application_name, and the catalog's (`CATALOG`).

Some software takes a lock on one connection and works on others while it sits idle: a job
queue's consumer holds one session lock per job id while its workers run the jobs (Que's
locker), a migrator holds its lock while the migration runs elsewhere (Rails). Their keys are
job ids, or unknown, so the application is told by its name. Its holders are judged against
its own bound (`max_hold`) rather than the leak threshold. An application told by its keys
is a registry entry instead (`long_lived` with `max_hold`, key_config.py): one home each.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from pydantic import Field, field_validator, model_validator

from pg_advisory_exporter.durations import Duration
from pg_advisory_exporter.validation import KEY_NAME_PATTERN, Strict

from .appnames import compile_pattern


class IdleByDesignConfig(Strict):
    """One application whose holders sit idle on their advisory locks on purpose: its name
    (the `idle_by_design` label), exactly one of application_name (the whole name) or
    pattern (RE2, matching the whole name), and the longest idle hold that is still normal."""

    name: str = Field(pattern=KEY_NAME_PATTERN)
    # Never empty: that would name every client that gives no name.
    application_name: str | None = Field(default=None, min_length=1)
    pattern: str | None = Field(default=None, min_length=1)
    max_hold: Duration

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, pattern: str | None) -> str | None:
        if pattern is not None:
            compile_pattern(pattern)
        return pattern

    @model_validator(mode="after")
    def _one_match(self) -> IdleByDesignConfig:
        given = [f for f in ("application_name", "pattern") if getattr(self, f) is not None]
        if len(given) != 1:
            raise ValueError(
                "give exactly one of application_name or pattern" + (" (got both)" if given else "")
            )
        return self

    def matcher(self) -> Callable[[str], bool]:
        """Whether an application_name is this entry's (compiled once, kept by the caller:
        the model stays plain data, compared whole when a reload looks for changes)."""
        if self.pattern is None:
            return lambda name: name == self.application_name
        compiled = compile_pattern(self.pattern)
        return lambda name: compiled.fullmatch(name) is not None


# The applications the catalog names by the application_name they set themselves. A job queue
# whose consumer connection sets none (GoodJob's jobs, on the Rails pool's connections) is
# configured by the operator; one whose keys are known (Rihanna's) is a catalog key
# (well_known_queues.py): docs/configuration.md shows both.
CATALOG: tuple[IdleByDesignConfig, ...] = (
    # Que 1.0 - 2.4 (read in que-rb/que 2.4.1, lib/que/locker.rb:189-192): the locker's own
    # connection names itself set_config('application_name', 'Que Locker: ' || its pid) unless
    # the connection's arguments give one, takes pg_try_advisory_lock(job id) for each job
    # it hands to a worker (lib/que/poller.rb:209), and sits idle, LISTENing, while the
    # workers run the jobs on connections of their own; it unlocks each when its job is done
    # (locker.rb:498). A job may run for an hour.
    IdleByDesignConfig(
        name="que_locker",
        pattern="Que Locker: [0-9]+",
        max_hold=3600,
    ),
)
CATALOG_NAMES: tuple[str, ...] = tuple(entry.name for entry in CATALOG)


def check_unique(entries: Sequence[IdleByDesignConfig]) -> None:
    """Refuse a name used twice: it is the label a bound is joined on."""
    seen: set[str] = set()
    for entry in entries:
        if entry.name in seen:
            raise ValueError(f"idle_by_design name {entry.name!r} is used twice")
        seen.add(entry.name)


@dataclass(frozen=True)
class IdleByDesign:
    """The entries in effect for a target: its configuration's, then the catalog's that no
    configured entry of the same name replaces (a configured entry tunes a catalog one)."""

    entries: tuple[IdleByDesignConfig, ...] = ()
    _matchers: tuple[Callable[[str], bool], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_matchers", tuple(e.matcher() for e in self.entries))

    @classmethod
    def of(
        cls, configured: Iterable[IdleByDesignConfig], catalog: Iterable[IdleByDesignConfig]
    ) -> IdleByDesign:
        mine = tuple(configured)
        names = {entry.name for entry in mine}
        return cls((*mine, *(entry for entry in catalog if entry.name not in names)))

    def match(self, application_name: str) -> IdleByDesignConfig | None:
        """The first entry that names this application_name (as the backend gives it, before
        any rewrite), if any."""
        for entry, matches in zip(self.entries, self._matchers, strict=True):
            if matches(application_name):
                return entry
        return None


NOT_IDLE_BY_DESIGN = IdleByDesign()

# The one state an application idle by design is judged in by its own bound: idle outside any
# transaction. Idle inside one is a leak's signal whoever holds the lock: it holds back
# vacuum, and the locks go with a transaction nobody is ending.
BY_DESIGN_STATE = "idle"
