"""The API's answers as Flask responses: a JSON body (times as render.iso writes them), the one
error shape every failure goes through (`error_response()`), and a keyset page. What the bodies
hold is render.py's, which the `skiplock` commands share and which imports no Flask.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from typing import Any

from flask import Response

from ..engine.errors import SkiplockError
from .render import iso


def _default(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return iso(value)
    if isinstance(value, uuid.UUID):
        return str(value)
    raise TypeError(f"cannot render {type(value).__name__}")


def json_response(body: Any, status: int = 200, headers: dict | None = None) -> Response:
    text = json.dumps(body, default=_default, separators=(",", ":"))
    return Response(text + "\n", status=status, headers=headers, mimetype="application/json")


def error_response(exc: SkiplockError, headers: dict | None = None) -> Response:
    """The one error shape: {"error": {"code": ..., "message": ...}} with the error's status."""
    message = " ".join(str(exc).split()) or exc.code
    return json_response({"error": {"code": exc.code, "message": message}}, exc.status, headers)


def page_response(items_name: str, rows: list, limit: int, to_json) -> Response:
    """A keyset page from `limit + 1` rows fetched: the extra row only says another page exists;
    the cursor is the last shown row's id."""
    more = len(rows) > limit
    rows = rows[:limit]
    return json_response({items_name: [to_json(r) for r in rows],
                          "next_cursor": str(rows[-1].id) if more else None})
