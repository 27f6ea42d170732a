"""Benchmarks for pg-advisory-exporter; each module runs as `python -m benchmarks.<name>`."""
