"""Every alert rule, in the order of the shipped rule files, from the modules of their groups.

Each group is a module of functions that write its rules with a `RuleWriter`
(rule_writer.py), its thresholds spelled by a `RuleValues`: the values themselves (the
rules the exporter prints, rules.py) or templates that compute them (the Helm chart's).
"""

from __future__ import annotations

from dataclasses import dataclass

from .exporter_health import exporter_health, shards
from .known_keys import migration_lock, registered_keys
from .leaks_and_waits import deadlocks, leaks_and_waits
from .lock_table import lock_table
from .rule_writer import Rule, RuleValues, RuleWriter
from .server_log import server_log
from .stranded_locks import dead_client_keeps_locks, session_lock_in_transaction_pool


@dataclass(frozen=True)
class Alerts:
    """The rules of every group, with the thresholds spelled by `v`."""

    v: RuleValues

    def all(self) -> list[Rule]:
        # In this order in the shipped files (regenerated, they must not change).
        w = RuleWriter(self.v)
        return [
            *leaks_and_waits(w),
            *lock_table(w),
            deadlocks(w),
            *exporter_health(w),
            *shards(w),
            migration_lock(w),
            session_lock_in_transaction_pool(w),
            *registered_keys(w),
            *server_log(w),
            dead_client_keeps_locks(w),
        ]
