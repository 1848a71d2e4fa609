"""The shop's Django tasks. `skiplock worker --django shop.settings` (or `manage.py
skiplock_worker`) imports this module, as each installed app's `tasks`, and runs them.

Each is a skiplock task whose kind is its module path (`orders.tasks.send_receipt`): that is the
name the console, the CLI, the metrics and `skiplock schedules` use.
"""

from django.tasks import task
from django.utils import timezone

from .models import Order, Stock


@task(queue_name="emails")
def send_receipt(order_id):
    # A real task would send the email here. The ORM's write commits on its own (not with the
    # task's completion): marking twice is harmless, as a retried task may.
    Order.objects.filter(id=order_id, receipt_sent_at__isnull=True).update(receipt_sent_at=timezone.now())
    return {"order_id": order_id}


@task
async def stock_report(item):
    """An async task: the worker awaits it on its event loop; the ORM's async API works in it."""
    stock = await Stock.objects.aget(item=item)
    return {"item": item, "available": stock.available}


class ErpUnavailable(Exception):
    """The ERP did not answer: worth trying again."""


@task(takes_context=True, max_attempts=3, retry_base=0.2, retry_cap=0.5)
def sync_to_erp(context, order_id, fail_times=0):
    """Retried with backoff (this task's own options; the backend's OPTIONS give the default):
    each failed attempt is in the result's errors, and context.attempt counts the tries."""
    if context.attempt <= fail_times:
        raise ErpUnavailable(f"ERP down (attempt {context.attempt})")
    return {"order_id": order_id, "attempt": context.attempt, "result_id": context.task_result.id}


class PaymentDeclined(Exception):
    """The card was refused: trying again will not help."""


@task
def charge(order_id, amount):
    """Raises for a large amount: with MAX_ATTEMPTS 1 (the example's OPTIONS) it fails at once."""
    if amount > 1000:
        raise PaymentDeclined(f"order {order_id}: {amount} is over the card's limit")
    return {"order_id": order_id, "charged": amount}
