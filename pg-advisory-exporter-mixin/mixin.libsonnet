// pg-advisory-exporter's monitoring mixin: the alerts of `pg-advisory-exporter rules` and the
// Grafana dashboard, tuned through _config (docs/alerting.md, The monitoring mixin).
(import 'alerts/alerts.libsonnet') +
(import 'dashboards/dashboards.libsonnet') +
(import 'config.libsonnet')
