"""Reading a server: its kept connection, the one statement, the collections shared by its
targets, and the series they map to."""
