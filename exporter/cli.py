"""The `pg-advisory-exporter` command: the daemon, `check` and `demo`."""

from __future__ import annotations

import argparse
import logging
import shlex
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType

from . import __version__, logs
from .config import (
    DEFAULT_LISTEN_ADDRESS,
    FLAG_NAMES,
    Config,
    ConfigError,
    load,
    read_environment,
    read_flags,
)
from .daemon import Daemon
from .demo import run_demo
from .embedded_postgres import DEFAULT_MAJOR
from .report import run_check
from .rules import dump, prometheus_rule, rule_groups, thresholds_from

log = logging.getLogger("pg_advisory_exporter")

EXIT_CONFIG = 2
DEMO_LISTEN_ADDRESS = "127.0.0.1:9846"  # the demo's server is throwaway: keep it local

_HELP = {
    "dsn": "PostgreSQL connection string of the one server to watch (target name 'default'); "
    "also PG_ADVISORY_EXPORTER_DSN or DATA_SOURCE_NAME",
    "config_file": "YAML file with targets and collection settings",
    "web_listen_address": f"address to listen on (default {DEFAULT_LISTEN_ADDRESS})",
    "web_telemetry_path": "path under which to expose metrics (default /metrics)",
    "log_level": "debug, info, warn or error (default info)",
    "log_format": "logfmt or json (default logfmt)",
    "statement_timeout": "server-side limit on one collection, e.g. 5s (default 5s)",
    "lock_timeout": "server-side limit on waiting for a catalog lock (default 1s)",
    "connect_timeout": "limit on opening a connection (default 3s)",
    "min_interval": "scrapes within this time of the last collection reuse it (default 5s)",
    "application_name_limit": "most distinct application_name values per target (default 100)",
}


def _flags(default: object) -> argparse.ArgumentParser:
    flags = argparse.ArgumentParser(add_help=False)
    for field, flag in FLAG_NAMES.items():
        flags.add_argument(flag, dest=field, metavar="VALUE", default=default, help=_HELP[field])
    return flags


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pg-advisory-exporter",
        description="Prometheus exporter for PostgreSQL advisory locks.",
        parents=[_flags(None)],
    )
    # Flags may come before or after a command; SUPPRESS keeps a command's unset flags
    # from overwriting ones given before it.
    common = _flags(argparse.SUPPRESS)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument(
        "--config.check",
        dest="config_check",
        action="store_true",
        help="validate the configuration and exit (status 2 if it is invalid)",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.add_parser(
        "check",
        parents=[common],
        help="collect once and print a report: lock table, idle holders, waiters, top "
        "applications (exit status 1 if a server cannot be reached)",
    )
    rules = commands.add_parser(
        "rules",
        help="print the alert rules, with your thresholds (see the README's Alerts section)",
    )
    rules.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a threshold, e.g. leaked_lock_after=30m (repeatable; names in the README)",
    )
    rules.add_argument("--thresholds", type=Path, help="a YAML file of threshold overrides")
    rules.add_argument(
        "--format",
        choices=("rules", "prometheusrule"),
        default="rules",
        help="a Prometheus rule file, or a PrometheusRule for prometheus-operator",
    )
    rules.add_argument("--name", default="pg-advisory-exporter", help="PrometheusRule name")
    rules.add_argument("--namespace", help="PrometheusRule namespace")
    rules.add_argument(
        "--label",
        dest="labels",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a PrometheusRule label, e.g. release=kube-prometheus-stack (repeatable)",
    )
    demo = commands.add_parser(
        "demo",
        help="start a throwaway PostgreSQL, play the advisory lock scenarios on it and export them",
    )
    demo.add_argument(
        "--web.listen-address",
        dest="web_listen_address",
        metavar="VALUE",
        default=DEMO_LISTEN_ADDRESS,
        help=f"address to listen on (default {DEMO_LISTEN_ADDRESS})",
    )
    demo.add_argument(
        "--pg-version", type=int, default=DEFAULT_MAJOR, help="PostgreSQL major version"
    )
    return parser


def _reader(args: argparse.Namespace) -> Callable[[], Config]:
    """Loads the configuration; a reload calls it again to reread the file."""
    flags = read_flags({field: getattr(args, field) for field in FLAG_NAMES})
    env = read_environment()
    return lambda: load(flags, env)


def run_daemon(config: Config, reread: Callable[[], Config]) -> int:
    try:
        daemon = Daemon(config, reread)
    except OSError as exc:
        log.error(
            "cannot listen", extra={"address": config.web.listen_address, "error": exc.strerror}
        )
        return 1

    # Handlers run in the main thread, which serve_forever() occupies: hand work off.
    def stop(signum: int, _frame: FrameType | None) -> None:
        log.info("shutting down", extra={"signal": signal.Signals(signum).name})
        threading.Thread(target=daemon.shutdown, daemon=True).start()

    def reload(_signum: int, _frame: FrameType | None) -> None:
        threading.Thread(target=daemon.reload, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGHUP, reload)
    daemon.serve_forever()
    return 0


def _print_rules(args: argparse.Namespace, argv: list[str]) -> int:
    try:
        thresholds = thresholds_from(args.thresholds, args.settings)
    except ConfigError as exc:
        print(f"pg-advisory-exporter: configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    if args.format == "rules":
        document = rule_groups(thresholds)
    else:
        labels = dict(label.partition("=")[::2] for label in args.labels)
        document = prometheus_rule(thresholds, args.name, args.namespace, labels)
    given = argv[argv.index("rules") + 1 :]  # recorded in the file, so it can be redone
    print(dump(document, "".join(f" {shlex.quote(arg)}" for arg in given)), end="")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    if args.command == "rules":
        return _print_rules(args, argv)
    if args.command == "demo":
        return run_demo(args.pg_version, args.web_listen_address)
    try:
        reread = _reader(args)
        config = reread()
    except ConfigError as exc:
        print(f"pg-advisory-exporter: configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    if args.config_check:
        names = ", ".join(t.name for t in config.targets)
        print(f"configuration is valid: {len(config.targets)} target(s): {names}")
        return 0
    logs.setup(config.log.level, config.log.format)
    if args.command == "check":
        return run_check(config)
    return run_daemon(config, reread)


if __name__ == "__main__":
    sys.exit(main())
