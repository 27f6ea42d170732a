"""The server log read for what a snapshot of pg_locks cannot see: its lines into records,
one parser per log_destination format, and the records into advisory lock events."""
