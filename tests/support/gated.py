"""A task handler that holds its slot until the test releases it, for tests that need tasks in
flight for as long as they look: it returns once the file named by payload['gate'] exists."""

from __future__ import annotations

import time
from pathlib import Path

from skiplock import Fail, task


@task("t.gated")
def gated(ctx, payload):
    gate = Path(payload["gate"])
    deadline = time.monotonic() + float(payload.get("most_seconds", 60))
    while not gate.exists():
        if time.monotonic() > deadline:
            raise Fail(f"never released: {gate} does not exist")
        time.sleep(0.01)
    return None
