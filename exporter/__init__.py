"""pg-advisory-exporter: a Prometheus exporter for PostgreSQL advisory locks."""

__version__ = "0.4.0"
