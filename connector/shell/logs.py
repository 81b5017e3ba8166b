"""Log output: plain text lines (the default) or one JSON object a line (``--log-format
json``, for log collectors), both on stderr."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, TextIO

from connector.core.errors import UsageError

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
_MARK = "_connector_handler"  # set on the handler configure_logging installs
CHATTY = ("apscheduler.executors",)
"""Loggers that write a line per routine event at INFO (APScheduler: two per job run, 7,200
lines an hour at a 1-second poll). Below ``--log-level debug`` they log warnings and errors
only (a job that raised, a run missed)."""

# The attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD = frozenset(
    vars(logging.LogRecord("", logging.INFO, "", 0, "", None, None)).keys()
    | {"message", "asctime", "taskName"}
)


def record_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The JSON object of one record: time (UTC, ISO 8601), level, logger, message, the
    extras the call passed (ids such as ``org``, ``outbox_id``, ``crm_id``), and the
    traceback as ``exc_info`` when there is one."""
    fields: dict[str, Any] = {
        "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
        "level": record.levelname,
        "logger": record.name,
        "message": record.getMessage(),
    }
    for key, value in vars(record).items():
        if key not in _STANDARD and not key.startswith("_") and key not in fields:
            fields[key] = value
    if record.exc_info:
        fields["exc_info"] = logging.Formatter().formatException(record.exc_info)
    if record.stack_info:
        fields["stack_info"] = record.stack_info
    return fields


class JsonFormatter(logging.Formatter):
    """One line of JSON per record (values JSON cannot hold are written as text)."""

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(record_fields(record), default=str, ensure_ascii=False)


def log_format_from(arg: str | None, env: Mapping[str, str]) -> str:
    """``--log-format``, else ``$CONNECTOR_LOG_FORMAT``, else text."""
    value = (arg or env.get("CONNECTOR_LOG_FORMAT") or "text").strip().lower()
    if value not in FORMATS:
        source = "--log-format" if arg else "CONNECTOR_LOG_FORMAT"
        raise UsageError(f"{source}: {value!r} is not one of {', '.join(FORMATS)}")
    return value


def configure_logging(level: str, fmt: str, stream: TextIO | None = None) -> None:
    """Send every logger's records (uvicorn's too: its servers are built with
    ``log_config=None``) to ``stream`` (stderr) in ``fmt``, at ``level`` (``CHATTY`` loggers
    at warning unless the level is debug).

    Like ``logging.basicConfig``, it leaves alone a process whose logging someone else set up
    already (a test runner calling ``main`` in-process); a handler it installed itself is
    replaced."""
    try:
        numeric = logging.getLevelNamesMapping()[level.upper()]
    except KeyError:
        raise UsageError(f"--log-level: {level!r} is not a logging level") from None
    root = logging.getLogger()
    ours = [h for h in root.handlers if getattr(h, _MARK, False)]
    if len(ours) != len(root.handlers):
        return
    for old in ours:
        root.removeHandler(old)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    setattr(handler, _MARK, True)
    root.addHandler(handler)
    root.setLevel(numeric)
    for name in CHATTY:
        logging.getLogger(name).setLevel(
            logging.NOTSET if numeric <= logging.DEBUG else max(numeric, logging.WARNING)
        )
