"""The configuration: the file's model, the settings the runtime reads, and where each comes
from (flags, environment, file)."""
