"""How the API's answers look on the wire: the JSON of a task, an event, a schedule, an audit
entry and an error, each next to the schema the OpenAPI document publishes for it. No request
handling, no database access and no Flask here: the `skiplock` commands print these same
answers (responses.py wraps them in Flask responses).
"""

from __future__ import annotations

import datetime as dt

from ..engine.durable import MAX_NAME, SUSPENDED_REASONS
from ..engine.excerpts import json_excerpt
from ..engine.model import ON_PARENT_FAILURE, STATES, AuditEntry, Signal, StepRecord, Task, TaskEvent
from ..engine.schedules import CATCHUP_POLICIES, OVERLAP_POLICIES, ScheduleStatus
from .schema import Array, Boolean, DateTime, Integer, JsonObject, JsonValue, Name, Number, Object, String, Uuid


def iso(value: dt.datetime | None) -> str | None:
    """RFC 3339 in UTC with a Z, e.g. 2030-01-01T09:00:00.123456Z."""
    if value is None:
        return None
    return value.astimezone(dt.timezone.utc).isoformat().replace("+00:00", "Z")



def duration_text(seconds: float) -> str:
    """A duration as a person reads it, in its two largest units: `12 s`, `53 min`, `2 h 5 min`, `3 d 4 h`."""
    whole = int(seconds)
    if whole < 60:
        return f"{whole} s"
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60), ("s", 1)):
        if whole >= size or parts:
            parts.append((whole // size, unit))
            whole %= size
        if len(parts) == 2:
            break
    return " ".join(f"{n} {unit}" for n, unit in parts if n)


ERROR = Object({
    "error": Object({
        "code": String("Stable, machine-readable: task.not_found, request.invalid, auth.forbidden, ...",
                       example="task.not_found"),
        "message": String("What went wrong, naming the field or the value."),
    }, required=("code", "message")),
}, "An error.", required=("error",))


# ---- tasks -------------------------------------------------------------------------------------

# a task's view shows at most this many of its parents' ids, and of its children's
RELATIVES_SHOWN = 100


def waiting_for(task: Task) -> dict | None:
    """What a waiting task waits for (null for any other state): a suspended one's sleep, signal
    or tasks (durable execution), else the parents of its depends_on."""
    if task.state != "waiting":
        return None  # a run keeps the columns until its outcome: read only while waiting
    if task.suspended == "sleep":
        return {"reason": "sleep", "until": iso(task.wake_at)}
    if task.suspended == "signal":
        return {"reason": "signal", "signal": task.awaited_signal, "timeout_at": iso(task.wake_at)}
    return {"reason": "tasks" if task.suspended == "tasks" else "parents", "count": task.waiting_on}


def waiting_text(waiting: dict | None) -> str:
    """`waiting_for` in words, as the CLI's tables and the console's pages show it."""
    if not waiting:
        return ""
    if waiting["reason"] == "sleep":
        return f"sleeping until {waiting['until']}"
    if waiting["reason"] == "signal":
        timeout = f" (timeout {waiting['timeout_at']})" if waiting["timeout_at"] else ""
        return f"waiting for signal {waiting['signal']}{timeout}"
    count, noun = waiting["count"], waiting["reason"]  # tasks | parents
    return f"waiting for {count} {noun if count != 1 else noun[:-1]}"


WAITING_FOR = Object({
    "reason": String("sleep (ctx.sleep), signal (ctx.wait_for_signal), tasks (ctx.wait_for_tasks), or parents "
                     "(a dependent of depends_on).", enum=(*SUSPENDED_REASONS, "parents")),
    "until": DateTime("sleep: when it is queued again (the database's clock)."),
    "signal": String("signal: the signal's name."),
    "timeout_at": DateTime("signal: when the wait gives up (it returns None); null: never.", nullable=True),
    "count": Integer("tasks, parents: how many of them are not final yet."),
}, "What a `waiting` task waits for; null in any other state.", required=("reason",), nullable=True)


def task_json(task: Task, *, parents: list | None = None, children: list | None = None) -> dict:
    """A task; with `parents` and `children` (ids, read with up to RELATIVES_SHOWN + 1 of each:
    the extra one only says there are more), its relatives too, as the single-task view shows them."""
    body = {
        "id": str(task.id), "kind": task.kind, "queue": task.queue, "priority": task.priority,
        "payload": task.payload, "state": task.state, "attempts": task.attempts,
        "max_attempts": task.max_attempts, "reclaims": task.reclaims, "lease_owner": task.lease_owner,
        "lease_until": iso(task.lease_until), "run_after": iso(task.run_after), "deadline": iso(task.deadline),
        "idempotency_key": task.idempotency_key, "concurrency_key": task.concurrency_key or None,
        "cursor": task.cursor, "progress": task.progress,
        "message": task.message, "result": task.result, "last_error": task.last_error,
        "last_error_traceback": task.last_error_traceback,
        "created_at": iso(task.created_at), "updated_at": iso(task.updated_at),
        "started_at": iso(task.started_at), "finished_at": iso(task.finished_at),
        "waiting_on": task.waiting_on, "on_parent_failure": task.on_parent_failure,
        "waiting_for": waiting_for(task),
    }
    for name, ids in (("parents", parents), ("children", children)):
        if ids is not None:
            body[name] = [str(i) for i in ids[:RELATIVES_SHOWN]]
            body[f"{name}_truncated"] = len(ids) > RELATIVES_SHOWN
    return body


TASK = Object({
    "id": Uuid("UUIDv7: ids sort in creation order."),
    "kind": Name(), "queue": Name(), "priority": Integer("Higher runs first."),
    "payload": JsonObject(),
    "state": String(enum=STATES),
    "attempts": Integer("Executions that ended in an outcome."),
    "max_attempts": Integer("Executions allowed before the task fails: the one it was enqueued with, else, from "
                            "its first claim on, its kind's (`@task(max_attempts=)`, 3 when undeclared), which "
                            "the claiming worker writes. null only while a task enqueued without one waits for "
                            "its first claim (only workers know the kinds).", nullable=True),
    "reclaims": Integer("Times an expired lease was taken back."),
    "lease_owner": String(nullable=True), "lease_until": DateTime(nullable=True),
    "run_after": DateTime("Not claimed before this time."),
    "deadline": DateTime("No retry is scheduled after this time.", nullable=True),
    "idempotency_key": String(nullable=True),
    "concurrency_key": String("Its group under its kind's flow-control limit (GET /v1/limits); null: the "
                              "kind's one group without a key.", nullable=True),
    "cursor": JsonValue("The last saved step's cursor."),
    "progress": Number(nullable=True), "message": String(nullable=True),
    "result": JsonValue("What the handler returned."),
    "last_error": String("The latest attempt's error (`Type: message`), or why its lease was taken back.",
                         nullable=True),
    "last_error_traceback": String(
        "The handler's traceback that goes with last_error, as the latest `retrying` or `failed` event's "
        "`data.traceback` holds it: its last 30 frames and 8 KiB at most (the end is where the error is), "
        "with a `[... cut ...]` line where more was. null when last_error has none (a Retry, a timeout, "
        "a lost lease) and in list pages: read the task for it.", nullable=True),
    "created_at": DateTime(), "updated_at": DateTime(),
    "started_at": DateTime(nullable=True), "finished_at": DateTime(nullable=True),
    "waiting_on": Integer("Parents not final yet: a `waiting` task is queued when this reaches 0."),
    "on_parent_failure": String("What a parent ending failed or cancelled does to it: `cancel` it, or let it "
                                "`run` once every parent is final.", enum=ON_PARENT_FAILURE),
    "waiting_for": WAITING_FOR,
    "parents": Array(Uuid(), f"The tasks it depends on (depends_on), in id order: at most {RELATIVES_SHOWN}. "
                             "Only in the single-task view (GET /v1/tasks/{id})."),
    "parents_truncated": Boolean(f"true: it has more than {RELATIVES_SHOWN} parents."),
    "children": Array(Uuid(), f"The tasks that depend on it, in id order: at most {RELATIVES_SHOWN}. Only in the "
                              "single-task view."),
    "children_truncated": Boolean(f"true: it has more than {RELATIVES_SHOWN} children."),
}, "A task.", required=("id", "kind", "queue", "priority", "payload", "state", "attempts", "created_at"))


def event_json(event: TaskEvent) -> dict:
    return {"seq": event.seq, "type": event.type, "at": iso(event.at), "attempt": event.attempt,
            "lease_token": event.lease_token, "data": event.data}


EVENT = Object({
    "seq": Integer("1, 2, 3, ... per task, without gaps."),
    "type": String("waiting, queued, running, completed, retrying, checkpoint, cancelling, cancelled, resumed, ..."),
    "at": DateTime(), "attempt": Integer(nullable=True), "lease_token": Integer(nullable=True),
    "data": JsonValue("retrying and failed: `error`, and `traceback` when the handler raised (bounded as "
                      "a task's last_error_traceback); retrying: `delay`."),
}, required=("seq", "type", "at"))


# ---- durable execution: a task's steps, signals ---------------------------------------------------

# a JSON value's excerpt (a step's result, a signal's payload) in the CLI's tables and on the
# console's pages, in printable characters: the API gives the value whole
EXCERPT_CHARS = 128


def value_excerpt(value) -> str:
    return json_excerpt(value, EXCERPT_CHARS)


def step_json(step: StepRecord) -> dict:
    return {"position": step.position, "name": step.name, "occurrence": step.occurrence, "type": step.type,
            "result": step.result, "lease_token": step.lease_token, "attempt": step.attempt,
            "recorded_at": iso(step.recorded_at)}


def step_label(step: dict) -> str:
    """name, or name#occurrence from the second call of a name on (`email`, then `email#2`)."""
    return step["name"] if step["occurrence"] == 1 else f"{step['name']}#{step['occurrence']}"


STEP = Object({
    "position": Integer("Its place in the handler's calls, from 1."),
    "name": String(max_length=MAX_NAME),
    "occurrence": Integer("1 for the name's first call in a run, 2 for the next (`email`#2), ..."),
    "type": String("step: ctx.step or step_transaction; sleep, signal, tasks: a wait, recorded when it began.",
                   enum=("step", *SUSPENDED_REASONS)),
    "result": JsonValue("What the step returned, whole (at most SKIPLOCK_MAX_PAYLOAD_BYTES); a wait's record: "
                        "its end, its signal, what it resolved to."),
    "lease_token": Integer("The run that recorded it: its claim's lease token."),
    "attempt": Integer("The run that recorded it: its attempt."),
    "recorded_at": DateTime(),
}, "One recorded call of a task's handler.", required=("position", "name", "occurrence", "type", "recorded_at"))


def signal_json(signal: Signal) -> dict:
    return {"name": signal.name, "payload": signal.payload, "sent_at": iso(signal.sent_at)}


SIGNAL = Object({
    "name": String(max_length=MAX_NAME), "payload": JsonValue("As the first send gave it."),
    "sent_at": DateTime("When the first send was made (its transaction's start, on the database's clock)."),
}, "A signal: the first send of its name.", required=("name", "sent_at"))


# ---- schedules ---------------------------------------------------------------------------------

def schedule_json(status: ScheduleStatus) -> dict:
    body = status.schedule.as_dict()
    body.update(next_fire_at=iso(status.next_fire_at), buffered_fire_at=iso(status.buffered_fire_at),
                last_fire_at=iso(status.last_fire_at),
                last_task_id=None if status.last_task_id is None else str(status.last_task_id),
                fires=status.fires, skips=status.skips, created_at=iso(status.created_at),
                updated_at=iso(status.updated_at))
    return body


def schedule_fields(defaults: bool = True) -> dict:
    """The fields a client writes: POST creates with them (defaults filled in), PATCH changes
    the ones it names (no defaults: a field left out keeps its value)."""
    def d(value):
        return {"default": value} if defaults else {}

    return {
        "kind": Name("The kind of the tasks it enqueues."),
        "queue": Name(**d("default")),
        "payload": JsonObject(**d({})),
        "priority": Integer(minimum=-32768, maximum=32767, **d(0)),
        "max_attempts": Integer(minimum=1, maximum=2**31 - 1, nullable=True),
        "cron": String("5 fields or an @alias (@hourly, @daily, ...); day-of-month also takes L and LW, "
                       "day-of-week nL and DAY#n; exactly one of cron and interval_seconds.", max_length=200, nullable=True, example="0 6 * * *"),
        "timezone": String("IANA time zone of the cron expression.", max_length=64, **d("UTC")),
        "interval_seconds": Number(minimum=0.001, maximum=10 * 365 * 86400.0, nullable=True),
        "overlap": String(enum=OVERLAP_POLICIES, **d("skip")),
        "catchup": String(enum=CATCHUP_POLICIES, **d("one")),
        "catchup_window_seconds": Number(minimum=0.001, maximum=10 * 365 * 86400.0, **d(3600.0)),
        "jitter_seconds": Number(minimum=0, maximum=86400.0, **d(0.0)),
        "enabled": Boolean("false: paused (resuming starts at the next fire after now).", **d(True)),
    }


SCHEDULE = Object({
    "name": Name(), **schedule_fields(),
    "next_fire_at": DateTime(), "buffered_fire_at": DateTime(nullable=True),
    "last_fire_at": DateTime(nullable=True), "last_task_id": Uuid(nullable=True),
    "fires": Integer(), "skips": Integer(), "created_at": DateTime(), "updated_at": DateTime(),
}, "A schedule and where it stands.", required=("name", "kind", "next_fire_at"))


# ---- audit ---------------------------------------------------------------------------------------

def audit_json(entry: AuditEntry) -> dict:
    return {"id": entry.id, "at": iso(entry.at), "actor": entry.actor, "action": entry.action,
            "target": entry.target, "request_id": entry.request_id, "outcome": entry.outcome,
            "detail": entry.detail}


AUDIT_ENTRY = Object({
    "id": Integer(), "at": DateTime(),
    "actor": String("The token's name ('anonymous' while auth is disabled)."),
    "action": String(example="task.cancel"),
    "target": String("A task id, a queue, kind or schedule name.", nullable=True),
    "request_id": String(nullable=True),
    "outcome": String("ok, or the code of the error the request was refused with."),
    "detail": JsonValue(),
}, required=("id", "at", "actor", "action", "outcome"))


def page(items_name: str, item: Object) -> Object:
    return Object({items_name: Array(item),
                   "next_cursor": String("Pass as `cursor` for the next page; null on the last.", nullable=True)},
                  required=(items_name, "next_cursor"))
