"""Alerts on keys the exporter knows: a migration tool's lock stuck, a registered key's rules."""

from __future__ import annotations

from pg_advisory_exporter.keys.catalog import MIGRATION_KEYS

from .rule_writer import AGE, SERVER, WHERE, Rule, RuleWriter


def migration_lock(w: RuleWriter) -> Rule:
    v = w.v
    migration_keys = f'key=~"{"|".join(MIGRATION_KEYS)}"'
    per_key = w.by(*SERVER, "datname", "key")
    held = f"max by {per_key} ({w.sel('pg_advisory_key_hold_seconds', migration_keys)})"
    waited_for = f"max by {per_key} ({w.sel('pg_advisory_key_waiters', migration_keys)})"
    return w.alert(
        "PgAdvisoryMigrationLockStuck",
        f"{held} > {v.seconds('migration_lock_held_after')}"
        f" or ({held} > {v.seconds('migration_lock_waited_after')}"
        f" and on {per_key} {waited_for} > 0)",
        for_="migration_lock_for",
        severity="critical",
        summary="The {{ $labels.key }} migration lock is stuck in "
        "{{ $labels.datname }} on {{ $labels.target }}",
        description="The well-known lock {{ $labels.key }} (a migration tool's, see "
        "Well-known keys in docs/configuration.md) "
        f"{WHERE} has been held for {AGE}, "
        f"past {v.duration('migration_lock_held_after')}, or past "
        f"{v.duration('migration_lock_waited_after')} with a session waiting for it: "
        "a migration that hangs, or that crashed with its session still open, blocks "
        "every deploy after it. A migration's holder is never paged as a leaked lock: "
        "this is its alert.",
    )


def registered_keys(w: RuleWriter) -> list[Rule]:
    """The keys of the registry that say how they must be held."""
    return [
        w.alert(
            "PgAdvisoryKeyNotHeld",
            f"{w.sel('pg_advisory_key_holders')} == 0",
            for_="key_not_held_for",
            severity="critical",
            summary="Nobody holds {{ $labels.key }} in {{ $labels.datname }} on "
            "{{ $labels.target }}",
            description="The registered key {{ $labels.key }} is expected to be held "
            f"at all times (a leader or singleton lock), but no backend {WHERE} has "
            f"held it for {w.v.duration('key_not_held_for')}.",
        ),
        w.alert(
            "PgAdvisoryKeyHeldTooLong",
            f"{w.sel('pg_advisory_key_hold_seconds')} "
            f"> on {w.by(*SERVER, 'key')} "
            f"group_left () {w.sel('pg_advisory_key_max_hold_seconds')}",
            for_="key_held_too_long_for",
            severity="warning",
            summary=f"{{{{ $labels.key }}}} has been held for {AGE}",
            description=f"A backend {WHERE} has held the registered key "
            f"{{{{ $labels.key }}}} for {AGE}, longer than the key's max_hold.",
        ),
    ]
