"""The worker's half of the recipe: `SKIPLOCK_TASKS=tasks skiplock worker`, run in this directory."""

from __future__ import annotations

from skiplock import task


@task("shop.send_receipt")
def send_receipt(ctx, payload):
    # A real handler would send the email here. Marking the receipt sent in ctx.transaction()
    # commits together with the task's completion: both happen, or neither does.
    with ctx.transaction() as conn:
        conn.execute("UPDATE orders SET receipt_sent_at = now() WHERE id = %s", (payload["order_id"],))
    return {"order_id": payload["order_id"]}
