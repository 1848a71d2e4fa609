"""PgQueuer worker factory for ``pgq run tests.benchmarks.handlers_pgqueuer:create``.

Connects with asyncpg (PgQueuer's primary driver) to ``$BENCH_DB_URL`` and registers one
entrypoint, ``bench.noop``, that only records latency when the payload carries ``t0``.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
from pgqueuer import PgQueuer
from pgqueuer.db import AsyncpgDriver
from pgqueuer.models import Job

from tests.benchmarks import latency

ENTRYPOINT = "bench.noop"


@asynccontextmanager
async def create() -> AsyncIterator[PgQueuer]:
    connection = await asyncpg.connect(os.environ["BENCH_DB_URL"])
    pgq = PgQueuer(AsyncpgDriver(connection))

    @pgq.entrypoint(ENTRYPOINT)
    async def noop(job: Job) -> None:
        latency.record(json.loads(job.payload) if job.payload else None)

    try:
        yield pgq
    finally:
        await connection.close()
