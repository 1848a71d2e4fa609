"""A role's tracer provider from OpenTelemetry's own variables (docs/TRACING.md): the one place
skiplock imports the OpenTelemetry SDK, and only when OTEL_TRACES_EXPORTER asks for an exporter.
The spans themselves are tracing.py's."""

from __future__ import annotations

import os
from collections.abc import Mapping

from .errors import ConfigError

_EXPORTER_PACKAGES = {"otlp": "opentelemetry-exporter-otlp", "otlp_proto_grpc": "opentelemetry-exporter-otlp-proto-grpc",
                      "otlp_proto_http": "opentelemetry-exporter-otlp-proto-http", "zipkin": "opentelemetry-exporter-zipkin"}


def setup_from_environment(role: str, environ: Mapping[str, str] = os.environ) -> bool:
    """At a role's start-up: when OTEL_TRACES_EXPORTER names exporters (otlp, console, ...) and
    no tracer provider is set yet (by `opentelemetry-instrument` or the application's tasks
    module), set a global SDK TracerProvider exporting to them in batches; the SDK reads the
    other OTEL_* variables itself (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES,
    OTEL_TRACES_SAMPLER, OTEL_BSP_*, OTEL_EXPORTER_OTLP_*). Without the variable (or with
    `none`, or OTEL_SDK_DISABLED=true) it imports nothing. True when it set a provider; a
    missing package is one ConfigError line."""
    names = [n.strip() for n in environ.get("OTEL_TRACES_EXPORTER", "").split(",") if n.strip()]
    if not names or names == ["none"] or environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    setting = f"OTEL_TRACES_EXPORTER={environ['OTEL_TRACES_EXPORTER']}"
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        raise ConfigError(f"{setting}: the OpenTelemetry SDK is not installed "
                          "(pip install 'skiplock[otel]')") from None
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return False  # the application set one: its exporters, not ours
    from importlib.metadata import entry_points

    exporters = []
    for name in dict.fromkeys(names):
        if name == "none":
            continue
        found = entry_points(group="opentelemetry_traces_exporter", name=name)
        if not found:
            package = _EXPORTER_PACKAGES.get(name)
            hint = f"pip install {package}" if package else "no installed package provides it"
            raise ConfigError(f"{setting}: no trace exporter named {name!r} is installed ({hint})")
        try:
            exporters.append(next(iter(found)).load()())
        except Exception as exc:  # noqa: BLE001 - an exporter's own configuration error, in one line
            raise ConfigError(f"{setting}: the {name} exporter cannot start: {exc}".splitlines()[0]) from None
    named = "OTEL_SERVICE_NAME" in environ or "service.name=" in environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
    attributes = {} if named else {SERVICE_NAME: f"skiplock-{role}"}
    provider = TracerProvider(resource=Resource.create(attributes))  # shut down (flushed) at exit
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return True
