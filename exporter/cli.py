"""The `pg-advisory-exporter` command: the daemon, `check` and `rules`."""

from __future__ import annotations

import argparse
import logging
import shlex
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import FrameType

from . import __version__, logs, revision
from .alerting.rules import dump, prometheus_rule, rule_groups, thresholds_from
from .config.loader import load
from .config.settings import Config
from .config.sources import SETTINGS, Setting
from .daemon import Daemon
from .http.web_config import WebSettings, read_web_config
from .report import run_check
from .validation import ConfigError

log = logging.getLogger(__name__)

EXIT_CONFIG = 2


def _flags(default: object, settings: Iterable[Setting] = SETTINGS) -> argparse.ArgumentParser:
    flags = argparse.ArgumentParser(add_help=False)
    for setting in settings:
        help_text = setting.help.replace("%", "%%")  # argparse expands %(default)s and the like
        if setting.switch:
            flags.add_argument(
                setting.flag, dest=setting.dest, action="store_const", const=True,
                default=default, help=help_text,
            )  # fmt: skip
        else:
            flags.add_argument(
                setting.flag, dest=setting.dest, metavar="VALUE", default=default, help=help_text
            )
    return flags


class _Version(argparse.Action):
    """`--version`: the version and, where known, the source revision. Found when asked, not
    when the parser is built: from a checkout, finding it runs git."""

    def __init__(self, option_strings: Sequence[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        print(f"{parser.prog} {revision.describe(__version__)}")
        parser.exit()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pg-advisory-exporter",
        description="Prometheus exporter for PostgreSQL advisory locks.",
        parents=[_flags(None)],
    )
    # Flags may come before or after a command; SUPPRESS keeps a command's unset flags
    # from overwriting ones given before it. `check` serves nothing: no web flags.
    check_flags = _flags(argparse.SUPPRESS, (s for s in SETTINGS if s.block != "web"))
    parser.add_argument("--version", action=_Version, help="print the version and exit")
    parser.add_argument(
        "--config.check",
        dest="config_check",
        action="store_true",
        help="validate the configuration and exit (status 2 if it is invalid)",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    check = commands.add_parser(
        "check",
        parents=[check_flags],
        help="collect once and print a report: lock table, waiters and their blockers, "
        "holders, top applications (exit status 1 if a server cannot be reached)",
    )
    check.add_argument(
        "--format",
        dest="output",
        choices=("text", "json"),
        default="text",
        help="text for a person, or one JSON document: a list of the targets",
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
        help="a threshold, e.g. leaked_lock_after=30m (repeatable; names in docs/alerting.md)",
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
    return parser


def _reader(args: argparse.Namespace) -> Callable[[], Config]:
    """Loads the configuration; a reload calls it again to reread the file."""
    flags = {setting.dest: getattr(args, setting.dest) for setting in SETTINGS}
    return lambda: load(flags)


def run_daemon(config: Config, reread: Callable[[], Config], web: WebSettings | None) -> int:
    try:
        daemon = Daemon(config, reread, web)
    except OSError as exc:
        log.error(
            "cannot listen",
            extra={"address": config.web.listen_address, "error": exc.strerror or str(exc)},
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
    try:
        reread = _reader(args)
        config = reread()
        # Read apart from the rest: it is watched and reloaded on its own, as in Go.
        web_file = config.web.config_file
        web = None if web_file is None else read_web_config(web_file)
    except ConfigError as exc:
        print(f"pg-advisory-exporter: configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    if args.config_check:
        names = ", ".join(t.name for t in config.targets)
        print(f"configuration is valid: {len(config.targets)} target(s): {names}")
        for note in config.notes:
            print(f"note: {note}")
        # Valid, but what the daemon would start with down (exit status 0: a Secret may be
        # mounted only where it runs).
        for warning in config.warnings:
            print(f"warning: {warning}")
        if config.auth_modules:
            print(f"auth modules for discovered targets: {', '.join(config.auth_modules)}")
        if web is not None:
            print(f"web configuration is valid: {web.summary}")
        return 0
    logs.setup(config.log.level, config.log.format)
    if args.command == "check":
        return run_check(config, output=args.output)
    return run_daemon(config, reread, web)


if __name__ == "__main__":
    sys.exit(main())
