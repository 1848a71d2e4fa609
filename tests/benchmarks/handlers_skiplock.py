"""skiplock handler module for ``skiplock worker --tasks tests.benchmarks.handlers_skiplock``.

``bench.noop``, that only records latency when the payload carries ``t0``; no-op kinds that
tests/benchmarks/flow_control.py puts under limits; and tests/benchmarks/durable.py's durable ones.
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


# durable.py's kinds: three recorded no-op steps, and one step_transaction of one tiny INSERT
# (into public.bench_step_rows, made by durable.py in its template)
STEPS = "bench.steps"
STEP_TRANSACTION = "bench.step_transaction"


def _nothing(i):  # noqa: ANN001, ANN202
    return i


@task(STEPS)
def three_steps(ctx, payload):  # noqa: ANN001, ANN201
    for i in range(3):
        ctx.step(f"s{i}", _nothing, i)
    return None


def _insert_one(conn, task_id):  # noqa: ANN001, ANN202
    return conn.execute("INSERT INTO public.bench_step_rows (task_id) VALUES (%s)", (task_id,)).rowcount


@task(STEP_TRANSACTION)
def one_step_transaction(ctx, payload):  # noqa: ANN001, ANN201
    ctx.step_transaction("insert", _insert_one, ctx.task_id)
    return None
