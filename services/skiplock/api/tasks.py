"""Tasks over HTTP: submit (one, with an optional Idempotency-Key, or a batch through the bulk
path), list with keyset pagination, read one (with its parents and children, and with `wait` a
long-poll until it is final) and its events, cancel and resume; retry, cancel or purge the tasks
of a filter (engine/task_actions.py, shared with the `skiplock tasks` command).

Views only translate: validation happened before they run (operations.py declarations), the
semantics are the store's (engine/store/), and each change commits with its audit row.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import uuid
from collections.abc import Sequence
from typing import Any

from flask import Blueprint, g

from ..engine import store as store_mod
from ..engine.errors import (IdempotencyConflict, InvalidInput, NameBoundReached, PayloadTooLarge,
                             TaskNotCancellable, TaskNotFound, TaskNotResumable, TooManyRequests, WaitTimeout)
from ..engine.enqueue_options import debounce_from, unique_from
from ..engine.model import (FINISHED_STATES, MAX_CONCURRENCY_KEY_BYTES, MAX_PARENTS, ON_PARENT_FAILURE, STATES,
                            Task, TaskSpec)
from ..engine.payload_types import payload_for_enqueue
from ..engine.registry import queue_of
from ..engine.store import Store
from ..engine.task_actions import (BULK_ACTIONS, BULK_BATCH_SIZE, BULK_DEFAULT_LIMIT, BULK_MAX_IDS, BULK_MAX_LIMIT,
                                   TaskFilter, bulk)
from ..engine.task_actions import cancel_task as cancel, resume_task as resume
from ..waiting import wait
from .audit import audited, current_draft
from .names import admit
from .app_state import api, reads
from .listings import IDEMPOTENCY_KEY, TASK_LIST_QUERY
from .operations import SMALL_BODY, operation
from .render import EVENT, RELATIVES_SHOWN, TASK, event_json, iso, page, task_json
from .responses import json_response, page_response
from .schema import Array, Boolean, DateTime, Integer, JsonObject, Name, Number, Object, String, Uuid
from .task_options import DEBOUNCE, UNIQUE

bp = Blueprint("tasks", __name__)

BATCH_MAX_TASKS = 1000
# the largest `wait` a client may ask for; the wait itself is cut to SKIPLOCK_API_MAX_WAIT_SECONDS
WAIT_QUERY_MAX = 3600
# A batch body may hold many payloads; each is still held to SKIPLOCK_MAX_PAYLOAD_BYTES.
BATCH_MAX_BODY = 32 * 1024 * 1024
MAX_DELAY_SECONDS = 10 * 365 * 86400.0

# checked again in bytes (at most 256 as UTF-8) by the engine's TaskSpec
CONCURRENCY_KEY = String(f"The task's group under its kind's flow-control limit (GET /v1/limits): at most "
                         f"{MAX_CONCURRENCY_KEY_BYTES} bytes as UTF-8. Omitted or null: the kind's one group "
                         "without a key.", max_length=MAX_CONCURRENCY_KEY_BYTES, nullable=True,
                         example="customer:42")


def _task_fields() -> dict:
    return {
        "kind": Name("The handler's kind.", example="reports.daily"),
        "queue": Name("Absent: the queue @task declared for the kind when the API knows its definition "
                      "(SKIPLOCK_TASKS), else `default` (GET /v1/kinds shows which).", nullable=True),
        "priority": Integer("Higher runs first.", minimum=-32768, maximum=32767, default=0),
        "payload": JsonObject("The handler's input: at most SKIPLOCK_MAX_PAYLOAD_BYTES (1 MiB) as compact "
                              "JSON, else 413.", default={}),
        "run_at": DateTime("Not claimed before this time (RFC 3339 with an offset). Not with delay.", nullable=True),
        "delay": Number("Not claimed before this many seconds from now. Not with run_at.", minimum=0,
                        maximum=MAX_DELAY_SECONDS, nullable=True),
        "max_attempts": Integer("Executions before the task fails; default: the kind's.", minimum=1,
                                maximum=2**31 - 1, nullable=True),
        "deadline": DateTime("No retry is scheduled after this time.", nullable=True),
        "concurrency_key": CONCURRENCY_KEY,
        "depends_on": Array(Uuid(), f"Ids of tasks (of this schema) that must be final first: until then the "
                                    f"task is `waiting`. A parent already final counts at once. At most "
                                    f"{MAX_PARENTS:,}; an unknown id: 400, nothing enqueued.",
                            max_items=MAX_PARENTS, nullable=True),
        "on_parent_failure": String("What a parent that ends failed or cancelled does to this task: `cancel` "
                                    "it, or let it `run` once every parent is final.", enum=ON_PARENT_FAILURE,
                                    default="cancel"),
        "unique": UNIQUE,
        "debounce": DEBOUNCE,
    }


SUBMIT = Object(_task_fields(), "One task.", required=("kind",))
BATCH = Object({"tasks": Array(Object({**_task_fields(), "idempotency_key": IDEMPOTENCY_KEY}, required=("kind",)),
                               min_items=1, max_items=BATCH_MAX_TASKS)},
               f"Up to {BATCH_MAX_TASKS} tasks, enqueued together (all or none).", required=("tasks",))
BATCH_RESULT = Object({
    "tasks": Array(Object({"id": Uuid(), "created": Boolean("false: an idempotency key's replay, a unique "
                                                            "duplicate or a debounce merge.")},
                          required=("id", "created")), "One per submitted task, in order."),
    "created": Integer("How many tasks are new."),
}, required=("tasks", "created"))
TASK_ID = {"task_id": Uuid("The task's id.")}
REASON = Object({"reason": String("Recorded in the task's event.", max_length=1000, nullable=True)})


def _spec(item: dict, key: str | None, max_payload: int, where: str) -> tuple[TaskSpec, str | None, Any]:
    """A validated body item as (TaskSpec, fingerprint for its key, deadline)."""
    if item.get("run_at") is not None and item.get("delay") is not None:
        raise InvalidInput(f"{where}run_at, {where}delay: give one of them, not both")
    item["queue"] = queue_of(item["kind"], item.get("queue"))  # before the fingerprint reads it
    try:
        payload = payload_for_enqueue(item["kind"], item["payload"])  # a typed kind's, validated
        spec = TaskSpec(item["kind"], payload, queue=item["queue"], priority=item["priority"],
                        run_at=item.get("run_at"), delay=item.get("delay"), idempotency_key=key,
                        max_attempts=item.get("max_attempts"), max_payload_bytes=max_payload,
                        concurrency_key=item.get("concurrency_key"), depends_on=item.get("depends_on"),
                        on_parent_failure=item["on_parent_failure"], unique=unique_from(item.get("unique")),
                        debounce=debounce_from(item.get("debounce")))
    except InvalidInput as exc:
        raise type(exc)(f"{where}{exc}") from None
    fingerprint = None
    if key is not None:
        # the request as it was understood (defaults filled in, times in UTC), not its bytes:
        # reordered keys or an explicit default are the same submission
        normalized = {name: item.get(name) for name in ("kind", "queue", "priority", "payload", "delay",
                                                        "max_attempts")}
        normalized.update(run_at=iso(item.get("run_at")), deadline=iso(item.get("deadline")))
        # only when given: the fingerprints of earlier submissions still match
        if spec.concurrency_key:
            normalized["concurrency_key"] = spec.concurrency_key
        if spec.depends_on:
            normalized.update(depends_on=sorted(str(p) for p in spec.depends_on),
                              on_parent_failure=spec.on_parent_failure)
        if spec.unique is not None:
            normalized["unique"] = [spec.unique.by_payload, spec.unique.period, list(spec.unique.states)]
        fingerprint = hashlib.sha256(json.dumps(normalized, sort_keys=True, separators=(",", ":"))
                                     .encode()).hexdigest()
    return spec, fingerprint, item.get("deadline")


def _submit(tx: Store, specs: Sequence[TaskSpec], fingerprints: Sequence[str | None],
            deadlines: Sequence[dt.datetime | None]) -> list[tuple[uuid.UUID, bool]]:
    """Enqueue submissions on a transaction's store; returns (task id, created) per spec, in order.

    Call it at the top level of that transaction (not in a savepoint): whether a keyed task is
    this request's own is read from the row's xmin. A key that names a task submitted with the
    same fingerprint is a replay (created False); with another fingerprint it is
    IdempotencyConflict, and nothing of this request remains."""
    admit(tx, specs)  # before any insert: a refused submission writes nothing
    ids = tx.tasks.task_insert(specs)
    # False: a unique key's holder, or the debounced task this one merged into (a TaskId says so)
    created = [getattr(task_id, "created", True) for task_id in ids]
    duplicates = [s.kind for s, new in zip(specs, created) if not new and s.unique is not None]
    for kind in duplicates:
        api().metrics.enqueue_duplicates.labels(kind).inc()
    # a unique duplicate answers its key's holder; its Idempotency-Key was not stored, nor checked
    keyed = [i for i, s in enumerate(specs) if s.idempotency_key is not None and (created[i] or s.unique is None)]
    if keyed:
        rows = tx.tasks.task_submitted([ids[i] for i in keyed])
        first: dict[uuid.UUID, int] = {}
        for i in keyed:
            key = specs[i].idempotency_key
            if ids[i] not in rows:
                # retention deleted the key's task between our insert and this read
                raise IdempotencyConflict(f"Idempotency-Key {key!r}: its task was just deleted; retry")
            request_hash, mine, *stored = rows[ids[i]]
            if mine and ids[i] not in first:
                first[ids[i]] = i
                continue
            created[i] = False
            if mine:  # the key twice in one batch: the first occurrence made the task
                same = fingerprints[first[ids[i]]] == fingerprints[i]
            elif request_hash is not None:
                same = request_hash == fingerprints[i]
            else:  # enqueued by the library or the CLI: compare what both have
                s = specs[i]
                same = tuple(stored) == (s.kind, s.queue, s.priority, s.payload if s.payload is not None
                                         else {}, s.max_attempts)
            if not same:
                raise IdempotencyConflict(f"Idempotency-Key {key!r} was used for task {ids[i]} "
                                          "with a different body")
    annotate = [i for i, s in enumerate(specs) if created[i]
                and (deadlines[i] is not None or (s.idempotency_key is not None and fingerprints[i]))]
    if annotate:
        tx.tasks.task_annotate([ids[i] for i in annotate], [fingerprints[i] for i in annotate],
                               [deadlines[i] for i in annotate])
    return list(zip(ids, created))


@operation(bp, "POST", "/v1/tasks", summary="Submit a task", role="submitter", tag="tasks",
           body=SUBMIT, headers={"Idempotency-Key": IDEMPOTENCY_KEY},
           max_body=lambda settings: settings.max_payload_bytes + SMALL_BODY, audit="task.submit", bounded=True,
           responses={201: ("Enqueued.", TASK),
                      200: ("Nothing new: a replay (this Idempotency-Key and body created this task before), a "
                            "`unique` duplicate (the task that holds the key) or a `debounce` merge (the task "
                            "that waits, with this payload).", TASK)},
           errors=(InvalidInput, PayloadTooLarge, IdempotencyConflict, NameBoundReached))
def submit_task():
    spec, fingerprint, deadline = _spec(g.body, g.headers["Idempotency-Key"], api().settings.max_payload_bytes, "")
    with audited() as (tx, draft):
        [(task_id, created)] = _submit(tx, [spec], [fingerprint], [deadline])
        task = tx.tasks.task_get(task_id)
        draft.target = str(task_id)
        draft.detail = None if created else {"replayed": True}
    return json_response(task_json(task), 201 if created else 200, {"Location": f"/v1/tasks/{task_id}"})


@operation(bp, "POST", "/v1/tasks:batch", summary=f"Submit up to {BATCH_MAX_TASKS} tasks at once",
           role="submitter", tag="tasks", body=BATCH, max_body=BATCH_MAX_BODY, audit="task.submit_batch", bounded=True,
           description="One transaction through the bulk path: all tasks are enqueued or none. Items may "
                       "carry an idempotency_key each.",
           responses={201: ("Enqueued (some may be replays).", BATCH_RESULT),
                      200: ("Every item was a replay.", BATCH_RESULT)},
           errors=(InvalidInput, PayloadTooLarge, IdempotencyConflict, NameBoundReached))
def submit_batch():
    max_payload = api().settings.max_payload_bytes
    specs, fingerprints, deadlines = [], [], []
    for i, item in enumerate(g.body["tasks"]):
        spec, fingerprint, deadline = _spec(item, item.get("idempotency_key"), max_payload, f"tasks[{i}].")
        specs.append(spec), fingerprints.append(fingerprint), deadlines.append(deadline)
    edges = sum(len(s.depends_on) for s in specs)
    if edges > MAX_PARENTS:
        raise InvalidInput(f"tasks[].depends_on: a batch names at most {MAX_PARENTS:,} parents in all (got {edges:,})")
    with audited() as (tx, draft):
        results = _submit(tx, specs, fingerprints, deadlines)
        created = sum(1 for _, new in results if new)
        draft.detail = {"tasks": len(results), "created": created}
    return json_response({"tasks": [{"id": task_id, "created": new} for task_id, new in results],
                          "created": created}, 201 if created else 200)


@operation(bp, "GET", "/v1/tasks", summary="List tasks, newest first", role="reader", tag="tasks", reads="replica",
           query=TASK_LIST_QUERY,
           description="Keyset pagination on the task id (UUIDv7, time-ordered): tasks created while "
                       "paging never shift or repeat the pages still to come.",
           responses={200: ("A page of tasks.", page("tasks", TASK))}, errors=(InvalidInput,))
def list_tasks():
    q = dict(g.query)
    limit = q.pop("limit")
    task_id = q.pop("id")
    q["ids"] = None if task_id is None else [task_id]
    return page_response("tasks", reads().tasks.task_list(**q, limit=limit + 1), limit, task_json)


@operation(bp, "GET", "/v1/tasks/<task_id>", summary="Read a task, or wait for it to be final", role="reader",
           tag="tasks", path=TASK_ID, reads="replica",
           query={"wait": Number("Long-poll: hold the request until the task is completed, failed or cancelled, "
                                 "for at most this many seconds (cut to SKIPLOCK_API_MAX_WAIT_SECONDS, 20 by "
                                 "default). The answer is the task either way: its `state` says whether it "
                                 "ended. Read on the primary.", minimum=0, maximum=WAIT_QUERY_MAX)},
           description=f"With its parents and children (at most {RELATIVES_SHOWN} ids each; `parents_truncated` "
                       "or `children_truncated` says there are more). A long-poll holds a request thread: "
                       "beyond SKIPLOCK_API_MAX_WAITS at once on one gunicorn worker, 429 "
                       "request.rate_limited with Retry-After.",
           responses={200: ("The task (with `wait`: once final, or as it is when the wait ends).", TASK)},
           errors=(InvalidInput, TaskNotFound, TooManyRequests))
def get_task(task_id):
    seconds = _wait_seconds(g.query["wait"])
    store = api().store if seconds else reads()  # a wait listens on the primary
    task = store.tasks.task_get(task_id)
    if seconds and task.state not in FINISHED_STATES:
        task = _wait_final(task_id, seconds) or store.tasks.task_get(task_id)
    parents, children = store.tasks.task_relatives(task_id, RELATIVES_SHOWN + 1)
    return json_response(task_json(task, parents=parents, children=children))


def _wait_seconds(asked: float | None) -> float:
    """How long this request may wait: what it asked, cut to SKIPLOCK_API_MAX_WAIT_SECONDS and
    below the shutdown grace (gunicorn's graceful timeout, whole seconds), so that a wait in
    flight at SIGTERM ends, answered, before the worker is stopped. 0: no wait."""
    settings = api().settings
    if not asked or not api().admission_bounds.max_waits:
        return 0.0
    return max(0.0, min(asked, settings.api_max_wait_seconds, int(settings.shutdown_grace_seconds) - 1))


def _wait_final(task_id: uuid.UUID, seconds: float) -> Task | None:
    """skiplock.wait on a connection of its own (LISTEN must not be left on a pooled one, and the
    pool's are for short reads); the task once final, None when the wait ended first."""
    settings = api().settings
    release = api().admission_bounds.long_poll()
    try:
        # the worker's LISTEN URL where one is set: a direct connection, when the main URL is a
        # transaction pooler's (through which notifications do not arrive; the wait's poll still reads)
        url = settings.listen_database_url or settings.require_database_url()
        pooler = "none" if settings.listen_database_url else settings.database_pooler
        with store_mod.connect(url, autocommit=True, pooler=pooler) as conn:
            return wait(conn, task_id, seconds, schema=settings.db_schema)
    except WaitTimeout:
        return None
    finally:
        release()


@operation(bp, "GET", "/v1/tasks/<task_id>/events", summary="A task's events in sequence order", role="reader",
           tag="tasks", path=TASK_ID, reads="replica",
           responses={200: ("Every event of the task.", Object({"events": Array(EVENT)}, required=("events",)))},
           errors=(InvalidInput, TaskNotFound))
def task_events(task_id):
    store = reads()
    events = store.tasks.task_events_list(task_id)
    if not events:  # every task has its 'queued' event: none means no task
        store.tasks.task_get(task_id)
    return json_response({"events": [event_json(e) for e in events]})


@operation(bp, "POST", "/v1/tasks/<task_id>/cancel", summary="Cancel a task", role="admin", tag="tasks",
           path=TASK_ID, body=REASON, body_required=False, audit="task.cancel",
           description="waiting or queued: cancelled at once. running: cancelling (its handler sees "
                       "ctx.cancel_requested at the next heartbeat; the task ends cancelled). Cancelling "
                       "again is not an error. A finished task: 409 task.not_cancellable.",
           responses={200: ("The task after the request.", TASK)},
           errors=(InvalidInput, TaskNotFound, TaskNotCancellable))
def cancel_task(task_id):
    store = api().store
    cancel(store, task_id, actor=g.principal.name, reason=g.body.get("reason"), request_id=g.request_id)
    current_draft().written = True
    return json_response(task_json(store.tasks.task_get(task_id)))


@operation(bp, "POST", "/v1/tasks/<task_id>/resume", summary="Resume a failed or cancelled task", role="admin",
           tag="tasks", path=TASK_ID, body=REASON, body_required=False, audit="task.resume",
           description="failed or cancelled: queued again with attempts reset (a full retry budget); a task "
                       "with parents not final yet waits for them again (`waiting`). Its dependents that it "
                       "cancelled by failing are re-armed. Completed: 409 task.not_resumable; waiting, queued "
                       "or running: 409 too.",
           responses={200: ("The task after the request.", TASK)},
           errors=(InvalidInput, TaskNotFound, TaskNotResumable))
def resume_task(task_id):
    store = api().store
    resume(store, task_id, actor=g.principal.name, reason=g.body.get("reason"), request_id=g.request_id)
    current_draft().written = True
    return json_response(task_json(store.tasks.task_get(task_id)))


BULK_FILTER = {
    "queue": Name(), "state": String(enum=STATES), "kind": Name(),
    "created_after": DateTime("Created at or after this time."),
    "created_before": DateTime("Created before this time."),
    "ids": Array(Uuid(), "Only these tasks.", min_items=1, max_items=BULK_MAX_IDS),
}
BULK_RESULT = Object({"changed": Integer("How many tasks this request changed."),
                      "limit": Integer("The limit it ran with: changed == limit means more may match.")},
                     required=("changed", "limit"))
BULK_SEMANTICS = {
    "retry": "failed or cancelled tasks are queued again with attempts reset, as the single resume does "
             "(event `resumed`).",
    "cancel": "waiting and queued tasks are cancelled at once, running ones go to cancelling, as the single "
              "cancel does.",
    "purge": "completed, failed and cancelled tasks are deleted with their events.",
}


def _bulk_view(action: str):
    def view():
        body = dict(g.body)
        limit, reason = body.pop("limit"), body.pop("reason", None)
        ids = body.pop("ids", None)
        task_filter = TaskFilter(**body, ids=None if ids is None else tuple(ids))
        changed = bulk(api().store, action, task_filter, actor=g.principal.name, limit=limit, reason=reason,
                       request_id=g.request_id)
        current_draft().written = True
        return json_response({"changed": changed, "limit": limit})

    view.__name__ = f"{action}_many"
    states, audit_action = BULK_ACTIONS[action]
    fields = {**BULK_FILTER, "limit": Integer(f"At most this many tasks change (default {BULK_DEFAULT_LIMIT}).",
                                              minimum=1, maximum=BULK_MAX_LIMIT, default=BULK_DEFAULT_LIMIT)}
    if action != "purge":
        fields["reason"] = String("Recorded in each task's event.", max_length=1000, nullable=True)
    operation(bp, "POST", f"/v1/tasks:{action}", summary=f"{action.capitalize()} the tasks of a filter",
              role="admin", tag="tasks", audit=audit_action,
              body=Object(fields, "Every given criterion must hold; give at least one."),
              description=f"Acts on {', '.join(states)} tasks only: {BULK_SEMANTICS[action]} Others are left "
                          f"alone, so a repeat changes only what is left. Oldest first, in transactions of "
                          f"{BULK_BATCH_SIZE} rows (rows locked right now are skipped); one audit row with the "
                          "count.",
              responses={200: ("How many tasks changed.", BULK_RESULT)}, errors=(InvalidInput,))(view)


for _action in BULK_ACTIONS:
    _bulk_view(_action)
