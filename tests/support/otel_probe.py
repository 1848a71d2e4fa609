"""A handler that tells which OpenTelemetry modules the worker running it has loaded: a worker
of an application that does not trace must load none (the extra is optional, its cost nil)."""

from __future__ import annotations

import sys

from skiplock import task


@task("probe.otel")
def probe(ctx, payload):
    return {"modules": sorted(m for m in sys.modules if m.startswith("opentelemetry"))}
