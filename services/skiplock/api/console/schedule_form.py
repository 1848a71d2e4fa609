"""Creating and editing a schedule from the console (admins): the form, its check (the API's
POST /v1/schedules:check, which shows the next five fires) and its save (POST /v1/schedules or
PATCH /v1/schedules/{name}, audited as schedule.create or schedule.update). Save appears only on
a checked form, and is checked again by the API when it writes.
"""

from __future__ import annotations

import json

from flask import redirect, render_template, request, url_for

from ...engine.errors import Forbidden, InvalidInput, ScheduleExists
from ..audit import record_refusal
from .views import bp, call, can, declare

TIMINGS = ("cron", "every")


def _blank() -> dict:
    return {"original": "", "name": "", "kind": "", "queue": "default", "timing": "cron", "cron": "",
            "interval_seconds": "", "timezone": "UTC", "payload": "{}"}


def _require(endpoint: str) -> None:
    if not can(endpoint):
        raise Forbidden("creating and editing schedules takes an admin token")


def _body(form: dict) -> dict:
    """The API's schedule fields from the form's text, or InvalidInput naming the field."""
    try:
        payload = json.loads(form["payload"] or "{}")
    except ValueError as exc:
        raise InvalidInput(f"payload: not JSON ({exc})") from None
    body = {"kind": form["kind"], "queue": form["queue"] or "default", "timezone": form["timezone"] or "UTC",
            "payload": payload}
    if form["timing"] == "every":
        try:
            body["interval_seconds"] = float(form["interval_seconds"])
        except ValueError:
            raise InvalidInput(f"every {form['interval_seconds'][:40]!r}: give a number of seconds") from None
    else:
        body["cron"] = form["cron"]
    return body


def _submitted() -> dict:
    form = {name: request.form.get(name, default).strip() for name, default in _blank().items()}
    if form["timing"] not in TIMINGS:
        form["timing"] = "cron"
    return form


def _page(form: dict, *, checked: dict | None = None, error: str | None = None, status: int = 200):
    return render_template("schedule_form.html", form=form, checked=checked, error=error), status


@bp.get("/schedules/new")
def schedule_new():
    _require("schedules.create_schedule")
    return _page(_blank())


@bp.get("/schedules/<name>/edit")
def schedule_edit(name):
    _require("schedules.change_schedule")
    s = call("schedules.get_schedule", {"name": name})
    form = {"original": s["name"], "name": s["name"], "kind": s["kind"], "queue": s["queue"],
            "timing": "cron" if s["cron"] else "every", "cron": s["cron"] or "",
            "interval_seconds": "" if s["interval_seconds"] is None else f"{s['interval_seconds']:g}",
            "timezone": s["timezone"], "payload": json.dumps(s["payload"], indent=2, sort_keys=True)}
    return _page(form)


@bp.post("/schedules/form")
def schedule_form():
    form = _submitted()
    endpoint = "schedules.change_schedule" if form["original"] else "schedules.create_schedule"
    _require(endpoint)
    saving = request.form.get("step") == "save"
    try:
        if not saving:
            checked = call("schedules.check_schedule", body={"name": form["original"] or form["name"], **_body(form)})
            return _page(form, checked=checked)
        declare(endpoint)  # from here a refusal is audited, as the API's is
        if form["original"]:
            call(endpoint, {"name": form["original"]}, body=_body(form))
        else:
            call(endpoint, body={"name": form["name"], **_body(form)})
    except (InvalidInput, ScheduleExists) as exc:  # the form again, with the line that says what to fix
        if saving:
            record_refusal(exc)
        return _page(form, error=str(exc), status=exc.status)
    return redirect(url_for("console.schedules", saved=form["original"] or form["name"]), 303)
