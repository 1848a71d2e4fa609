"""The console's signals page (durable execution): the signals sent, newest first, and for
admins a "Send signal" form, which POST /v1/signals' view runs (its audit row, the actor being
the token's name). The API lets a submitter send; the console's form is an operator's tool, for
admins only.

A refused send (a bad name, a payload that is not JSON or too large) shows the signals page
again with the one-line reason and what was typed, and is audited as the API's refusals are.
"""

from __future__ import annotations

import json

from flask import g, redirect, render_template, request, url_for

from ...engine.errors import InvalidInput
from ..app_state import api
from ..audit import record_refusal
from ..auth import rank
from .pages import listing
from .views import bp, call, declare

# the role the form needs (stronger than the API route's)
SEND_ROLE = "admin"


def _page(form: dict | None = None, error: InvalidInput | None = None, status: int = 200):
    page, filters, next_url = listing("signals.list_signals", "console.signals")
    sent = request.args.get("sent")
    woken = request.args.get("woken", "")
    return render_template("signals.html", signals=page["signals"], filters=filters, next_url=next_url,
                           may_send=rank(g.principal.role) >= rank(SEND_ROLE), form=form or {}, error=error,
                           sent=sent, created=request.args.get("created") == "1",
                           woken=int(woken) if woken.isdigit() else 0), status


@bp.get("/signals")
def signals():
    return _page()


@bp.post("/signals")
def send_signal():
    api().auth.require(g.principal, SEND_ROLE, "POST /ui/signals")
    declare("signals.send_signal")  # a payload refused here is audited too
    form = {"name": request.form.get("name", ""), "payload": request.form.get("payload", "")}
    try:
        try:
            payload = json.loads(form["payload"]) if form["payload"].strip() else None
        except json.JSONDecodeError as exc:
            raise InvalidInput(f"payload is not valid JSON: {exc}") from None
        sent = call("signals.send_signal", body={"name": form["name"], "payload": payload})
    except InvalidInput as exc:  # PayloadTooLarge too
        record_refusal(exc)
        return _page(form, exc, exc.status)
    return redirect(url_for("console.signals", sent=sent["name"], created=int(sent["created"]),
                            woken=sent["woken"]), 303)
