"""The paths the exporter serves besides the metrics, in one place.

The HTTP server routes them and the configuration refuses a telemetry path that would
hide one of them.
"""

LANDING_PATH = "/"
HEALTH_PATH = "/health"
PROBE_PATH = "/probe"
LOCKS_PATH = "/locks"  # one target's holders and waiters, on request
RELOAD_PATH = "/-/reload"
HEALTHY_PATH = "/-/healthy"  # liveness: the process serves
READY_PATH = "/-/ready"  # readiness: configuration loaded, HTTP server up

RESERVED_PATHS = (
    LANDING_PATH,
    HEALTH_PATH,
    PROBE_PATH,
    LOCKS_PATH,
    RELOAD_PATH,
    HEALTHY_PATH,
    READY_PATH,
)
