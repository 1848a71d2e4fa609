"""Handlers whose failures and logs an operator diagnoses (tests/acceptance/test_failure_diagnosis.py)."""

from __future__ import annotations

import asyncio
import logging

from skiplock import task


def _lookup(mapping, key):
    return mapping[key]


@task("d.keyerror", max_attempts=2, retry_base=0.01, retry_cap=0.02)
def keyerror(ctx, payload):
    ctx.log.info("looking up", extra={"key": "b"})
    return _lookup(payload, "b")


def _descend(depth: int):
    if depth == 0:
        raise RuntimeError("at the bottom")
    return _descend(depth - 1)


@task("d.deep", max_attempts=1)
def deep(ctx, payload):
    return _descend(int(payload["depth"]))


@task("d.async_logs")
async def async_logs(ctx, payload):
    await asyncio.sleep(0.01)
    ctx.log.warning("async handler says hello")
    logging.getLogger("some.library").warning("a library logs from inside the handler")
    return None


@task("d.seven", max_attempts=7)
def seven(ctx, payload):
    return None
