"""Typed task handlers for tests/integration/test_typed_payloads.py: `@task(payload=Model)`. Each
returns what it received, so a test reads from the task's result that its handler got a model
instance, with the payload's values validated (coerced, defaults filled in)."""

from __future__ import annotations

import sys

from skiplock import task
from tests.support.typed_models import Order


def received(order) -> dict:
    return {"type": type(order).__name__, "is_order": isinstance(order, Order), "order_id": order.order_id,
            "qty": order.qty, "city": order.address.city if order.address else None,
            "pydantic_loaded": "pydantic" in sys.modules}


# max_attempts=5: a payload its model refuses must fail at its first attempt all the same
@task("typed.order", payload=Order, max_attempts=5, retry_base=0.05, retry_cap=0.1)
def ship(ctx, order: Order):
    return received(order)


@task("typed.order_async", payload=Order, max_attempts=5, retry_base=0.05, retry_cap=0.1)
async def ship_async(ctx, order: Order):
    return received(order)
