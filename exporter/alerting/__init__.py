"""The alert rules, generated from their tunable thresholds."""
