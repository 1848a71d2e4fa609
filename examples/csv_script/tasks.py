"""The worker's half of the recipe: `SKIPLOCK_TASKS=tasks skiplock worker`, run in this directory."""

from __future__ import annotations

from skiplock import task


@task("shop.import_order")
def import_order(ctx, payload):
    # The order is written in ctx.transaction(), which commits together with the task's
    # completion: a run that fails, or is retried after a crash, leaves no half-imported row.
    with ctx.transaction() as conn:
        order_id = conn.execute("INSERT INTO orders (reference, item, quantity) "
                                "VALUES (%(reference)s, %(item)s, %(quantity)s) RETURNING id", payload).fetchone()[0]
    return {"order_id": order_id}
