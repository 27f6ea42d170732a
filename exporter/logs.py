"""Log lines in logfmt or JSON, the two formats Prometheus exporters write."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "error": logging.ERROR,
}
_LEVEL_NAMES = {logging.DEBUG: "debug", logging.INFO: "info", logging.WARNING: "warn"}
# Attributes every LogRecord has; anything else was passed with extra= and is a field.
_RECORD_ATTRIBUTES = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
        "level": _LEVEL_NAMES.get(record.levelno, "error"),
        "logger": record.name,
        "msg": record.getMessage(),
    }
    fields.update((k, v) for k, v in vars(record).items() if k not in _RECORD_ATTRIBUTES)
    if record.exc_info:
        fields["exception"] = logging.Formatter().formatException(record.exc_info)
    return fields


def _logfmt_value(value: object) -> str:
    text = str(value)
    if text and not any(c in text for c in ' ="\\\n\t') and text.isprintable():
        return text
    return json.dumps(text, ensure_ascii=False)


class LogfmtFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return " ".join(f"{key}={_logfmt_value(value)}" for key, value in _fields(record).items())


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(_fields(record), ensure_ascii=False, default=str)


class Changes:
    """What was last said of each lasting state (a server's error, a pooler's, a missing
    privilege), so that a line is written when the state changes and not at each collection:
    a fleet of servers that stay down must not flood the log."""

    def __init__(self) -> None:
        self._states: dict[str, object] = {}

    def changed(self, what: str, state: object, initial: object = None) -> bool:
        """Record `state` of `what`; whether it differs from the one before (`initial` at
        first)."""
        previous = self._states.get(what, initial)
        self._states[what] = state
        return state != previous


def setup(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else LogfmtFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(_LEVELS[level])
    # psycopg logs connection attempts at INFO in some versions; keep its detail at debug.
    logging.getLogger("psycopg").setLevel(max(_LEVELS[level], logging.WARNING))
