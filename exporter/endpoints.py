"""The paths the exporter serves besides the metrics, in one place.

The HTTP server routes them and the configuration refuses a telemetry path that would
hide one of them.
"""

LANDING_PATH = "/"
HEALTH_PATH = "/health"
PROBE_PATH = "/probe"
RELOAD_PATH = "/-/reload"

RESERVED_PATHS = (LANDING_PATH, HEALTH_PATH, PROBE_PATH, RELOAD_PATH)
