"""OpenTelemetry traces across real processes, with the real SDK: the enqueuer's span is the
parent of each run of the task in a `skiplock worker`, of each webhook delivery of a `skiplock
dispatcher` (whose receiver gets `traceparent`), and of the tasks a handler enqueues; `skiplock
api` honours an incoming `traceparent`; each fire of `skiplock scheduler` starts a trace.

The traced processes get their tracer provider as an application gives one: the worker from its
tasks module (tests/support/traced_handlers.py), the others from a sitecustomize, as
`opentelemetry-instrument` does (tests/support/otel_site/). Each writes its spans, one JSON line
each, to a file of its own. This test process traces with a provider of its own, never the
global one, so nothing it runs in-process is traced.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import pytest
from opentelemetry.sdk.trace import TracerProvider

import skiplock
from tests.acceptance.test_api_process import wait_ready
from tests.integration.test_api import TOKEN_CONFIG, TOKENS
from tests.integration.test_webhooks import add_endpoint, complete, dispatcher
from tests.support import span_files
from tests.support.harness import ROOT, free_port, wait_for

TRACER = TracerProvider().get_tracer("test")
OTEL_SITE = str(ROOT / "tests" / "support" / "otel_site")
LOCAL = {"SKIPLOCK_WEBHOOK_ALLOWED_NETWORKS": "127.0.0.0/8"}


def traced(spans_file, **env) -> dict:
    """The environment of a process traced through the sitecustomize."""
    return {"PYTHONPATH": OTEL_SITE + os.pathsep + str(ROOT), span_files.SPANS_FILE: str(spans_file), **env}


def traceparent(span) -> str:
    ctx = span.get_span_context()
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"


def ids_of(span) -> tuple[str, str]:
    """(trace id, span id) of a span of this process, as the console exporter writes them."""
    ctx = span.get_span_context()
    return span_files.hex_id(ctx.trace_id, 32), span_files.hex_id(ctx.span_id, 16)


def header_ids(value: str) -> tuple[str, str]:
    """(trace id, parent span id) of a traceparent header, as the console exporter writes them."""
    _, trace_id, span_id, _ = value.split("-")
    return "0x" + trace_id, "0x" + span_id


def states(db) -> dict[str, int]:
    return dict(db.execute("SELECT state, count(*) FROM skiplock.tasks GROUP BY state").fetchall())


def runs_of(spans: list[dict], task_id) -> list[dict]:
    found = [s for s in spans if s["attributes"].get("messaging.message.id") == str(task_id)]
    return sorted(found, key=lambda s: s["attributes"]["skiplock.task.attempt"])


def test_a_trace_goes_from_the_enqueuer_through_each_run_to_the_webhook(db_url, db, store, processes, receiver,
                                                                        tmp_path):
    _, recorder = add_endpoint(store, receiver, "/hook", events=("task.completed",))
    with TRACER.start_as_current_span("checkout") as checkout:
        ok = skiplock.enqueue(db_url, "trace.ok", {"child": True})
        flaky = skiplock.enqueue(db_url, "trace.flaky", {})
        in_loop = skiplock.enqueue(db_url, "trace.async", {})
    plain = skiplock.enqueue(db_url, "trace.ok", {})  # outside any span
    trace_id, checkout_id = ids_of(checkout)

    worker_file, dispatcher_file = tmp_path / "worker.jsonl", tmp_path / "dispatcher.jsonl"
    processes.spawn(db_url, tasks="tests.support.traced_handlers", env={span_files.SPANS_FILE: worker_file})
    processes.spawn(db_url, command="dispatcher", env=traced(dispatcher_file, **LOCAL))
    wait_for(lambda: states(db) == {"completed": 5}, 60, message="the five tasks to complete")
    wait_for(lambda: len(recorder.requests) == 5, 60, message="a delivery of each task.completed")
    child = db.execute("SELECT id FROM skiplock.tasks WHERE kind = 'trace.child'").fetchone()[0]
    worker = span_files.read(worker_file)
    wait_for(lambda: len(span_files.read(dispatcher_file)) == 5, 30, message="the dispatcher's five spans")

    # each run: a consumer span of the messaging conventions, child of the enqueuing span
    [run] = runs_of(worker, ok)
    assert run["name"] == "process default" and run["kind"] == "SpanKind.CONSUMER"
    assert (run["context"]["trace_id"], run["parent_id"]) == (trace_id, checkout_id)
    assert run["status"]["status_code"] == "OK"
    assert {k: run["attributes"][k] for k in ("messaging.system", "messaging.destination.name",
                                              "messaging.operation.type", "skiplock.task.kind",
                                              "skiplock.task.attempt")} == {
        "messaging.system": "skiplock", "messaging.destination.name": "default",
        "messaging.operation.type": "process", "skiplock.task.kind": "trace.ok", "skiplock.task.attempt": 1}
    # a retried task: two runs in the same trace, the first an error with its exception
    first, second = runs_of(worker, flaky)
    assert [(s["context"]["trace_id"], s["parent_id"]) for s in (first, second)] == [(trace_id, checkout_id)] * 2
    assert [s["status"]["status_code"] for s in (first, second)] == ["ERROR", "OK"]
    [event] = first["events"]
    assert event["name"] == "exception" and event["attributes"]["exception.type"] == "ValueError"
    assert event["attributes"]["exception.message"] == "the first attempt fails"
    # what a handler enqueues is a child of its run; an async handler's run is current in it
    [child_run] = runs_of(worker, child)
    assert (child_run["context"]["trace_id"], child_run["parent_id"]) == (trace_id, run["context"]["span_id"])
    [async_run] = runs_of(worker, in_loop)
    assert async_run["parent_id"] == checkout_id
    assert db.execute("SELECT result FROM skiplock.tasks WHERE id = %s", (in_loop,)).fetchone()[0] == {
        "span_id": int(async_run["context"]["span_id"], 16)}
    # a task enqueued outside any span: its run starts a trace
    [plain_run] = runs_of(worker, plain)
    assert plain_run["parent_id"] is None and plain_run["context"]["trace_id"] != trace_id

    # each delivery: a client span, child of the task's context, whose id the receiver gets
    sent = {r["body"]["data"]["task_id"]: r["headers"] for r in recorder.requests}
    assert all(r["verified"] for r in recorder.requests)  # the signature covers the body alone
    posts = {s["context"]["span_id"]: s for s in span_files.read(dispatcher_file)}
    for task_id, parent in ((ok, checkout_id), (flaky, checkout_id), (child, run["context"]["span_id"])):
        header_trace, header_parent = header_ids(sent[str(task_id)]["Traceparent"])
        post = posts[header_parent]
        assert (header_trace, post["parent_id"]) == (trace_id, parent)
        assert post["name"] == "POST" and post["kind"] == "SpanKind.CLIENT"
        assert post["attributes"]["http.response.status_code"] == 200
        assert post["attributes"]["url.full"] == f"http://127.0.0.1:{receiver.port}/hook"
    plain_post = posts[header_ids(sent[str(plain)]["Traceparent"])[1]]
    assert plain_post["parent_id"] is None and plain_post["context"]["trace_id"] != trace_id


def test_a_dispatcher_that_does_not_trace_forwards_the_tasks_traceparent(db_url, store, receiver):
    _, recorder = add_endpoint(store, receiver, "/hook", events=("task.completed",))
    with TRACER.start_as_current_span("checkout") as checkout:
        traced_task = complete(store, db_url)
    untraced_task = complete(store, db_url)
    with dispatcher(store) as d:  # this process has no tracer provider
        assert d.run_once() == {"delivered": 2}
    sent = {r["body"]["data"]["task_id"]: r["headers"] for r in recorder.requests}
    assert sent[str(traced_task)]["Traceparent"] == traceparent(checkout)
    assert "Traceparent" not in sent[str(untraced_task)]
    assert "opentelemetry.sdk.trace" in sys.modules  # this test's own: yet skiplock made no span of it


def start_api(processes, db_url, env=None) -> httpx.Client:
    port = free_port()
    proc = processes.spawn(db_url, "--bind", f"127.0.0.1:{port}", "--workers", "1", command="api",
                           env={"SKIPLOCK_API_TOKENS": TOKEN_CONFIG, **(env or {})})
    base = f"http://127.0.0.1:{port}"
    wait_ready(proc, base)
    return httpx.Client(base_url=base, headers={"Authorization": f"Bearer {TOKENS['submitter']}"}, timeout=30)


INCOMING = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_the_api_honours_an_incoming_traceparent(db_url, db, processes, tmp_path):
    def submit(api, headers) -> dict | None:
        r = api.post("/v1/tasks", json={"kind": "t.noop"}, headers=headers)
        assert r.status_code == 201, r.text
        return db.execute("SELECT trace_context FROM skiplock.tasks WHERE id = %s", (r.json()["id"],)).fetchone()[0]

    # an API that does not trace stores the caller's context as it came (and loads no OpenTelemetry)
    plain = start_api(processes, db_url)
    incoming = {"traceparent": INCOMING, "tracestate": "vendor=abc"}
    assert submit(plain, incoming) == incoming
    assert submit(plain, {"traceparent": "00-" + "0" * 32 + "-00f067aa0ba902b7-01"}) is None  # invalid: dropped
    assert submit(plain, {}) is None

    # an API with a tracer provider: a server span of the request, child of the caller's
    spans_file = tmp_path / "api.jsonl"
    traced_api = start_api(processes, db_url, traced(spans_file))
    stored = submit(traced_api, {"traceparent": INCOMING})
    trace_id, server_id = header_ids(stored["traceparent"])
    assert trace_id == header_ids(INCOMING)[0]
    server = wait_for(lambda: [s for s in span_files.read(spans_file) if s["context"]["span_id"] == server_id],
                      30, message="the request's server span")[0]
    assert (server["name"], server["kind"], server["parent_id"]) == (
        "POST /v1/tasks", "SpanKind.SERVER", header_ids(INCOMING)[1])
    assert server["attributes"]["http.response.status_code"] == 201
    assert submit(traced_api, {})["traceparent"] != stored["traceparent"]  # no caller's context: a trace of its own


def test_each_scheduled_fire_starts_a_trace_of_its_own(db_url, db, processes, tmp_path):
    schedules = tmp_path / "schedules.yaml"
    schedules.write_text("schedules:\n  - {name: tick, kind: t.noop, interval_seconds: 1, overlap: allow}\n")
    spans_file = tmp_path / "scheduler.jsonl"
    processes.spawn(db_url, command="scheduler", env=traced(spans_file, SKIPLOCK_SCHEDULES_FILE=schedules))
    rows = wait_for(lambda: (lambda r: r if len(r) >= 2 else None)(db.execute(
        "SELECT id, trace_context FROM skiplock.tasks ORDER BY id").fetchall()), 60, message="two fires")
    contexts = [header_ids(context["traceparent"]) for _, context in rows[:2]]
    assert contexts[0][0] != contexts[1][0]  # a trace per fire
    spans = {s["context"]["span_id"]: s for s in span_files.read(spans_file)}
    for (trace_id, span_id), (task_id, _) in zip(contexts, rows):
        fire = spans[span_id]
        assert (fire["context"]["trace_id"], fire["parent_id"], fire["kind"]) == (trace_id, None, "SpanKind.PRODUCER")
        assert fire["attributes"]["skiplock.schedule.name"] == "tick"
        assert fire["attributes"]["messaging.message.id"] == str(task_id)  # the task this fire created


def test_a_worker_of_an_application_that_does_not_trace_loads_no_opentelemetry(db_url, db, processes):
    task_id = skiplock.enqueue(db_url, "probe.otel", {})
    processes.spawn(db_url, tasks="tests.support.otel_probe")
    wait_for(lambda: db.execute("SELECT state FROM skiplock.tasks WHERE id = %s", (task_id,)).fetchone()[0]
             == "completed", 60, message="the probe to complete")
    assert db.execute("SELECT result FROM skiplock.tasks WHERE id = %s", (task_id,)).fetchone()[0] == {"modules": []}


# ---- setup_from_environment: what a role does at start-up with OTEL_TRACES_EXPORTER --------------

SETUP = """
import json, sys
from skiplock.engine import tracing_setup as tracing
from skiplock.engine.errors import SkiplockError
try:
    configured = tracing.setup_from_environment("worker")
except SkiplockError as exc:
    print("error:", exc)
    raise SystemExit(2)
loaded = sorted(m for m in sys.modules if m.startswith("opentelemetry"))
if configured:
    from opentelemetry import trace
    with trace.get_tracer("probe").start_as_current_span("probe"):
        pass
    trace.get_tracer_provider().shutdown()
print(json.dumps({"configured": configured, "loaded": bool(loaded)}))
"""


def run_setup(env: dict, prelude: str = "") -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return subprocess.run([sys.executable, "-c", prelude + SETUP], env={**base, **env}, capture_output=True,
                          text=True, timeout=60, cwd=ROOT)


@pytest.mark.parametrize("env", [{}, {"OTEL_TRACES_EXPORTER": "none"},
                                 {"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"}])
def test_without_an_exporter_setup_imports_nothing(env):
    out = run_setup(env)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"configured": False, "loaded": False}


def test_the_console_exporter_from_the_environment():
    out = run_setup({"OTEL_TRACES_EXPORTER": "console"})
    assert out.returncode == 0, out.stderr
    decoder, text, spans = json.JSONDecoder(), out.stdout, []
    while text.strip():
        value, end = decoder.raw_decode(text.lstrip())
        spans.append(value)
        text = text.lstrip()[end:]
    probe, result = spans
    assert result == {"configured": True, "loaded": True}
    assert probe["name"] == "probe" and probe["resource"]["attributes"]["service.name"] == "skiplock-worker"
    named = run_setup({"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "billing-worker"})
    assert '"service.name": "billing-worker"' in named.stdout


@pytest.mark.parametrize("env, prelude, message", [
    ({"OTEL_TRACES_EXPORTER": "otlp"}, "",
     "error: OTEL_TRACES_EXPORTER=otlp: no trace exporter named 'otlp' is installed "
     "(pip install opentelemetry-exporter-otlp)"),
    ({"OTEL_TRACES_EXPORTER": "console,jaeger"}, "",
     "error: OTEL_TRACES_EXPORTER=console,jaeger: no trace exporter named 'jaeger' is installed "
     "(no installed package provides it)"),
    ({"OTEL_TRACES_EXPORTER": "console"}, "import sys; sys.modules['opentelemetry.sdk'] = None\n",
     "error: OTEL_TRACES_EXPORTER=console: the OpenTelemetry SDK is not installed "
     "(pip install 'skiplock[otel]')"),
])
def test_a_missing_package_is_one_line(env, prelude, message):
    out = run_setup(env, prelude)
    assert (out.returncode, out.stdout, out.stderr) == (2, message + "\n", "")
