"""The hygiene of advisory-lock statements: risky forms recognised in pg_stat_statements' texts,
and the caller a statement's annotations name."""
