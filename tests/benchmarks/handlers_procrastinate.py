"""Procrastinate app for ``procrastinate --app tests.benchmarks.handlers_procrastinate.app worker``.

Uses Procrastinate's psycopg 3 connector on ``$BENCH_DB_URL`` and one async task, ``bench.noop``,
that only records latency when its keyword arguments carry ``t0``.
"""

from __future__ import annotations

import os

import procrastinate

from tests.benchmarks import latency

TASK_NAME = "bench.noop"

app = procrastinate.App(
    connector=procrastinate.PsycopgConnector(conninfo=os.environ.get("BENCH_DB_URL", "")),
)


@app.task(name=TASK_NAME, queue="default")
async def noop(**payload: object) -> None:
    latency.record(payload)
