"""POST /orders: the order, its receipt task and the stock update in one transaction."""

import json

from django.db import IntegrityError, connection, transaction
from django.db.models import F
from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

import skiplock

from .models import Order, Stock


@csrf_exempt  # a JSON API for the example; a form view keeps Django's CSRF protection
@require_POST
def place_order(request):
    body = json.loads(request.body)
    try:
        with transaction.atomic():
            order = Order.objects.create(item_id=body["item"], quantity=body["quantity"])
            # Django's own psycopg connection, in the atomic block's transaction: the task row is
            # written in it, so it commits or rolls back with the order (no on_commit hook)
            connection.ensure_connection()
            task_id = skiplock.enqueue(connection.connection, "shop.send_receipt", {"order_id": order.id})
            Stock.objects.filter(item=body["item"]).update(available=F("available") - order.quantity)
    except IntegrityError:
        # not enough in stock (or no such item): the order and its task were rolled back together
        return JsonResponse({"error": f"not enough {body['item']} in stock"}, status=409)
    return JsonResponse({"order_id": order.id, "task_id": str(task_id)}, status=201)
