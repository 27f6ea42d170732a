"""The configuration file's model: its top level (`FileConfig`), made of the blocks beside it.

Each block is in a module of its own: how a server is read (collection.py), the exporter's
own web, log and shard blocks (exporter_settings.py), and what it reads: targets, their
poolers, /locks page and server log, and auth modules (targets.py). Each field has its default
and description (the flags, variables and help of those that have them follow from the
field: config/sources.py), and is validated with the errors a person can act on.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

from pydantic import Field, field_validator

from pg_advisory_exporter.keys.catalog import CatalogChoice
from pg_advisory_exporter.keys.key_config import KeyConfig
from pg_advisory_exporter.keys.registry import check_configs
from pg_advisory_exporter.validation import NAME_PATTERN, Strict, step

from .collection import CollectionSettings
from .exporter_settings import LogConfig, ShardConfig, WebConfig
from .targets import (
    AuthModuleConfig,
    DiscoveredTargetsSettings,
    LocksPageSettings,
    TargetConfig,
)

DEFAULT_PARALLEL_COLLECTIONS = 16


def _check_logs(logs: Sequence[tuple[str, Path, str]]) -> None:
    """Two targets counting one log would count each event twice: one log of a format read
    by two targets (each given as `targets[i] (name)`), under two spellings (a symbolic
    link, `..`), or as a file and the directory that holds it, is refused."""
    seen: list[tuple[str, Path, Path, str]] = []
    for target, path, log_format in logs:
        resolved = path.resolve()
        for earlier_target, earlier, earlier_resolved, earlier_format in seen:
            if log_format != earlier_format:
                continue
            if resolved == earlier_resolved:
                raise ValueError(
                    f"{target}.server_log: '{path} ({log_format})' is used twice: "
                    f"{earlier_target} reads it too"
                )
            if resolved.is_relative_to(earlier_resolved) or earlier_resolved.is_relative_to(
                resolved
            ):
                raise ValueError(
                    f"{target}.server_log: '{path} ({log_format})' and {earlier_target}'s "
                    f"'{earlier}' are one log: one holds the other"
                )
        seen.append((target, path, resolved, log_format))


class FileConfig(Strict):
    """The YAML file."""

    web: WebConfig = WebConfig()
    log: LogConfig = LogConfig()
    collection: CollectionSettings = CollectionSettings()
    keys: tuple[KeyConfig, ...] = ()  # the key registry of every target
    # Well-known keys (catalog.py) named for every target unless it says otherwise: true
    # for the default entries, false for none, or the names of the entries to keep. Only
    # the file sets it: a choice of names has no flag or variable form.
    catalog: CatalogChoice = True
    locks_page: LocksPageSettings = LocksPageSettings()  # of every target; only the file
    max_parallel_collections: int = Field(default=DEFAULT_PARALLEL_COLLECTIONS, ge=1)
    shard: ShardConfig = ShardConfig()
    targets: tuple[TargetConfig, ...] = ()
    # Servers that probes name (/probe?target=HOST&auth_module=NAME), by module name.
    auth_modules: dict[Annotated[str, Field(pattern=NAME_PATTERN)], AuthModuleConfig] = Field(
        default_factory=dict
    )
    discovered_targets: DiscoveredTargetsSettings = DiscoveredTargetsSettings()

    @field_validator("keys")
    @classmethod
    def _keys_unique(cls, keys: tuple[KeyConfig, ...]) -> tuple[KeyConfig, ...]:
        check_configs(keys)
        return keys

    @field_validator("targets")
    @classmethod
    def _unique_names(cls, targets: tuple[TargetConfig, ...]) -> tuple[TargetConfig, ...]:
        first: dict[str, int] = {}
        for i, target in enumerate(targets):
            if target.name in first:
                raise ValueError(
                    f"target name {target.name!r} is used twice: by "
                    f"targets[{first[target.name]}] and targets[{i}]"
                )
            first[target.name] = i
        _check_logs(
            [
                (step("targets", i, target.name), target.server_log.path, target.server_log.format)
                for i, target in enumerate(targets)
                if target.server_log is not None and target.server_log.path is not None
            ]
        )
        return targets
