"""The enqueuer's W3C trace context is stored with each task (tasks.trace_context), on every insert
path, and handed to the worker with its claim; without OpenTelemetry nothing is imported."""

from __future__ import annotations

import subprocess
import sys

import pytest
from opentelemetry.sdk.trace import TracerProvider

import skiplock
from skiplock.engine.store import Store

TRACER = TracerProvider().get_tracer("test")  # a provider of our own: the global one stays unset


def stored(db, ids) -> list:
    rows = dict(db.execute("SELECT id, trace_context FROM skiplock.tasks WHERE id = ANY(%s)", (list(ids),)).fetchall())
    return [rows[i] for i in ids]


def traceparent(span) -> str:
    ctx = span.get_span_context()
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"


@pytest.mark.parametrize("path", ["one", "arrays", "copy", "dependent"])
def test_every_insert_path_stores_the_current_span_as_parent(db_url, db, path):
    parent = skiplock.enqueue(db_url, "t.noop", {}) if path == "dependent" else None
    with TRACER.start_as_current_span("request") as span:
        if path == "one":
            ids = [skiplock.enqueue(db_url, "t.noop", {})]
        elif path == "arrays":
            ids = skiplock.enqueue_many(db_url, "t.noop", [{}] * 3, idempotency_keys=["a", "b", "c"])
        elif path == "copy":
            ids = skiplock.enqueue_many(db_url, "t.noop", [{"i": i} for i in range(200)])
        else:
            ids = skiplock.enqueue_many(db_url, "t.noop", [{}] * 2, depends_on=[parent])
    contexts = stored(db, ids)
    assert contexts == [{"traceparent": traceparent(span)}] * len(ids)
    # outside any span: nothing stored
    assert stored(db, [skiplock.enqueue(db_url, "t.noop", {})]) == [None]


def test_the_claim_hands_the_context_to_the_worker(db_url, db):
    store = Store.pooled(db_url, worker_connections=True).open()
    try:
        with TRACER.start_as_current_span("request") as span:
            task_id = skiplock.enqueue(db_url, "t.noop", {})
        plain = skiplock.enqueue(db_url, "t.noop", {})
        claimed = {t.id: t for t in store.tasks.task_claim(["default"], 10, "w1", 30)}
    finally:
        store.close()
    assert claimed[task_id].trace_context == {"traceparent": traceparent(span)}
    assert claimed[plain].trace_context is None


def test_enqueue_without_opentelemetry_imports_none_of_it(db_url):
    code = ("import sys, skiplock; skiplock.enqueue(sys.argv[1], 't.noop', {}); "
            "skiplock.enqueue_many(sys.argv[1], 't.noop', [{}] * 100); "
            "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))")
    out = subprocess.run([sys.executable, "-c", code, db_url], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
