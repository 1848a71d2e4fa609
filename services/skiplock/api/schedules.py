"""Schedules over HTTP: create, list, read, change (including pausing: enabled=false) and delete;
their last decisions (fired, skipped, buffered, missed) and firing one now.

Definitions are validated by engine/schedules.Schedule (the same rules as `skiplock schedules
apply`) and written through the store's declarative upsert, so a re-timed or resumed schedule
starts at its next fire after now exactly as a file apply would.
"""

from __future__ import annotations

import datetime as dt

from flask import Blueprint, Response, g

from ..engine.errors import InvalidInput, PayloadTooLarge, ScheduleExists, ScheduleNotFound
from ..engine.model import encode_payload
from ..engine.schedule_actions import apply_schedules, fire_schedule_now
from ..engine.schedules import Schedule
from .audit import audited
from .app_state import api, reads
from .operations import SMALL_BODY, operation
from .render import SCHEDULE, iso, schedule_fields, schedule_json
from .responses import json_response
from .schema import Array, Boolean, DateTime, Integer, Name, Number, Object, String, Uuid

bp = Blueprint("schedules", __name__)

NAME = {"name": Name("The schedule's name.")}
CREATE = Object({"name": Name(), **schedule_fields()}, "A schedule definition.", required=("name", "kind"))
CHANGE = Object(schedule_fields(defaults=False), "The fields to change; the others keep their values.")

FIRE = Object({
    "nominal_at": DateTime("The time decided about."),
    "at": DateTime("When it was decided."),
    "lag_seconds": Number("at - nominal_at: how late the decision came."),
    "outcome": String(enum=("fired", "skipped", "buffered", "missed")),
    "task_id": Uuid("The task a fire enqueued.", nullable=True),
    "detail": String("Why: the overlap or catch-up policy that decided, or who fired it by hand.", nullable=True),
}, required=("nominal_at", "at", "lag_seconds", "outcome", "task_id", "detail"))
NEXT_FIRES_SHOWN = 5
CHECKED = Object({
    "name": Name(), "timing": String("The timing as the CLI prints it.", example="cron '0 6 * * *' (UTC)"),
    "next_fires": Array(DateTime(), "The next nominal times, first first."),
}, required=("name", "timing", "next_fires"))
FIRED_NOW = Object({
    "schedule": Name(), "nominal_at": DateTime("The tick fired: the current minute (cron) or interval."),
    "task_id": Uuid(), "created": Boolean("false: this tick had fired already, and task_id is that fire's."),
}, required=("schedule", "nominal_at", "task_id", "created"))


def _max_body(settings) -> int:
    return settings.max_payload_bytes + SMALL_BODY


def _validated(fields: dict) -> Schedule:
    schedule = Schedule.from_mapping(fields)
    encode_payload(schedule.payload, api().settings.max_payload_bytes)  # NUL, size: as a task's would be
    return schedule


@operation(bp, "GET", "/v1/schedules", summary="List schedules", role="reader", tag="schedules", reads="replica",
           responses={200: ("Every schedule, by name.", Object({"schedules": Array(SCHEDULE)},
                                                               required=("schedules",)))})
def list_schedules():
    return json_response({"schedules": [schedule_json(s) for s in reads().schedules.schedule_list()]})


@operation(bp, "POST", "/v1/schedules", summary="Create a schedule", role="admin", tag="schedules",
           body=CREATE, max_body=_max_body, audit="schedule.create",
           description="It first fires at its first nominal time after now. An existing name: 409 "
                       "schedule.exists (PATCH changes a schedule).",
           responses={201: ("Created.", SCHEDULE)}, errors=(InvalidInput, PayloadTooLarge, ScheduleExists))
def create_schedule():
    schedule = _validated(g.body)
    with audited(schedule.name) as (tx, _draft):
        report = apply_schedules(tx, [schedule], max_payload_bytes=api().settings.max_payload_bytes)
        if schedule.name not in report["created"]:  # raising rolls the upsert back
            raise ScheduleExists(f"schedule {schedule.name!r} exists; PATCH /v1/schedules/{schedule.name} "
                                 "changes it")
        status = tx.schedules.schedule_get(schedule.name)
    return json_response(schedule_json(status), 201, {"Location": f"/v1/schedules/{schedule.name}"})


@operation(bp, "POST", "/v1/schedules:check", summary="Check a schedule definition and show its next fires",
           role="reader", tag="schedules", body=CREATE, max_body=_max_body,
           description="Validates the definition as POST /v1/schedules would, and answers the next "
                       f"{NEXT_FIRES_SHOWN} nominal times it would fire at if it were created now (before jitter). "
                       "Nothing is written; the console shows these before it saves.",
           responses={200: ("The definition is valid.", CHECKED)}, errors=(InvalidInput, PayloadTooLarge))
def check_schedule():
    schedule = _validated(g.body)
    fires = schedule.next_fires(dt.datetime.now(dt.timezone.utc), NEXT_FIRES_SHOWN)
    return json_response({"name": schedule.name, "timing": schedule.describe,
                          "next_fires": [iso(fire) for fire in fires]})


@operation(bp, "GET", "/v1/schedules/<name>", summary="Read a schedule", role="reader", tag="schedules",
           path=NAME, reads="replica", responses={200: ("The schedule.", SCHEDULE)},
           errors=(InvalidInput, ScheduleNotFound))
def get_schedule(name):
    return json_response(schedule_json(reads().schedules.schedule_get(name)))


@operation(bp, "PATCH", "/v1/schedules/<name>", summary="Change a schedule", role="admin", tag="schedules",
           path=NAME, body=CHANGE, max_body=_max_body, audit="schedule.update",
           description="Setting cron clears interval_seconds and the other way round. A changed timing, "
                       "or enabled going back to true, starts at the next fire after now.",
           responses={200: ("The schedule after the change.", SCHEDULE)},
           errors=(InvalidInput, PayloadTooLarge, ScheduleNotFound))
def change_schedule(name):
    changes = g.body
    with audited(name) as (tx, draft):
        tx.schedules.schedule_lock(name)  # a DELETE racing this waits, or this finds no row
        fields = tx.schedules.schedule_get(name).schedule.as_dict()
        if changes.get("cron") is not None and "interval_seconds" not in changes:
            fields["interval_seconds"] = None
        if changes.get("interval_seconds") is not None and "cron" not in changes:
            fields["cron"] = None
        fields.update(changes)
        apply_schedules(tx, [_validated(fields)], max_payload_bytes=api().settings.max_payload_bytes)
        status = tx.schedules.schedule_get(name)
        draft.detail = {"fields": sorted(changes)}
    return json_response(schedule_json(status))


@operation(bp, "DELETE", "/v1/schedules/<name>", summary="Delete a schedule", role="admin", tag="schedules",
           path=NAME, audit="schedule.delete", content_type="",
           description="Tasks it already enqueued stay.",
           responses={204: ("Deleted.", None)}, errors=(InvalidInput, ScheduleNotFound))
def delete_schedule(name):
    with audited(name) as (tx, _draft):
        tx.schedules.schedule_delete(name)
    return Response(status=204)


@operation(bp, "GET", "/v1/schedules/<name>/fires", summary="A schedule's last decisions, newest first",
           role="reader", tag="schedules", path=NAME, reads="replica",
           query={"limit": Integer(minimum=1, maximum=500, default=20)},
           description="One per nominal time: fired (with its task), skipped (overlap), buffered or "
                       "missed (catch-up), kept for the fire retention.",
           responses={200: ("The decisions.", Object({"fires": Array(FIRE)}, required=("fires",)))},
           errors=(InvalidInput, ScheduleNotFound))
def schedule_fires(name):
    store = reads()
    store.schedules.schedule_get(name)  # 404 for an unknown name, not an empty list
    fires = store.schedules.schedule_fires_list(name, g.query["limit"])
    return json_response({"fires": [
        {"nominal_at": iso(nominal_at), "at": iso(at), "lag_seconds": (at - nominal_at).total_seconds(),
         "outcome": outcome, "task_id": None if task_id is None else str(task_id), "detail": detail}
        for _schedule, nominal_at, at, outcome, task_id, detail in fires]})


@operation(bp, "POST", "/v1/schedules/<name>/fire", summary="Fire a schedule now", role="submitter",
           tag="schedules", path=NAME, audit="schedule.fire",
           description="Enqueues the schedule's task under the current tick (a cron schedule's minute, an "
                       "interval schedule's interval) with the idempotency key the scheduler gives that "
                       "time: firing again in the same tick, or after the scheduler fired it, returns the "
                       "same task (200, created false). A paused schedule fires too; its timing is unchanged.",
           responses={201: ("Fired.", FIRED_NOW), 200: ("This tick had fired already.", FIRED_NOW)},
           errors=(InvalidInput, PayloadTooLarge, ScheduleNotFound))
def fire_schedule(name):
    with audited(name) as (tx, draft):
        nominal, task_id, created = fire_schedule_now(tx,
            name, detail=f"fired now by {g.principal.name}", max_payload_bytes=api().settings.max_payload_bytes)
        draft.detail = {"nominal_at": iso(nominal), "task_id": str(task_id), "created": created}
    return json_response({"schedule": name, "nominal_at": iso(nominal), "task_id": str(task_id),
                          "created": created}, 201 if created else 200)
