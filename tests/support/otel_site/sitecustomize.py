"""Tracing for any process started with this directory on PYTHONPATH and TEST_SPANS_FILE set, the
way `opentelemetry-instrument` gives a tracer provider to a program that knows nothing of it."""

import os

if os.environ.get("TEST_SPANS_FILE"):
    from tests.support.span_files import install

    install(os.environ["TEST_SPANS_FILE"], os.environ.get("TEST_SERVICE_NAME", "skiplock-test"))
