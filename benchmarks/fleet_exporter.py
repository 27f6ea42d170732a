"""The exporter as it would run for a fleet of distinct servers, on one throwaway server.

Run as `python -m benchmarks.fleet_exporter CONFIG_FILE` (the file's `web.listen_address`
says where it listens). It is the real daemon (`Daemon`: its collection pool, watchdog,
HTTP server, /metrics and /probe, logs), with one change: every configured target gets a
server of its own (`Server`: its own connection and its own collections), as it does when
each target names another server. The daemon's own arrangement gives the targets that connect
alike one server, and its identity check merges the targets that reach one
server under other addresses (the same postmaster start and system identifier): right for a
real deployment, but it makes N targets of one throwaway server one collection. Here they
stay N collections, each read by a connection of its own, which is what N servers would cost
the exporter; the servers' side of it all runs on the one throwaway server.

`benchmarks/fleet_scale.py` starts it; nothing else should.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Hashable, Sequence
from types import FrameType

from pg_advisory_exporter import logs
from pg_advisory_exporter.collect.directory import Directory
from pg_advisory_exporter.collect.server import Server
from pg_advisory_exporter.config.loader import load
from pg_advisory_exporter.config.settings import TargetSettings
from pg_advisory_exporter.daemon import Daemon


class DistinctServers(Daemon):
    """The daemon, each of whose targets is read as a server of its own."""

    # A directory of its own for each server (none is merged with another by its identity),
    # and a server for each target, however alike they connect.
    def _make_server(self, config: TargetSettings) -> Server:
        return Server(config, self.pool, self._watchdog, Directory())

    def _server_key(self, config: TargetSettings) -> Hashable:
        return config.name


def main(argv: Sequence[str] | None = None) -> int:
    [path] = sys.argv[1:] if argv is None else argv
    config = load({"config_file": str(path)})
    logs.setup(config.log.level, config.log.format)
    daemon = DistinctServers(config)

    # As the exporter's command does: the handler hands the shutdown to a thread, since
    # serve_forever() holds the main one.
    def stop(_signum: int, _frame: FrameType | None) -> None:
        threading.Thread(target=daemon.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    daemon.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
