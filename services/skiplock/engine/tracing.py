"""OpenTelemetry, where the application uses it (the `otel` extra; docs/TRACING.md).

skiplock never imports OpenTelemetry itself: a process that has not imported it has no tracer
provider to report to, so every function here first looks in sys.modules and returns at once.
That keeps the cost nil for the processes that do not trace.
"""

from __future__ import annotations

import sys

_TRACE_API = "opentelemetry.trace"


def current_carrier() -> dict[str, str] | None:
    """The current span's W3C trace context, {'traceparent': ..., 'tracestate': ...} (tracestate
    only when there is one), to store with a task enqueued now; None when OpenTelemetry is not
    loaded or no valid span is current."""
    if _TRACE_API not in sys.modules:
        return None
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    if not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier or None
