"""An untyped handler that tells whether pydantic is loaded in the worker running it: a worker
without typed kinds must never import it (the extra is optional)."""

from __future__ import annotations

import sys

from skiplock import task


@task("probe.pydantic")
def probe(ctx, payload):
    return {"pydantic_loaded": "pydantic" in sys.modules}
