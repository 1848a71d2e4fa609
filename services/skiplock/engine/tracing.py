"""OpenTelemetry, where the process uses it (the `otel` extra; docs/TRACING.md).

All of skiplock's knowledge of OpenTelemetry is here. skiplock never imports it on its own
initiative: a process that has not imported it has no tracer provider to report to, so every
function first looks in sys.modules and returns at once (or hands back a shared no-op). That
keeps the cost nil for the processes that do not trace. A role's start-up may set up the SDK
first (tracing_setup.py), when OTEL_TRACES_EXPORTER asks for an exporter.

What is traced, with OpenTelemetry's messaging and HTTP conventions:
- an enqueue stores the current span's W3C context with the task (`current_carrier`, model.TaskSpec);
- each run of a handler is a CONSUMER span "process <queue>", a child of that stored context
  (`task_run`): a retry, a reclaim or a step is another run, so another span of the same trace;
- each webhook delivery attempt is a CLIENT span "POST", a child of the task's context, and sends
  `traceparent` to the receiver (`delivery`);
- each schedule fire starts a trace of its own (`schedule_fire`);
- the API takes the caller's `traceparent` as the context of the request (`request_begin`).

Without OpenTelemetry, a `traceparent` still passes through: the API stores the caller's as the
task's, and the dispatcher forwards a task's stored one, so a trace is not cut by a skiplock
process that does not trace.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any


_TRACE_API = "opentelemetry.trace"
_SCOPE = "skiplock"
SYSTEM = "skiplock"  # messaging.system

# W3C Trace Context: version-traceid-parentid-flags, lower-case hex, no all-zero ids; version 00
# has exactly these four fields (a later version may append more)
_TRACEPARENT = re.compile(r"(?!ff)([0-9a-f]{2})-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}(-.*)?")
_TRACEPARENT_MAX, _TRACESTATE_MAX = 512, 512

# the caller's W3C context, while a request of an API that does not trace is served
_incoming: ContextVar[dict[str, str] | None] = ContextVar("skiplock_incoming_trace", default=None)


def current_carrier() -> dict[str, str] | None:
    """The current span's W3C trace context, {'traceparent': ..., 'tracestate': ...} (tracestate
    only when there is one), to store with a task enqueued now; None when OpenTelemetry is not
    loaded or no valid span is current (but the API's caller's when it served one)."""
    if _TRACE_API not in sys.modules:
        return _incoming.get()
    from opentelemetry import trace

    if not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    _propagator().inject(carrier)
    return carrier or None


def _propagator():
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator()


_tracers: dict[int, Any] = {}


def _tracer():
    """skiplock's tracer from the global tracer provider, or None when OpenTelemetry is not
    loaded or no provider is set (a span would record nothing)."""
    if _TRACE_API not in sys.modules:
        return None
    from opentelemetry import trace

    provider = trace.get_tracer_provider()
    if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
        return None
    tracer = _tracers.get(id(provider))
    if tracer is None:
        from .version import package_version

        tracer = _tracers[id(provider)] = provider.get_tracer(_SCOPE, package_version())
    return tracer


def _parent(carrier: Mapping[str, str] | None):
    """The context a span continues: the stored W3C one, or an empty context (a new trace),
    never whatever happens to be current on this thread."""
    from opentelemetry.context import Context

    return _propagator().extract(carrier) if carrier else Context()


def _error_type(text: str | None) -> str:
    """error.type from an outcome's error text: the exception's class name ('ValueError: ...')."""
    head = (text or "").split(":", 1)[0].strip()
    return head if head.isidentifier() else "_OTHER"


def _class_name(exc: BaseException) -> str:
    """error.type of an exception: its class's full name (a builtin's plain name)."""
    cls = type(exc)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


# -- the worker: one span per run of a handler ----------------------------------------------------

class _NoRun:
    """A run without a span: what task_run returns when nothing traces."""

    __slots__ = ()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None

    def settled(self, settlement, exc: BaseException | None = None, *, retry_asked: bool = False):
        return settlement


_NO_RUN = _NoRun()


class _TracedRun:
    __slots__ = ("tracer", "task", "span", "token")

    def __init__(self, tracer, task):
        self.tracer, self.task = tracer, task

    def __enter__(self):
        from opentelemetry import context, trace

        task = self.task
        self.span = self.tracer.start_span(
            f"process {task.queue}", context=_parent(task.trace_context), kind=trace.SpanKind.CONSUMER,
            attributes={"messaging.system": SYSTEM, "messaging.operation.name": "process",
                        "messaging.operation.type": "process", "messaging.destination.name": task.queue,
                        "messaging.message.id": str(task.id), "skiplock.task.kind": task.kind,
                        "skiplock.task.attempt": task.attempt})
        # current while the handler runs: the tasks it enqueues join the trace as its children
        self.token = context.attach(trace.set_span_in_context(self.span))
        return self

    def settled(self, settlement, exc: BaseException | None = None, *, retry_asked: bool = False):
        """Set the span's status from the run's outcome; returns `settlement`. `retry_asked`: `exc`
        is the handler's Retry, a request rather than an error (not recorded as an exception)."""
        from opentelemetry.trace import Status, StatusCode

        span, outcome = self.span, settlement.outcome
        span.set_attribute("skiplock.task.outcome", outcome)
        if outcome in ("completed", "step"):
            span.set_status(Status(StatusCode.OK))
            return settlement
        if exc is not None and not retry_asked:
            span.record_exception(exc)
        span.set_attribute("error.type", _class_name(exc) if exc is not None else _error_type(settlement.error))
        span.set_status(Status(StatusCode.ERROR, (settlement.error or outcome)[:500]))
        return settlement

    def __exit__(self, exc_type, exc, tb) -> None:
        from opentelemetry import context
        from opentelemetry.trace import Status, StatusCode

        try:
            if exc is not None:  # the executor lets nothing out; a crash of its own, then
                self.span.record_exception(exc)
                self.span.set_status(Status(StatusCode.ERROR, f"{exc_type.__name__}: {exc}"[:500]))
        finally:
            self.span.end()
            context.detach(self.token)


def task_run(task):
    """A context manager around one run of `task`'s handler (a ClaimedTask): a consumer span,
    current while the handler runs, whose parent is the enqueuer's stored context. `settled(s,
    exc)` on what it yields sets the status from the Settlement. A shared no-op when nothing
    traces."""
    if _TRACE_API not in sys.modules:  # the common case, first: one lookup per run
        return _NO_RUN
    tracer = _tracer()
    return _NO_RUN if tracer is None else _TracedRun(tracer, task)


# -- the dispatcher: one client span per delivery attempt ----------------------------------------

class _Untraced:
    """A delivery without a span: it forwards the task's stored context as it is."""

    __slots__ = ("headers",)

    def __init__(self, carrier: Mapping[str, str] | None):
        self.headers = dict(carrier) if carrier else {}

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None

    def sent(self, attempt):
        return attempt


_NO_DELIVERY = _Untraced(None)


class _TracedDelivery:
    __slots__ = ("span", "headers")

    def __init__(self, tracer, carrier, url: str, event_type: str, delivery_id: str, attempt: int):
        from opentelemetry import trace

        self.span = tracer.start_span(
            "POST", context=_parent(carrier), kind=trace.SpanKind.CLIENT,
            attributes={"http.request.method": "POST", "url.full": url, "skiplock.delivery.id": delivery_id,
                        "skiplock.delivery.attempt": attempt, "skiplock.event.type": event_type})
        self.headers: dict[str, str] = {}
        _propagator().inject(self.headers, trace.set_span_in_context(self.span))

    def __enter__(self):
        return self

    def sent(self, attempt):
        """Record what the attempt (dispatcher.Attempt) got back; returns it."""
        from opentelemetry.trace import Status, StatusCode

        span = self.span
        if attempt.status is not None:
            span.set_attribute("http.response.status_code", attempt.status)
        if attempt.status is None or attempt.status >= 400:
            span.set_attribute("error.type", str(attempt.status) if attempt.status is not None
                               else _error_type(attempt.error))
            span.set_status(Status(StatusCode.ERROR, (attempt.error or "")[:500]))
        return attempt

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc is not None:
            self.span.record_exception(exc)
        self.span.end()


def delivery(carrier: Mapping[str, str] | None, *, url: str, event_type: str, delivery_id: str, attempt: int):
    """A context manager around one delivery attempt of a task's event: a client span, child of
    the task's stored context. What it yields has `headers` (traceparent, tracestate) for the
    request and `sent(attempt)`. Not tracing, the headers are the task's own context (none for a
    task enqueued outside any span). `url` must be fit to show (no secrets)."""
    tracer = _tracer()
    if tracer is None:
        return _Untraced(carrier) if carrier else _NO_DELIVERY
    return _TracedDelivery(tracer, carrier, url, event_type, delivery_id, attempt)


# -- the scheduler: a new trace per fire ---------------------------------------------------------

class _UntracedFire:
    """A fire when nothing traces: no context for the task, nothing to name."""

    carrier = None

    def __enter__(self) -> "_UntracedFire":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        return None

    def created(self, task_id) -> None:
        return None


_NO_FIRE = _UntracedFire()


class _TracedFire:
    __slots__ = ("tracer", "name", "queue", "nominal_at", "span", "token", "carrier")

    def __init__(self, tracer, name: str, queue: str, nominal_at):
        self.tracer, self.name, self.queue, self.nominal_at = tracer, name, queue, nominal_at

    def __enter__(self) -> "_TracedFire":
        from opentelemetry import context, trace

        self.span = self.tracer.start_span(
            f"create {self.queue}", context=_parent(None), kind=trace.SpanKind.PRODUCER,
            attributes={"messaging.system": SYSTEM, "messaging.operation.name": "create",
                        "messaging.operation.type": "create", "messaging.destination.name": self.queue,
                        "skiplock.schedule.name": self.name, "skiplock.schedule.nominal_at": self.nominal_at.isoformat()})
        self.token = context.attach(trace.set_span_in_context(self.span))
        self.carrier = current_carrier()
        return self

    def created(self, task_id) -> None:
        """The task this fire inserted: its id on the span, as a worker's span carries it."""
        self.span.set_attribute("messaging.message.id", str(task_id))

    def __exit__(self, exc_type, exc, tb) -> None:
        from opentelemetry import context

        try:
            if exc is not None:
                self.span.record_exception(exc)
        finally:
            self.span.end()
            context.detach(self.token)


def schedule_fire(name: str, queue: str, nominal_at):
    """A context manager around one fire of a schedule: a root span (each fire is a trace of its
    own). It yields the fire: its `carrier`, the W3C context to store with the fired task (None
    when nothing traces), and `created(task_id)`, which names the task on the span."""
    tracer = _tracer()
    return _NO_FIRE if tracer is None else _TracedFire(tracer, name, queue, nominal_at)


# -- the API: the caller's context -----------------------------------------------------------------

def _valid_incoming(headers: Mapping[str, str]) -> dict[str, str] | None:
    parent = (headers.get("traceparent") or "").strip()
    match = _TRACEPARENT.fullmatch(parent) if len(parent) <= _TRACEPARENT_MAX else None
    if match is None or (match.group(1) == "00" and match.group(2)):
        return None
    carrier = {"traceparent": parent}
    state = (headers.get("tracestate") or "").strip()
    if state and len(state) <= _TRACESTATE_MAX and state.isascii() and state.isprintable():
        carrier["tracestate"] = state
    return carrier


class _Request:
    __slots__ = ("token", "span", "method", "attached")

    def __init__(self, token, span=None, method: str = "", attached: bool = True):
        # attached: the token is OpenTelemetry's (context.attach), else _incoming's
        self.token, self.span, self.method, self.attached = token, span, method, attached


def request_begin(headers: Mapping[str, str], method: str) -> _Request | None:
    """Enter the context of an API request: the caller's `traceparent` (and tracestate), so that
    the tasks it enqueues continue the caller's trace; with a tracer provider, inside a SERVER
    span of this request. Returns what request_end takes, or None when there is nothing to end."""
    if _TRACE_API not in sys.modules:
        carrier = _valid_incoming(headers) if headers.get("traceparent") else None
        return None if carrier is None else _Request(_incoming.set(carrier), attached=False)
    from opentelemetry import context, trace

    parent = _propagator().extract(headers)
    tracer = _tracer()
    if tracer is None:  # no spans of ours, but the caller's context is the current one
        return _Request(context.attach(parent))
    span = tracer.start_span(method, context=parent, kind=trace.SpanKind.SERVER,
                             attributes={"http.request.method": method})
    return _Request(context.attach(trace.set_span_in_context(span, parent)), span, method)


def request_end(request: _Request | None, route: str | None = None, status: int | None = None) -> None:
    """Leave the context request_begin entered; `route` and `status` name and end its span."""
    if request is None:
        return
    if not request.attached:
        _incoming.reset(request.token)
        return
    from opentelemetry import context

    span = request.span
    try:
        if span is not None:
            from opentelemetry.trace import Status, StatusCode

            if route:
                span.update_name(f"{request.method} {route}")
                span.set_attribute("http.route", route)
            if status is not None:
                span.set_attribute("http.response.status_code", status)
                if status >= 500:
                    span.set_attribute("error.type", str(status))
                    span.set_status(Status(StatusCode.ERROR))
            span.end()
    finally:
        context.detach(request.token)
