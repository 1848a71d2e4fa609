"""Handlers of a worker whose tasks module sets up OpenTelemetry itself (one of the two ways
docs/TRACING.md gives a worker a tracer provider), writing its spans to TEST_SPANS_FILE."""

from __future__ import annotations

import os

from skiplock import task
from tests.support import span_files

span_files.install(os.environ[span_files.SPANS_FILE], "skiplock-worker")


@task("trace.ok")
def ok(ctx, payload):
    if payload.get("child"):
        ctx.enqueue("trace.child", {})  # enqueued inside the run's span: the trace goes on
    return {"ok": True}


@task("trace.flaky", retry_base=0.05, retry_cap=0.1)
def flaky(ctx, payload):
    if ctx.attempt == 1:
        raise ValueError("the first attempt fails")
    return None


@task("trace.child")
def child(ctx, payload):
    return None


@task("trace.async")
async def in_event_loop(ctx, payload):
    from opentelemetry import trace

    # the run's span is current inside the coroutine too
    return {"span_id": trace.get_current_span().get_span_context().span_id}
