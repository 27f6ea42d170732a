"""Reading the PostgreSQL server's own log: following its files, parsing its records, finding the
advisory-lock events in them."""
