"""skiplock handler module for ``skiplock worker --tasks tests.benchmarks.handlers_skiplock``.

One task kind, ``bench.noop``, that only records latency when the payload carries ``t0``.
"""

from __future__ import annotations

from skiplock import task

from tests.benchmarks import latency

KIND = "bench.noop"


@task(KIND)
def noop(ctx, payload):  # noqa: ANN001, ANN201 - the engine's handler signature
    latency.record(payload)
    return None
