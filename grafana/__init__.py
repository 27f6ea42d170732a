"""The Grafana dashboard as code; `python -m grafana.dashboard` prints its JSON."""
