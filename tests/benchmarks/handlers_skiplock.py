"""skiplock handler module for ``skiplock worker --tasks tests.benchmarks.handlers_skiplock``.

``bench.noop``, that only records latency when the payload carries ``t0``; and no-op kinds that
tests/benchmarks/flow_control.py puts under limits.
"""

from __future__ import annotations

from skiplock import task

from tests.benchmarks import latency

KIND = "bench.noop"


@task(KIND)
def noop(ctx, payload):  # noqa: ANN001, ANN201 - the engine's handler signature
    latency.record(payload)
    return None


# flow_control.py's kinds, under limits
KEYED = "bench.keyed"
LIMITED = [f"bench.limited.{i:02d}" for i in range(50)]


def limited_noop(ctx, payload):  # noqa: ANN001, ANN201
    return None


for _kind in [KEYED, *LIMITED]:
    task(_kind)(limited_noop)
