"""Signals over HTTP (durable execution): POST /v1/signals sends one, as skiplock.send_signal
does, committed with its audit row; GET /v1/signals lists them, newest first.

A send wakes the tasks waiting for its name in its own transaction (engine/sql/steps.sql,
signal_send); the first send of a name wins, a second one answers 200 and changes nothing.
The name and the payload are checked by engine/durable.py, so the API, the CLI and the library
refuse the same input with the same line.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, g

from ..engine.durable import MAX_NAME, check_name, encode_json
from ..engine.errors import InvalidInput, PayloadTooLarge
from .app_state import api, reads
from .audit import audited
from .listings import SIGNAL_LIST_QUERY, signal_listing
from .operations import SMALL_BODY, operation
from .render import SIGNAL, page
from .responses import json_response
from .schema import Boolean, Integer, JsonValue, Object, String

bp = Blueprint("signals", __name__)


class SignalName(String):
    """A signal's name, refused with engine/durable.py's line (the library's and the CLI's)."""

    def __init__(self, description: str = ""):
        super().__init__(description, min_length=1, max_length=MAX_NAME, example="order-42.confirmed")

    def check(self, value: Any, path: str) -> str:
        return check_name("signal", value)


SEND = Object({
    "name": SignalName(f"1-{MAX_NAME} characters; the tasks in ctx.wait_for_signal(name) wake."),
    "payload": JsonValue("What their wait returns: any JSON, at most SKIPLOCK_MAX_PAYLOAD_BYTES as compact JSON, "
                         "else 413.", nullable=True, default=None),
}, "A signal.", required=("name",))
SENT = Object({
    "name": String(),
    "created": Boolean("false: a signal of this name was sent before; it is unchanged (the first send wins)."),
    "woken": Integer("Tasks that were waiting for it, queued by this send."),
}, required=("name", "created", "woken"))


@operation(bp, "POST", "/v1/signals", summary="Send a signal", role="submitter", tag="signals", body=SEND,
           max_body=lambda settings: settings.max_payload_bytes + SMALL_BODY, audit="signal.send",
           description="The signal and the wake-up of the tasks waiting for it commit together with the audit "
                       "row. A signal sent before a task waits is found by the wait. Signals are kept "
                       "SKIPLOCK_RETAIN_SIGNALS_SECONDS (7 days by default).",
           responses={201: ("Sent.", SENT), 200: ("A signal of this name exists: nothing changed.", SENT)},
           errors=(InvalidInput, PayloadTooLarge))
def send_signal():
    name = g.body["name"]
    payload = encode_json("signal payload", g.body["payload"], api().settings.max_payload_bytes)[1]
    with audited(target=name) as (tx, draft):
        sent = tx.steps.signal_send(name, payload)
        draft.detail = {"created": sent.created, "woken": sent.woken}
    return json_response({"name": name, "created": sent.created, "woken": sent.woken}, 201 if sent.created else 200)


@operation(bp, "GET", "/v1/signals", summary="List signals, newest first", role="reader", tag="signals",
           query=SIGNAL_LIST_QUERY, reads="replica",
           description="Keyset pagination on (sent_at, name): signals sent while paging never shift the pages "
                       "still to come.",
           responses={200: ("A page of signals.", page("signals", SIGNAL))}, errors=(InvalidInput,))
def list_signals():
    q = g.query
    return json_response(signal_listing(reads(), q["prefix"], q["limit"], q["cursor"]))
