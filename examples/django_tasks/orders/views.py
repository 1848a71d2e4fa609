"""POST /orders: the order, its receipt task and the stock update in one transaction;
GET /tasks/<id>: the task's result, as Django's task framework reads it back."""

import json

from django.db import IntegrityError, transaction
from django.db.models import F
from django.http import JsonResponse
from django.tasks import TaskResultStatus
from django.tasks.exceptions import TaskResultDoesNotExist, TaskResultMismatch
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from .models import Order, Stock
from .tasks import send_receipt


@csrf_exempt  # a JSON API for the example; a form view keeps Django's CSRF protection
@require_POST
def place_order(request):
    body = json.loads(request.body)
    try:
        with transaction.atomic():
            order = Order.objects.create(item_id=body["item"], quantity=body["quantity"])
            # skiplock's backend writes the task in this atomic block's transaction: it commits
            # or rolls back with the order (no transaction.on_commit needed)
            result = send_receipt.enqueue(order.id)
            Stock.objects.filter(item=body["item"]).update(available=F("available") - order.quantity)
    except IntegrityError:
        # not enough in stock (or no such item): the order and its task were rolled back together
        return JsonResponse({"error": f"not enough {body['item']} in stock"}, status=409)
    return JsonResponse({"order_id": order.id, "task_id": result.id}, status=201)


@require_GET
def task_status(request, task_id):
    try:
        result = send_receipt.get_result(task_id)
    except (TaskResultDoesNotExist, TaskResultMismatch):  # no task, or another task's id
        return JsonResponse({"error": f"no task {task_id}"}, status=404)
    body = {"status": result.status, "attempts": result.attempts}
    if result.status == TaskResultStatus.SUCCESSFUL:
        body["return_value"] = result.return_value
    return JsonResponse(body)
