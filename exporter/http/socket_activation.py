"""The listening socket that systemd's socket activation hands over (--web.systemd-socket).

systemd passes the sockets of a `.socket` unit as file descriptors from 3 on, and says how
many in LISTEN_FDS, for the process whose pid LISTEN_PID gives (sd_listen_fds(3)): a child
that inherited the variables is not meant to take them. The variables are then removed, as
sd_listen_fds(unset_environment=1) does, so that no program the exporter starts takes them.
"""

from __future__ import annotations

import os
import socket

FIRST_FD = 3  # SD_LISTEN_FDS_START
_VARIABLES = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")


class ActivationError(OSError):
    """No usable socket was handed over; the message says why."""


def activated_socket(environ: dict[str, str] | None = None) -> socket.socket:
    """The one TCP socket, listening, that socket activation passed to this process."""
    env = os.environ if environ is None else environ
    pid, count = env.get("LISTEN_PID", ""), env.get("LISTEN_FDS", "")
    for name in _VARIABLES:
        env.pop(name, None)
    if not pid or not count:
        raise ActivationError(
            "--web.systemd-socket: no socket was passed (LISTEN_PID and LISTEN_FDS are not "
            "set): start the exporter from a systemd .socket unit, or without the flag"
        )
    if not pid.isdigit() or int(pid) != os.getpid():
        raise ActivationError(
            f"--web.systemd-socket: the sockets were passed to process {pid}, not to this "
            f"one ({os.getpid()})"
        )
    if count != "1":
        raise ActivationError(
            f"--web.systemd-socket: {count} sockets were passed; the exporter serves one "
            "(give its .socket unit one ListenStream=)"
        )
    try:
        sock = socket.socket(fileno=FIRST_FD)
    except OSError as exc:
        raise ActivationError(f"--web.systemd-socket: file descriptor {FIRST_FD}: {exc}") from None
    problem = _unusable(sock)
    if problem is not None:
        sock.detach()  # not ours to close: systemd may have passed it for something else
        raise ActivationError(f"--web.systemd-socket: file descriptor {FIRST_FD} {problem}")
    return sock


def _unusable(sock: socket.socket) -> str | None:
    if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
        return "is not a TCP socket (give its .socket unit a ListenStream= of host:port)"
    if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        return "is not listening (its .socket unit must not set Accept=yes)"
    return None
