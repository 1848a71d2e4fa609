"""Finished spans of a test's processes, one JSON object per line in a file of each process's own.

`install(path)` sets the global tracer provider of the process it runs in, as an application does
(its tasks module) or as `opentelemetry-instrument` does (otel_site/sitecustomize.py): the real
SDK, its console exporter writing each span as it ends (no batch to flush, so a process stopped by
a signal loses nothing), one line per span. `read(paths)` parses what they wrote.
"""

from __future__ import annotations

import json
from pathlib import Path

SPANS_FILE = "TEST_SPANS_FILE"  # the variable naming a process's file


def install(path: str, service: str = "skiplock-test") -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

    out = open(path, "a", buffering=1)  # noqa: SIM115 - open for the life of the process
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(SimpleSpanProcessor(
        ConsoleSpanExporter(out=out, formatter=lambda span: span.to_json(indent=None) + "\n")))
    trace.set_tracer_provider(provider)


def read(*paths: Path) -> list[dict]:
    spans = []
    for path in paths:
        if Path(path).exists():
            spans += [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return spans


def hex_id(value: int, width: int) -> str:
    """An id as the console exporter shows it ('0x' + lower-case hex)."""
    return f"0x{value:0{width}x}"
