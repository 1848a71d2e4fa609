"""The bounds of durable execution, shared by the worker (ctx.step, ctx.sleep, ctx.wait_for_*),
the library's send_signal, the API and the CLI: one place, so that each says the same line.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import uuid
from typing import Any

from .errors import InvalidInput, PayloadTooLarge

# a step's or a signal's name, in characters
MAX_NAME = 200
# records (steps and waits) per task: a handler that loops forever on ctx.sleep should enqueue its
# next round as a new task instead
MAX_STEPS_PER_TASK = 10_000
# why a suspended task waits (tasks.suspended, migration 0020): ctx.sleep, ctx.wait_for_signal,
# ctx.wait_for_tasks
SUSPENDED_REASONS = ("sleep", "signal", "tasks")


def check_name(what: str, name: Any) -> str:
    """`name` as a step or signal name, or InvalidInput saying why not."""
    if not isinstance(name, str):
        raise InvalidInput(f"{what} name {name!r}: must be a string")
    if not 1 <= len(name) <= MAX_NAME:
        raise InvalidInput(f"{what} name must be 1-{MAX_NAME} characters (got {len(name)})")
    if "\x00" in name:
        raise InvalidInput(f"{what} name contains a NUL character, which Postgres cannot store")
    return name


def _default(value: Any) -> Any:
    # ids from ctx.enqueue are what a step most often returns
    if isinstance(value, uuid.UUID):
        return str(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def encode_json(what: str, value: Any, max_bytes: int) -> tuple[str, Any]:
    """`value` as JSON text and as it reads back (a UUID becomes its string), or InvalidInput /
    PayloadTooLarge saying why not. A run gets back what a later run will read: never a value
    that only the first run saw."""
    try:
        text = json.dumps(value, allow_nan=False, separators=(",", ":"), default=_default)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"{what} is not JSON-serializable: {exc}") from None
    except RecursionError:
        raise InvalidInput(f"{what} is not JSON-serializable: it refers to itself, or nests too deep") from None
    if "\\u0000" in text:
        raise InvalidInput(f"{what} contains a NUL character (\\u0000), which Postgres jsonb cannot store")
    size = len(text) if text.isascii() else len(text.encode("utf-8"))
    if size > max_bytes:
        raise PayloadTooLarge(f"{what} is {size} bytes; the limit is {max_bytes} (SKIPLOCK_MAX_PAYLOAD_BYTES)")
    return text, json.loads(text)


def check_seconds(what: str, seconds: Any) -> float:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or math.isnan(seconds) \
            or math.isinf(seconds) or seconds < 0:
        raise InvalidInput(f"{what} {seconds!r}: must be a finite number of seconds >= 0")
    return float(seconds)


def check_when(when: Any) -> dt.datetime:
    if not isinstance(when, dt.datetime) or when.tzinfo is None:
        raise InvalidInput(f"sleep_until {when!r}: must be a timezone-aware datetime")
    return when
