"""Reading the PostgreSQL server's own log, for what a snapshot of pg_locks cannot see:
following its files, its lines into records (one parser per log_destination format), the
records into advisory lock events."""
