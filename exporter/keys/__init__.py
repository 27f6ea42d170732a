"""Advisory lock keys: their forms, the registry that names them, the migration tools'
catalog, and application_name rewrites."""
