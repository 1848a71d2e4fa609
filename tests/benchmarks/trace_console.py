"""One trace, printed by OpenTelemetry's console exporter: a span of this process enqueues a task,
a `skiplock worker` runs it, a `skiplock dispatcher` sends its task.completed webhook to a receiver
here. The worker and the dispatcher get their tracer provider from OTEL_TRACES_EXPORTER=console.
A demonstration for docs/TRACING.md, not a test:

    .venv/bin/python -m tests.benchmarks.trace_console [--server postgresql://postgres@127.0.0.1/postgres]

It makes a throwaway database on the server and drops it at the end. It prints every span of the
trace as the exporters wrote them, in the order they started, then the traceparent the receiver got.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from skiplock import task

ROOT = Path(__file__).resolve().parents[2]

# a role started the usual way, after setting up the SDK from OTEL_* (a no-op when its own
# start-up already did)
LAUNCH = ("import sys; from skiplock.engine import tracing_setup; tracing_setup.setup_from_environment(sys.argv[1]); "
          "from skiplock.cli import main; sys.exit(main(sys.argv[1:]))")


@task("demo.charge")
def charge(ctx, payload):
    return {"charged": payload["amount"]}


class Receiver(BaseHTTPRequestHandler):
    traceparents: list[str] = []

    def do_POST(self):  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("content-length", 0)))
        Receiver.traceparents.append(self.headers.get("traceparent", "(none)"))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


def spans_in(text: str) -> list[dict]:
    """The console exporter's spans (indented JSON objects) among a process's output."""
    decoder, spans, i = json.JSONDecoder(), [], 0
    while (i := text.find("{\n", i)) >= 0:
        value, end = decoder.raw_decode(text, i)
        if isinstance(value, dict) and "context" in value:
            spans.append(value)
        i = end
    return spans


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default=os.environ.get("SKIPLOCK_TEST_DATABASE_URL",
                                                           "postgresql://postgres@127.0.0.1:5432/postgres"))
    args = parser.parse_args()

    import psycopg
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

    import skiplock
    from skiplock.engine.store import Store
    from skiplock.engine.webhooks import generate_secret

    name = f"skiplock_trace_demo_{os.getpid()}"
    with psycopg.connect(args.server, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    url = psycopg.conninfo.make_conninfo(args.server, dbname=name)
    own = io.StringIO()
    provider = TracerProvider(resource=Resource.create({"service.name": "shop-web"}))
    provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(out=own)))
    trace.set_tracer_provider(provider)
    receiver = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    procs, logs = [], Path(tempfile.mkdtemp())
    try:
        skiplock.migrate(url)
        store = Store.pooled(url).open()
        try:
            store.webhooks.webhook_endpoint_insert(f"http://127.0.0.1:{receiver.server_port}/hooks",
                                                   ["task.completed"], generate_secret())
        finally:
            store.close()
        with trace.get_tracer("shop").start_as_current_span("POST /checkout"):
            task_id = skiplock.enqueue(url, "demo.charge", {"amount": 42})
        env = {**{k: v for k, v in os.environ.items() if not k.startswith(("SKIPLOCK_", "OTEL_"))},
               "SKIPLOCK_DATABASE_URL": url, "SKIPLOCK_TASKS": "tests.benchmarks.trace_console",
               "SKIPLOCK_LOG_LEVEL": "WARNING", "SKIPLOCK_METRICS_PORT": "0",
               "SKIPLOCK_WEBHOOK_ALLOWED_NETWORKS": "127.0.0.0/8", "PYTHONPATH": str(ROOT),
               "OTEL_TRACES_EXPORTER": "console", "OTEL_BSP_SCHEDULE_DELAY": "100"}
        for role in ("worker", "dispatcher"):
            with open(logs / f"{role}.out", "wb") as out:
                procs.append(subprocess.Popen([sys.executable, "-c", LAUNCH, role], cwd=ROOT, stdout=out,
                                              stderr=subprocess.STDOUT, env=env))
        deadline = time.monotonic() + 60
        while not Receiver.traceparents and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(30)
        receiver.shutdown()
        provider.shutdown()
        with psycopg.connect(args.server, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    spans = spans_in(own.getvalue())
    for role in ("worker", "dispatcher"):
        spans += spans_in((logs / f"{role}.out").read_text())
    [trace_id] = {s["context"]["trace_id"] for s in spans if s["name"] == "POST /checkout"}
    for span in sorted((s for s in spans if s["context"]["trace_id"] == trace_id), key=lambda s: s["start_time"]):
        print(json.dumps(span, indent=4))
    print(f"task {task_id}: the receiver got traceparent {', '.join(Receiver.traceparents) or '(nothing)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
