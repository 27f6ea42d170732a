"""Alerts on the exporter itself: a target it cannot read, itself down or refusing a change."""

from __future__ import annotations

from .rule_writer import ANSWERS_FOR_SERVER, SERVER, VALUE, Rule, RuleWriter

# Alertmanager inhibits every other alert of the exporter while this one fires.
EXPORTER_DOWN = "PgAdvisoryExporterDown"
# What tells the replicas of a sharded exporter apart; their shard series are aggregated
# over everything else (the job and the group labels but pod), as kube-state-metrics' are.
_REPLICA = "without (instance, pod)"


def exporter_health(w: RuleWriter) -> list[Rule]:
    """The exporter's own health: a server it cannot read, itself unscrapable, its web
    configuration or its configuration file refused."""
    v = w.v
    return [
        w.alert(
            "PgAdvisoryTargetDown",
            # A server that refused the read for its full lock table pages as full (lock_table.py).
            f"{w.sel('pg_advisory_up')} == 0 and on {w.by(*SERVER)} {w.sel(ANSWERS_FOR_SERVER)} "
            f"unless on {w.by(*SERVER)} {w.sel('pg_advisory_lock_table_full')} == 1",
            for_="target_down_for",
            severity="critical",
            summary="The exporter cannot read {{ $labels.target }}",
            description="pg-advisory-exporter has failed to collect from "
            f"{{{{ $labels.target }}}} for {v.duration('target_down_for')}: leaked locks and a "
            "full lock table there go unseen. Its log says why.",
            locks_page=False,
        ),
        w.alert(
            EXPORTER_DOWN,
            f"{w.sel('up', 'job=' + v.quoted('exporter_job'))} == 0",
            for_="exporter_down_for",
            severity="critical",
            summary="pg-advisory-exporter {{ $labels.instance }} cannot be scraped",
            description="Prometheus has failed to scrape pg-advisory-exporter at "
            f"{{{{ $labels.instance }}}} for {v.duration('exporter_down_for')}: no advisory "
            "lock alert can fire for its targets until it is back.",
            locks_page=False,
        ),
        w.alert(
            "PgAdvisoryExporterWebConfigRefused",
            f"{w.sel('pg_advisory_exporter_web_config_last_reload_successful')} == 0",
            for_="web_config_refused_for",
            severity="warning",
            summary="pg-advisory-exporter {{ $labels.instance }} refused its changed web "
            "configuration",
            description="pg-advisory-exporter at {{ $labels.instance }} has refused a "
            f"change to its --web.config.file for {v.duration('web_config_refused_for')} "
            "and still serves with its previous web configuration (users and TLS as "
            "before): the file on disk is not in effect. Its log says why.",
            locks_page=False,
        ),
        w.alert(
            "PgAdvisoryExporterConfigRefused",
            f"{w.sel('pg_advisory_exporter_config_last_reload_successful')} == 0",
            for_="config_refused_for",
            severity="warning",
            summary="pg-advisory-exporter {{ $labels.instance }} refused its changed "
            "configuration file",
            description="pg-advisory-exporter at {{ $labels.instance }} has refused a "
            f"reload of its --config.file for {v.duration('config_refused_for')} and still "
            "runs its previous configuration (targets, keys and settings as before): the "
            "file on disk is not in effect, and a restart would stop on it. Its log says "
            "why.",
            locks_page=False,
        ),
    ]


def shards(w: RuleWriter) -> list[Rule]:
    """The replicas of a sharded exporter, which together must serve every shard."""
    v = w.v
    return [
        w.alert(
            "PgAdvisoryExporterShardsMissing",
            f"max {_REPLICA} ({w.sel('pg_advisory_exporter_shards')}) "
            f"- count without (shard_index) (count_values {_REPLICA} "
            f'("shard_index", {w.sel("pg_advisory_exporter_shard_index")})) > 0',
            for_="shards_missing_for",
            severity="critical",
            summary=f"Shards of {{{{ $labels.job }}}} without a replica: {VALUE}",
            description=f"{VALUE} of the shards that the replicas of job "
            "{{ $labels.job }} split their configured targets into (--shard.total) have "
            f"had no replica serving for {v.duration('shards_missing_for')}: their targets "
            "are not collected and none of their alerts can fire.",
            locks_page=False,
        ),
        w.alert(
            "PgAdvisoryExporterShardingMismatch",
            f"stdvar {_REPLICA} ({w.sel('pg_advisory_exporter_shards')}) != 0",
            for_="sharding_mismatch_for",
            severity="warning",
            summary="The replicas of {{ $labels.job }} disagree on the number of shards",
            description="The replicas of job {{ $labels.job }} have been run with "
            f"different --shard.total for {v.duration('sharding_mismatch_for')}: some "
            "targets are collected by two replicas (two connections to their servers) and "
            "others by none.",
            locks_page=False,
        ),
    ]
