"""One-line excerpts of anyone's text (a webhook receiver's error body, a step's result), for
places that show it to operators: a task's last_error, a table cell, a console page. Control
characters (newlines, escapes a terminal would obey, bidirectional overrides) become spaces and
runs of space one, so an excerpt can neither break a line nor restyle what shows it.
"""

from __future__ import annotations

import json
from typing import Any


def excerpt(text: str, chars: int) -> str:
    """At most `chars` printable characters of `text`, on one line; cut ones end with `...`."""
    text = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return text if len(text) <= chars else text[:chars - 3] + "..."


def json_excerpt(value: Any, chars: int) -> str:
    """A JSON value as compact JSON text, excerpted."""
    return excerpt(json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str), chars)
