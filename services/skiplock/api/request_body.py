"""Reading a request body: its size bounded before parsing, UTF-8 JSON without NaN or Infinity,
nesting no deeper than Postgres and Python can take, and strings Postgres can store.

It checks no field (schema.py does, against the declared shapes); nothing here knows about
routes, auth or the database, and it imports neither Flask nor werkzeug.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from ..engine.errors import InvalidInput, PayloadTooLarge

# Nesting deeper than this is refused before it reaches Python's recursion limit or Postgres's
# stack depth (jsonb is parsed recursively there too).
MAX_DEPTH = 64


def _no_constants(name: str):
    raise InvalidInput(f"body: {name} is not JSON (numbers must be finite)")


def _check_depth_and_text(value: Any) -> None:
    """Refuse nesting deeper than MAX_DEPTH and strings Postgres cannot store as UTF-8 (lone
    surrogates like \\ud800, which json.loads accepts). Iterative: no recursion to exhaust."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            _check_text(item)
        elif isinstance(item, (dict, list)):
            if depth > MAX_DEPTH:
                raise InvalidInput(f"body: nested deeper than {MAX_DEPTH} levels")
            if isinstance(item, dict):
                for key, child in item.items():
                    _check_text(key)
                    stack.append((child, depth + 1))
            else:
                stack.extend((child, depth + 1) for child in item)


def _check_text(text: str) -> None:
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidInput("body: a string holds a lone UTF-16 surrogate (not valid Unicode)") from None


def parse_json(raw: bytes) -> Any:
    """Decode a request body as JSON; InvalidInput naming why not."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInput("body: not UTF-8 text") from None
    try:
        value = json.loads(text, parse_constant=_no_constants)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"body: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except RecursionError:
        raise InvalidInput(f"body: nested deeper than {MAX_DEPTH} levels") from None
    except ValueError:  # Python refuses to convert integer literals this long (CVE-2020-10735)
        raise InvalidInput(f"body: an integer literal has more than {sys.get_int_max_str_digits()} digits") from None
    _check_depth_and_text(value)
    return value


def read_body(stream, content_length: int | None, max_bytes: int) -> bytes:
    """The raw body, refused with 413 when Content-Length (or, without one, the bytes read)
    exceeds `max_bytes`: nothing larger is read into memory or parsed."""
    if content_length is not None and content_length > max_bytes:
        raise PayloadTooLarge(f"request body is {content_length} bytes; the limit is {max_bytes}")
    raw = stream.read(max_bytes + 1)
    if len(raw) > max_bytes:
        raise PayloadTooLarge(f"request body is over the limit of {max_bytes} bytes")
    return raw
