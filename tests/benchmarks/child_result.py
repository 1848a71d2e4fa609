"""How a benchmark child process reports back: its last stdout line is one JSON object,
{"ok": true, ...measurements} or {"ok": false, "error": "..."}; run.py reads it."""

from __future__ import annotations

import json
import traceback
from collections.abc import Callable


def report(measure: Callable[[], dict]) -> int:
    """Run `measure()`, print its result line, return the exit code."""
    try:
        result = measure()
    except Exception as exc:  # reported to the orchestrator, which marks the cell `error`
        traceback.print_exc()
        print(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"}))
        return 1
    print(json.dumps({"ok": True, **result}))
    return 0
