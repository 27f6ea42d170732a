"""Benchmarks for pg-advisory-exporter; each module runs as `python -m benchmarks.<name>`."""

from __future__ import annotations

import argparse


def positive(value: str) -> int:
    """A command-line count of 1 or more (argparse's `type`)."""
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive integer")
    return number
