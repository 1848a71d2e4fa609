"""Webhook endpoints over HTTP: register (the signing secret is shown once, in that response),
list, read, delete, rotate the secret (shown once again), enable and disable. Admin only: an
endpoint's URL may carry a receiver's credentials.

Registering validates the event types and the secret like `skiplock webhooks add`, and runs the
SSRF guard (engine/webhooks.AddressGuard): the URL's host must resolve to public addresses only,
unless SKIPLOCK_WEBHOOK_ALLOWED_NETWORKS allows them; else 400 webhook.address_refused naming
the address. Resolving the name is the only thing done with the URL: no request is sent to it
here (the dispatcher delivers, and checks the address again at every attempt).
"""

from __future__ import annotations

from flask import Blueprint, Response, g

from ..engine.errors import InvalidInput, WebhookAddressRefused, WebhookNotFound
from ..engine.store import WebhookEndpoint
from ..engine.webhooks import (ALL_EVENTS, EVENT_TYPES, AddressGuard, check_event_types, check_secret,
                               generate_secret)
from .audit import audited
from .app_state import api, reads
from .operations import operation
from .responses import json_response
from .schema import Array, Boolean, DateTime, Integer, Object, String, Uuid

bp = Blueprint("webhooks", __name__)

WEBHOOK_ID = {"webhook_id": Uuid("The endpoint's id.")}
EVENT = String(enum=(ALL_EVENTS, *EVENT_TYPES))
# the field is checked by engine/webhooks.check_secret, whose messages never repeat the value
SECRET = String("Standard Webhooks secret: 'whsec_' + base64 of 24-64 random bytes. Omit it to have one "
                "generated.", max_length=200, nullable=True)

CREATE = Object({
    "url": String("Where deliveries are POSTed (http or https). Its host must resolve to public addresses "
                  "only, unless SKIPLOCK_WEBHOOK_ALLOWED_NETWORKS allows them.", min_length=1, max_length=2048,
                  example="https://hooks.example.com/skiplock"),
    "events": Array(EVENT, f"Event types to deliver; {ALL_EVENTS} means all.", min_items=1, max_items=32,
                    default=[ALL_EVENTS]),
    "secret": SECRET,
    "description": String(max_length=1000, nullable=True),
}, "A webhook endpoint.", required=("url",))
ROTATE = Object({"secret": SECRET}, "Optionally the new secret; by default one is generated.")
DISABLE = Object({"reason": String("Shown as disabled_reason.", max_length=1000, nullable=True)})

WEBHOOK = Object({
    "id": Uuid(),
    "url": String(),
    "events": Array(EVENT),
    "description": String(nullable=True),
    "enabled": Boolean("false: no new deliveries are made for it and pending ones wait."),
    "disabled_reason": String("Why it was disabled (by an operator, or the dispatcher on 410 Gone).",
                              nullable=True),
    "created_at": DateTime(),
    "pending": Integer("Deliveries pending or in flight."),
    "dead": Integer("Deliveries that used up their attempts (redeliver them with POST .../redeliver)."),
}, "A webhook endpoint (never its secret).",
    required=("id", "url", "events", "enabled", "created_at", "pending", "dead"))
WITH_SECRET = Object({**WEBHOOK.fields, "secret": String("The signing secret. Shown in this response only: "
                                                         "store it with the receiver.")},
                     "A webhook endpoint and its secret.", required=(*WEBHOOK.required, "secret"))


def webhook_json(endpoint: WebhookEndpoint) -> dict:
    return {"id": endpoint.id, "url": endpoint.url, "events": list(endpoint.event_types),
            "description": endpoint.description, "enabled": endpoint.enabled,
            "disabled_reason": endpoint.disabled_reason, "created_at": endpoint.created_at,
            "pending": endpoint.pending, "dead": endpoint.dead}


@operation(bp, "GET", "/v1/webhooks", summary="List webhook endpoints", role="admin", tag="webhooks", reads="replica",
           responses={200: ("Every endpoint, oldest first; secrets are never listed.",
                            Object({"webhooks": Array(WEBHOOK)}, required=("webhooks",)))})
def list_webhooks():
    return json_response({"webhooks": [webhook_json(e) for e in reads().webhooks.webhook_endpoint_list()]})


@operation(bp, "POST", "/v1/webhooks", summary="Register a webhook endpoint", role="admin", tag="webhooks",
           body=CREATE, audit="webhook.create",
           description="Deliveries start with the next task event of a subscribed type. The response is the "
                       "only one that holds the secret. No request is sent to the URL here.",
           responses={201: ("Registered.", WITH_SECRET)},
           errors=(InvalidInput, WebhookAddressRefused))
def create_webhook():
    body = g.body
    events = check_event_types(body["events"])
    secret = check_secret(body["secret"]) if body.get("secret") is not None else generate_secret()
    AddressGuard.from_settings(api().settings).resolve(body["url"])  # refused: 400, no row
    with audited() as (tx, draft):
        endpoint = tx.webhooks.webhook_endpoint_insert(body["url"], events, secret, body.get("description"))
        draft.target = str(endpoint.id)
        draft.detail = {"url": endpoint.url, "events": events}  # never the secret
    return json_response({**webhook_json(endpoint), "secret": secret}, 201,
                         {"Location": f"/v1/webhooks/{endpoint.id}"})


@operation(bp, "GET", "/v1/webhooks/<webhook_id>", summary="Read a webhook endpoint", role="admin",
           tag="webhooks", path=WEBHOOK_ID, reads="replica",
           responses={200: ("The endpoint (without its secret).", WEBHOOK)},
           errors=(InvalidInput, WebhookNotFound))
def get_webhook(webhook_id):
    return json_response(webhook_json(reads().webhooks.webhook_endpoint_get(webhook_id)))


@operation(bp, "DELETE", "/v1/webhooks/<webhook_id>", summary="Delete a webhook endpoint", role="admin",
           tag="webhooks", path=WEBHOOK_ID, audit="webhook.delete", content_type="",
           description="Its deliveries go with it: pending ones are not sent.",
           responses={204: ("Deleted.", None)}, errors=(InvalidInput, WebhookNotFound))
def delete_webhook(webhook_id):
    with audited() as (tx, _draft):
        tx.webhooks.webhook_endpoint_delete(webhook_id)
    return Response(status=204)


@operation(bp, "POST", "/v1/webhooks/<webhook_id>/rotate-secret", summary="Replace an endpoint's secret",
           role="admin", tag="webhooks", path=WEBHOOK_ID, body=ROTATE, body_required=False,
           audit="webhook.rotate_secret",
           description="Attempts from now on are signed with the new secret. The response is the only one "
                       "that holds it.",
           responses={200: ("The endpoint and its new secret.", WITH_SECRET)},
           errors=(InvalidInput, WebhookNotFound))
def rotate_secret(webhook_id):
    secret = check_secret(g.body["secret"]) if g.body.get("secret") is not None else generate_secret()
    with audited() as (tx, _draft):
        tx.webhooks.webhook_endpoint_set_secret(webhook_id, secret)
        endpoint = tx.webhooks.webhook_endpoint_get(webhook_id)
    return json_response({**webhook_json(endpoint), "secret": secret})


@operation(bp, "POST", "/v1/webhooks/<webhook_id>/enable", summary="Enable a webhook endpoint", role="admin",
           tag="webhooks", path=WEBHOOK_ID, audit="webhook.enable",
           description="Also after the dispatcher disabled it (410 Gone). Deliveries waiting for it resume; "
                       "enabling an enabled endpoint changes nothing.",
           responses={200: ("The endpoint.", WEBHOOK)}, errors=(InvalidInput, WebhookNotFound))
def enable_webhook(webhook_id):
    with audited() as (tx, _draft):
        tx.webhooks.webhook_endpoint_set_enabled(webhook_id, True)
        endpoint = tx.webhooks.webhook_endpoint_get(webhook_id)
    return json_response(webhook_json(endpoint))


@operation(bp, "POST", "/v1/webhooks/<webhook_id>/disable", summary="Disable a webhook endpoint",
           role="admin", tag="webhooks", path=WEBHOOK_ID, body=DISABLE, body_required=False,
           audit="webhook.disable",
           description="No deliveries are made for its events from now on; pending ones wait until it is "
                       "enabled again.",
           responses={200: ("The endpoint.", WEBHOOK)}, errors=(InvalidInput, WebhookNotFound))
def disable_webhook(webhook_id):
    reason = g.body.get("reason") or f"disabled by {g.principal.name}"
    with audited() as (tx, draft):
        tx.webhooks.webhook_endpoint_set_enabled(webhook_id, False, reason)
        endpoint = tx.webhooks.webhook_endpoint_get(webhook_id)
        draft.detail = {"reason": reason}
    return json_response(webhook_json(endpoint))
