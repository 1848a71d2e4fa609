"""Webhook deliveries over HTTP: the outbox rows the dispatcher works through, listed with filters
and keyset pagination, and redelivery of dead ones (one, or every dead delivery of an endpoint)
with a fresh attempt budget. Admin only: a delivery holds its event's payload.

Redelivering one delivery that is not dead is a 409 delivery.not_dead (it is pending, in flight
or delivered: nothing to do, and silently answering 200 would hide a wrong id); an endpoint's
redeliver answers how many it queued again, 0 included.
"""

from __future__ import annotations

from flask import Blueprint, g

from ..engine.errors import DeliveryNotDead, DeliveryNotFound, InvalidInput, WebhookNotFound
from ..engine.store import DeliveryRecord
from .audit import audited
from .app_state import reads
from .operations import operation
from .render import page
from .responses import json_response, page_response
from .schema import DateTime, Integer, JsonValue, Object, String, Uuid

bp = Blueprint("deliveries", __name__)

DELIVERY_STATES = ("pending", "delivering", "delivered", "dead")

DELIVERY = Object({
    "id": Uuid(),
    "event_id": Uuid("The `webhook-id` of every attempt: stable per task event."),
    "endpoint_id": Uuid(),
    "event_type": String(example="task.completed"),
    "payload": JsonValue("The body POSTed to the endpoint."),
    "state": String(enum=DELIVERY_STATES),
    "attempts": Integer("Attempts made."),
    "next_attempt_at": DateTime(),
    "last_status": Integer("HTTP status of the last attempt.", nullable=True),
    "last_error": String(nullable=True),
    "created_at": DateTime(), "updated_at": DateTime(), "delivered_at": DateTime(nullable=True),
}, "A delivery of one task event to one endpoint.",
    required=("id", "event_id", "endpoint_id", "event_type", "state", "attempts", "created_at"))
REDELIVERED = Object({"endpoint_id": Uuid(), "redelivered": Integer("Dead deliveries queued again.")},
                     required=("endpoint_id", "redelivered"))


def delivery_json(d: DeliveryRecord) -> dict:
    return {"id": d.id, "event_id": d.event_id, "endpoint_id": d.endpoint_id, "event_type": d.event_type,
            "payload": d.payload, "state": d.state, "attempts": d.attempts, "next_attempt_at": d.next_attempt_at,
            "last_status": d.last_status, "last_error": d.last_error, "created_at": d.created_at,
            "updated_at": d.updated_at, "delivered_at": d.delivered_at}


@operation(bp, "GET", "/v1/deliveries", summary="List webhook deliveries", role="admin", tag="webhooks",
           reads="replica",
           query={"state": String(enum=DELIVERY_STATES), "endpoint_id": Uuid("Only this endpoint's."),
                  "limit": Integer(minimum=1, maximum=500, default=50),
                  "cursor": Uuid("next_cursor of the previous page.")},
           description="Keyset pagination in delivery id order (the ids are random, so this is not "
                       "creation order): paging never repeats or skips a delivery that existed when "
                       "paging began.",
           responses={200: ("A page of deliveries.", page("deliveries", DELIVERY))})
def list_deliveries():
    q = g.query
    rows = reads().webhooks.webhook_delivery_list(state=q["state"], endpoint_id=q["endpoint_id"], after=q["cursor"],
                                                  limit=q["limit"] + 1)
    return page_response("deliveries", rows, q["limit"], delivery_json)


@operation(bp, "POST", "/v1/deliveries/<delivery_id>/redeliver", summary="Redeliver a dead delivery",
           role="admin", tag="webhooks", path={"delivery_id": Uuid("The delivery's id.")},
           audit="delivery.redeliver",
           description="A dead delivery goes back to pending with attempts reset (a full attempt budget). "
                       "A delivery that is not dead: 409 delivery.not_dead.",
           responses={200: ("The delivery, pending again.", DELIVERY)},
           errors=(InvalidInput, DeliveryNotFound, DeliveryNotDead))
def redeliver(delivery_id):
    with audited() as (tx, _draft):
        if not tx.webhooks.webhook_delivery_redeliver(delivery_id=delivery_id):
            state = tx.webhooks.webhook_delivery_get(delivery_id).state  # DeliveryNotFound when there is none
            raise DeliveryNotDead(f"delivery {delivery_id} is {state}, not dead: only dead deliveries are "
                                  "redelivered")
        delivery = tx.webhooks.webhook_delivery_get(delivery_id)
    return json_response(delivery_json(delivery))


@operation(bp, "POST", "/v1/webhooks/<webhook_id>/redeliver", summary="Redeliver an endpoint's dead deliveries",
           role="admin", tag="webhooks", path={"webhook_id": Uuid("The endpoint's id.")},
           audit="webhook.redeliver",
           description="Every dead delivery of the endpoint goes back to pending with attempts reset. "
                       "None dead: 200 with redelivered 0.",
           responses={200: ("How many were queued again.", REDELIVERED)},
           errors=(InvalidInput, WebhookNotFound))
def redeliver_endpoint(webhook_id):
    with audited() as (tx, draft):
        tx.webhooks.webhook_endpoint_get(webhook_id)  # WebhookNotFound
        n = tx.webhooks.webhook_delivery_redeliver(endpoint_id=webhook_id)
        draft.detail = {"redelivered": n}
    return json_response({"endpoint_id": webhook_id, "redelivered": n})
