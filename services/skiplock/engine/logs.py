"""Logging to stdout, one JSON object per line (or plain text for humans).

Extra fields passed with `extra={...}` appear as keys of the JSON object (text: `key=value` after
the message). While a handler runs, every record logged in its thread or asyncio task, by any
logger, carries the task's `task_id`, `kind`, `queue` and `attempt` (see current_task).

No line shows a URL's userinfo or query string, or a libpq `password=`, whoever logged it: libpq
URLs carry passwords and webhook URLs access tokens (`scrub`, applied to every formatted line).
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
import sys
import time

from .outage import PoolWarnings

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}

# The task a handler runs for (a model.ClaimedTask): set by the worker around the handler call.
# A context variable, so that it follows the handler's own thread, and each async handler's
# asyncio task, and no other. The task itself, not its fields: those are built only when a
# record is logged, not for every task run.
current_task: contextvars.ContextVar = contextvars.ContextVar("skiplock_task", default=None)


def log_task_failed(logger: logging.Logger, *, task_id, kind: str, queue: str, attempts: int,
                    error: str | None) -> None:
    """The one line for a task that failed for good, from the worker or a reclaim alike; its
    traceback, if any, is in its 'failed' event. The error is kept on one line."""
    text = (error or "").replace("\r", "\\r").replace("\n", "\\n")
    logger.error("task failed", extra={"task_id": str(task_id), "kind": kind, "queue": queue,
                                       "attempts": attempts, "error": text})


_URL = re.compile(r"""(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^\s/?#@"'<>\\]*@)?"""
                  r"""(?P<rest>[^\s?#"'<>\\]*)(?P<query>\?[^\s#"'<>\\]*)?""")
_PASSWORD = re.compile(r"(?i)\b(password|passwd)(\s*=\s*)('[^']*'|[^\s'\",;&]+)")


def _scrub_url(match: re.Match) -> str:
    return (match["scheme"] + ("***@" if match["userinfo"] else "") + match["rest"]
            + ("?..." if match["query"] else ""))


def scrub(text: str) -> str:
    """`text` without URL userinfo, URL query strings and `password=...`-style values."""
    if "://" in text:
        text = _URL.sub(_scrub_url, text)
    if "=" in text:
        text = _PASSWORD.sub(lambda m: m[1] + m[2] + "***", text)
    return text


class TaskFields(logging.Filter):
    """Stamps records logged while a handler runs with its task's fields. A field the call
    passed itself in `extra` wins."""

    def filter(self, record: logging.LogRecord) -> bool:
        task = current_task.get()
        if task is not None:
            fields = record.__dict__
            fields.setdefault("task_id", str(task.id))
            fields.setdefault("kind", task.kind)
            fields.setdefault("queue", task.queue)
            fields.setdefault("attempt", task.attempt)
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return scrub(json.dumps(entry, default=str))


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s%(extras)s")

    def format(self, record: logging.LogRecord) -> str:
        extras = {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")
                  and k != "extras"}
        record.extras = "".join(f" {k}={v}" for k, v in extras.items())
        return scrub(super().format(record))


def setup(fmt: str = "json", level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(TaskFields())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # psycopg's pool is chatty at INFO about reconnects we already log ourselves, and warns at
    # each failed attempt: the outage's one line says it instead (engine/outage.py)
    pool_log = logging.getLogger("psycopg.pool")
    pool_log.setLevel(logging.WARNING)
    if not any(isinstance(f, PoolWarnings) for f in pool_log.filters):
        pool_log.addFilter(PoolWarnings())
    # httpx logs every request's full URL at INFO, httpcore every header at DEBUG: a webhook's
    # access token would be in the logs at any level below WARNING
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(logging.WARNING)
