"""How long a server lets a session keep its locks once its client is gone or stuck, from
the settings that end such a session: TCP keepalives, tcp_user_timeout and the idle
timeouts."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import psycopg

# Linux's own keepalive settings (net.ipv4.tcp_keepalive_time, _intvl, _probes), which a
# server setting of 0 leaves in force. A server reports the values in force on a TCP
# session; on a Unix socket it reports 0 whatever is set, and its configured values are
# read instead, where 0 is taken to mean these.
LINUX_KEEPALIVE_IDLE = 7200
LINUX_KEEPALIVE_INTERVAL = 75
LINUX_KEEPALIVE_COUNT = 9


@dataclass(frozen=True)
class ReleaseSettings:
    """The server settings that end a session whose client has stopped talking.

    The keepalive settings and tcp_user_timeout are as the server applies them to a TCP
    session (0 for "the operating system's"); the timeouts are in seconds, 0 for none.
    """

    keepalives_idle: int  # seconds without traffic before the first probe
    keepalives_interval: int  # seconds between probes
    keepalives_count: int  # probes unanswered before the connection is dropped
    user_timeout_ms: int  # tcp_user_timeout: milliseconds of unacknowledged data or probes
    idle_session_timeout: float
    idle_in_transaction_session_timeout: float

    def configured(self) -> ReleaseSettings:
        """These as configured values (a Unix socket's), where 0 leaves Linux's keepalive
        settings in force."""
        return dataclasses.replace(
            self,
            keepalives_idle=self.keepalives_idle or LINUX_KEEPALIVE_IDLE,
            keepalives_interval=self.keepalives_interval or LINUX_KEEPALIVE_INTERVAL,
            keepalives_count=self.keepalives_count or LINUX_KEEPALIVE_COUNT,
        )

    @property
    def known(self) -> bool:
        """Whether the keepalive settings could be read: -1 where the platform cannot say."""
        return min(self.keepalives_idle, self.keepalives_interval, self.keepalives_count) > 0


def keepalive_seconds(settings: ReleaseSettings) -> float:
    """How long after its client's host dies (or its network goes) the server drops an idle
    session: Linux's keepalive timer (net/ipv4/tcp_timer.c, tcp_keepalive_timer).

    The first probe goes out after `idle` seconds without traffic, then one every
    `interval`. Without tcp_user_timeout the connection is dropped when `count` probes are
    unanswered. With it, the count no longer matters: the connection is dropped at the first
    timer tick, after a probe is out, at which nothing has been heard for tcp_user_timeout.
    """
    idle, interval = settings.keepalives_idle, settings.keepalives_interval
    if settings.user_timeout_ms <= 0:
        return float(idle + interval * settings.keepalives_count)
    user_timeout = settings.user_timeout_ms / 1000
    ticks = max(1, math.ceil((user_timeout - idle) / interval))
    return float(idle + interval * ticks)


def dead_client_release_seconds(settings: ReleaseSettings) -> float:
    """The longest a session idle outside a transaction keeps its locks (session-level ones,
    the only kind it can hold) once its client is dead: until the keepalives give up, or
    idle_session_timeout ends it first. client_connection_check_interval does not help: it
    checks the client only while a statement runs."""
    keepalive = keepalive_seconds(settings)
    if settings.idle_session_timeout > 0:
        return min(keepalive, settings.idle_session_timeout)
    return keepalive


def idle_in_transaction_release_seconds(settings: ReleaseSettings) -> float:
    """The longest a session idle inside a transaction keeps its locks while its client is
    alive but sends nothing (a job stuck between two statements): until
    idle_in_transaction_session_timeout ends it, else for ever (+Inf)."""
    timeout = settings.idle_in_transaction_session_timeout
    return timeout if timeout > 0 else math.inf


# The settings that end a dead or stuck client's session, where a role or a database sets
# them (ALTER ROLE ... SET, ALTER DATABASE ... SET): the exporter's own session shows the
# server's, and these apply to the sessions they name instead.
OVERRIDES_SQL = """
SELECT coalesce(r.rolname, '') AS rolname, coalesce(d.datname, '') AS datname, c.setting
FROM pg_catalog.pg_db_role_setting AS s
LEFT JOIN pg_catalog.pg_roles AS r ON r.oid = s.setrole
LEFT JOIN pg_catalog.pg_database AS d ON d.oid = s.setdatabase
CROSS JOIN LATERAL pg_catalog.unnest(s.setconfig) AS c(setting)
WHERE pg_catalog.split_part(c.setting, '=', 1) IN (
    'tcp_keepalives_idle', 'tcp_keepalives_interval', 'tcp_keepalives_count',
    'tcp_user_timeout', 'idle_session_timeout', 'idle_in_transaction_session_timeout')
ORDER BY 1, 2, 3
"""


@dataclass(frozen=True)
class Override:
    rolname: str  # "" for every role
    datname: str  # "" for every database
    setting: str  # name=value

    def __str__(self) -> str:
        where = [f"role {self.rolname}"] * bool(self.rolname)
        where += [f"database {self.datname}"] * bool(self.datname)
        return f"{self.setting} ({', '.join(where)})"


def read_overrides(conn: psycopg.Connection[Any]) -> tuple[Override, ...]:
    """The overrides, as `check` shows them beside the server's own settings."""
    return tuple(Override(*row) for row in conn.execute(OVERRIDES_SQL).fetchall())
