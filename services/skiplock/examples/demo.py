"""Example handlers used by `skiplock dev` and the README: one plain task, one multi-step task
that checkpoints a cursor, one that fails now and then and is retried, one that fails for good
(so the console's failed view has a task to look at, retry and purge), and a durable order
workflow that waits for a signal and sleeps."""

from __future__ import annotations

import random
import time

from skiplock import Fail, Retry, Step, task


@task("demo.hello")
def hello(ctx, payload):
    time.sleep(0.05)
    return {"greeting": f"hello {payload.get('name', 'world')}", "attempt": ctx.attempt}


@task("demo.report", timeout=60)
def report(ctx, payload):
    """Processes `pages` pages, one per run, saving the cursor after each."""
    page = ctx.cursor or 0
    pages = int(payload.get("pages", 5))
    time.sleep(0.2)  # the work for one page
    page += 1
    if page < pages:
        return Step(cursor=page, progress=page / pages, message=f"page {page}/{pages}")
    return {"pages": pages}


@task("demo.flaky", max_attempts=5, retry_base=0.5, retry_cap=5)
def flaky(ctx, payload):
    if random.random() < 0.5:
        raise Retry(message="the downstream said 503")  # backoff with full jitter
    return {"ok": True, "attempt": ctx.attempt}


@task("demo.refund")
def refund(ctx, payload):
    """Fails for good at once: a permanent error is not retried."""
    raise Fail(f"refund of order {payload.get('order', 1)} refused: the charge is older than 180 days")


@task("demo.order")
def order(ctx, payload):
    """Durable execution: charge (a recorded step), wait up to 15 s for the signal
    `demo.order-N.shipped` (`skiplock signals send demo.order-1.shipped`), sleep 3 s holding no
    worker, then send the reminder (a step). Each run starts from the top; recorded steps return
    their results."""
    n = payload.get("order", 1)
    charge = ctx.step("charge", lambda: {"charge": f"ch_{n}", "cents": 1299})
    shipped = ctx.wait_for_signal(f"demo.order-{n}.shipped", timeout=15)
    ctx.sleep(3)
    ctx.step("remind", lambda: {"reminded": True})
    return {"charge": charge["charge"], "shipped": shipped is not None}
