"""Tasks over HTTP: submit (one, with an optional Idempotency-Key, or a batch through the bulk
path), list with keyset pagination, read one and its events, cancel and resume.

Views only translate: validation happened before they run (operations.py declarations), the
semantics are the store's (engine/store.py), and each change commits with its audit row.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from flask import Blueprint, g

from ..engine.errors import (IdempotencyConflict, InvalidInput, PayloadTooLarge, TaskNotCancellable,
                             TaskNotFound, TaskNotResumable)
from ..engine.model import STATES
from ..engine.store import TaskSpec
from .audit import audited
from .context import api
from .operations import SMALL_BODY, operation
from .render import EVENT, TASK, event_json, iso, json_response, page, page_response, task_json
from .schema import Array, Boolean, DateTime, Integer, JsonObject, Name, Number, Object, String, Uuid

bp = Blueprint("tasks", __name__)

BATCH_MAX_TASKS = 1000
# A batch body may hold many payloads; each is still held to SKIPLOCK_MAX_PAYLOAD_BYTES.
BATCH_MAX_BODY = 32 * 1024 * 1024
MAX_DELAY_SECONDS = 10 * 365 * 86400.0

IDEMPOTENCY_KEY = String("Up to 255 printable ASCII characters. The same key with the same body answers 200 "
                         "with the task it created; with another body, 409 task.idempotency_conflict.",
                         min_length=1, max_length=255, pattern=r"^[!-~]+$")


def _task_fields() -> dict:
    return {
        "kind": Name("The handler's kind.", example="reports.daily"),
        "queue": Name(default="default"),
        "priority": Integer("Higher runs first.", minimum=-32768, maximum=32767, default=0),
        "payload": JsonObject("The handler's input: at most SKIPLOCK_MAX_PAYLOAD_BYTES (1 MiB) as compact "
                              "JSON, else 413.", default={}),
        "run_at": DateTime("Not claimed before this time (RFC 3339 with an offset). Not with delay.", nullable=True),
        "delay": Number("Not claimed before this many seconds from now. Not with run_at.", minimum=0,
                        maximum=MAX_DELAY_SECONDS, nullable=True),
        "max_attempts": Integer("Executions before the task fails; default: the kind's.", minimum=1,
                                maximum=2**31 - 1, nullable=True),
        "deadline": DateTime("No retry is scheduled after this time.", nullable=True),
    }


SUBMIT = Object(_task_fields(), "One task.", required=("kind",))
BATCH = Object({"tasks": Array(Object({**_task_fields(), "idempotency_key": IDEMPOTENCY_KEY}, required=("kind",)),
                               min_items=1, max_items=BATCH_MAX_TASKS)},
               f"Up to {BATCH_MAX_TASKS} tasks, enqueued together (all or none).", required=("tasks",))
BATCH_RESULT = Object({
    "tasks": Array(Object({"id": Uuid(), "created": Boolean("false: an idempotency key's replay.")},
                          required=("id", "created")), "One per submitted task, in order."),
    "created": Integer("How many tasks are new."),
}, required=("tasks", "created"))
TASK_ID = {"task_id": Uuid("The task's id.")}
REASON = Object({"reason": String("Recorded in the task's event.", max_length=1000, nullable=True)})


def _spec(item: dict, key: str | None, max_payload: int, where: str) -> tuple[TaskSpec, str | None, Any]:
    """A validated body item as (TaskSpec, fingerprint for its key, deadline)."""
    if item.get("run_at") is not None and item.get("delay") is not None:
        raise InvalidInput(f"{where}run_at, {where}delay: give one of them, not both")
    try:
        spec = TaskSpec(item["kind"], item["payload"], queue=item["queue"], priority=item["priority"],
                        run_at=item.get("run_at"), delay=item.get("delay"), idempotency_key=key,
                        max_attempts=item.get("max_attempts"), max_payload_bytes=max_payload)
    except InvalidInput as exc:
        raise type(exc)(f"{where}{exc}") from None
    fingerprint = None
    if key is not None:
        # the request as it was understood (defaults filled in, times in UTC), not its bytes:
        # reordered keys or an explicit default are the same submission
        normalized = {name: item.get(name) for name in ("kind", "queue", "priority", "payload", "delay",
                                                        "max_attempts")}
        normalized.update(run_at=iso(item.get("run_at")), deadline=iso(item.get("deadline")))
        fingerprint = hashlib.sha256(json.dumps(normalized, sort_keys=True, separators=(",", ":"))
                                     .encode()).hexdigest()
    return spec, fingerprint, item.get("deadline")


@operation(bp, "POST", "/v1/tasks", summary="Submit a task", role="submitter", tag="tasks",
           body=SUBMIT, headers={"Idempotency-Key": IDEMPOTENCY_KEY},
           max_body=lambda settings: settings.max_payload_bytes + SMALL_BODY, audit="task.submit",
           responses={201: ("Enqueued.", TASK),
                      200: ("Replay: this Idempotency-Key and body created this task before.", TASK)},
           errors=(InvalidInput, PayloadTooLarge, IdempotencyConflict))
def submit_task():
    spec, fingerprint, deadline = _spec(g.body, g.headers["Idempotency-Key"], api().settings.max_payload_bytes, "")
    with audited() as (tx, draft):
        [(task_id, created)] = tx.submit([spec], [fingerprint], [deadline])
        task = tx.get(task_id)
        draft.target = str(task_id)
        draft.detail = None if created else {"replayed": True}
    return json_response(task_json(task), 201 if created else 200, {"Location": f"/v1/tasks/{task_id}"})


@operation(bp, "POST", "/v1/tasks:batch", summary=f"Submit up to {BATCH_MAX_TASKS} tasks at once",
           role="submitter", tag="tasks", body=BATCH, max_body=BATCH_MAX_BODY, audit="task.submit_batch",
           description="One transaction through the bulk path: all tasks are enqueued or none. Items may "
                       "carry an idempotency_key each.",
           responses={201: ("Enqueued (some may be replays).", BATCH_RESULT),
                      200: ("Every item was a replay.", BATCH_RESULT)},
           errors=(InvalidInput, PayloadTooLarge, IdempotencyConflict))
def submit_batch():
    max_payload = api().settings.max_payload_bytes
    specs, fingerprints, deadlines = [], [], []
    for i, item in enumerate(g.body["tasks"]):
        spec, fingerprint, deadline = _spec(item, item.get("idempotency_key"), max_payload, f"tasks[{i}].")
        specs.append(spec), fingerprints.append(fingerprint), deadlines.append(deadline)
    with audited() as (tx, draft):
        results = tx.submit(specs, fingerprints, deadlines)
        created = sum(1 for _, new in results if new)
        draft.detail = {"tasks": len(results), "created": created}
    return json_response({"tasks": [{"id": task_id, "created": new} for task_id, new in results],
                          "created": created}, 201 if created else 200)


@operation(bp, "GET", "/v1/tasks", summary="List tasks, newest first", role="reader", tag="tasks",
           query={"queue": Name(), "state": String(enum=STATES), "kind": Name(),
                  "created_after": DateTime("Created at or after this time."),
                  "created_before": DateTime("Created before this time."),
                  "limit": Integer(minimum=1, maximum=500, default=50),
                  "cursor": Uuid("next_cursor of the previous page.")},
           description="Keyset pagination on the task id (UUIDv7, time-ordered): tasks created while "
                       "paging never shift or repeat the pages still to come.",
           responses={200: ("A page of tasks.", page("tasks", TASK))}, errors=(InvalidInput,))
def list_tasks():
    q = dict(g.query)
    limit = q.pop("limit")
    return page_response("tasks", api().store.list_tasks(**q, limit=limit + 1), limit, task_json)


@operation(bp, "GET", "/v1/tasks/<task_id>", summary="Read a task", role="reader", tag="tasks", path=TASK_ID,
           responses={200: ("The task.", TASK)}, errors=(InvalidInput, TaskNotFound))
def get_task(task_id):
    return json_response(task_json(api().store.get(task_id)))


@operation(bp, "GET", "/v1/tasks/<task_id>/events", summary="A task's events in sequence order", role="reader",
           tag="tasks", path=TASK_ID,
           responses={200: ("Every event of the task.", Object({"events": Array(EVENT)}, required=("events",)))},
           errors=(InvalidInput, TaskNotFound))
def task_events(task_id):
    store = api().store
    events = store.events(task_id)
    if not events:  # every task has its 'queued' event: none means no task
        store.get(task_id)
    return json_response({"events": [event_json(e) for e in events]})


def _event_data(reason: str | None) -> dict:
    data = {"by": g.principal.name}
    if reason:
        data["reason"] = reason
    return data


@operation(bp, "POST", "/v1/tasks/<task_id>/cancel", summary="Cancel a task", role="admin", tag="tasks",
           path=TASK_ID, body=REASON, body_required=False, audit="task.cancel",
           description="queued: cancelled at once. running: cancelling (its handler sees "
                       "ctx.cancel_requested at the next heartbeat; the task ends cancelled). Cancelling "
                       "again is not an error. A finished task: 409 task.not_cancellable.",
           responses={200: ("The task after the request.", TASK)},
           errors=(InvalidInput, TaskNotFound, TaskNotCancellable))
def cancel_task(task_id):
    with audited(str(task_id)) as (tx, draft):
        state = tx.cancel(task_id, _event_data(g.body.get("reason")))
        task = tx.get(task_id)
        draft.detail = {"state": state}
    return json_response(task_json(task))


@operation(bp, "POST", "/v1/tasks/<task_id>/resume", summary="Resume a failed or cancelled task", role="admin",
           tag="tasks", path=TASK_ID, body=REASON, body_required=False, audit="task.resume",
           description="failed or cancelled: queued again with attempts reset (a full retry budget). "
                       "Completed: 409 task.not_resumable; queued or running: 409 too.",
           responses={200: ("The task after the request.", TASK)},
           errors=(InvalidInput, TaskNotFound, TaskNotResumable))
def resume_task(task_id):
    with audited(str(task_id)) as (tx, draft):
        state = tx.resume(task_id, _event_data(g.body.get("reason")))
        task = tx.get(task_id)
        draft.detail = {"state": state}
    return json_response(task_json(task))
