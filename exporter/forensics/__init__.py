"""/locks and `check`: who holds and who awaits advisory locks, read when a person asks."""
