// The dashboard as `make generate` writes it (grafana/dashboard.py): its threshold lines and
// texts show the defaults, whatever _config says, as the Helm chart's copy does.
{
  grafanaDashboards+:: {
    'pg-advisory-exporter.json': (import 'pg-advisory-exporter.json'),
  },
}
