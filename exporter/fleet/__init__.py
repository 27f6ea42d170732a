"""Many servers: the targets probes name (parsed, checked against allow-lists, resolved) and
the shards that split a configuration."""
