"""What the API answers and the `skiplock` commands print alike, without Flask: the query strings
of the list routes (GET /v1/tasks, GET /v1/audit, GET /v1/tasks/{id}/steps, GET /v1/signals: the
routes declare them, the commands check their options against them) and the signals' page
cursor, the queue overview (GET /v1/queues) and the limits listing
(GET /v1/limits, with the words and audit detail of a limit change). The routes serve these in
tasks.py, audit.py, queues.py and flow_control.py; nothing here imports Flask or werkzeug.
"""

from __future__ import annotations

import base64
import datetime as dt
import json

from ..engine.durable import MAX_NAME
from ..engine.errors import InvalidInput, LimitNotFound
from ..engine.limits import Limit
from ..engine.model import STATES
from ..engine.model import Signal
from ..engine.store import LimitRecord, LimitStats
from .render import iso, signal_json, step_json
from .schema import DateTime, Integer, Name, String, Uuid

IDEMPOTENCY_KEY = String("Up to 255 printable ASCII characters. The same key with the same body answers 200 "
                         "with the task it created; with another body, 409 task.idempotency_conflict.",
                         min_length=1, max_length=255, pattern=r"^[!-~]+$")

TASK_LIST_QUERY = {
    "queue": Name(), "state": String(enum=STATES), "kind": Name(),
    "created_after": DateTime("Created at or after this time."),
    "created_before": DateTime("Created before this time."),
    "id": Uuid("Only this task."), "idempotency_key": IDEMPOTENCY_KEY,
    "limit": Integer(minimum=1, maximum=500, default=50),
    "cursor": Uuid("next_cursor of the previous page."),
}

AUDIT_LIST_QUERY = {
    "action": String("Only this action, e.g. task.cancel.", max_length=100),
    "actor": Name("Only requests made with this token."),
    "target": String("Only this target (a task id, a queue name, ...).", max_length=200),
    "limit": Integer(minimum=1, maximum=500, default=50),
    "cursor": String("next_cursor of the previous page.", pattern=r"^[0-9]{1,18}$"),
}

STEP_LIST_QUERY = {
    "after": Integer("Only the steps after this position (the previous page's next_after).", minimum=0,
                     maximum=2**31 - 1, default=0),
    "limit": Integer(minimum=1, maximum=500, default=100),
}

SIGNAL_LIST_QUERY = {
    "prefix": String("Only the signals whose name starts with this.", min_length=1, max_length=MAX_NAME),
    "limit": Integer(minimum=1, maximum=500, default=50),
    "cursor": String("next_cursor of the previous page.", max_length=400, pattern=r"^[A-Za-z0-9_-]+={0,2}$"),
}


def signal_cursor(signal: Signal) -> str:
    """The keyset of a signals page, (sent_at, name), as one opaque URL-safe string."""
    text = json.dumps([signal.sent_at.isoformat(), signal.name], separators=(",", ":"))
    return base64.urlsafe_b64encode(text.encode()).decode()


def signal_after(cursor: str | None) -> tuple[dt.datetime, str] | None:
    """signal_cursor's keyset back, or InvalidInput naming `cursor`."""
    if cursor is None:
        return None
    try:
        at, name = json.loads(base64.urlsafe_b64decode(cursor.encode()))
        return dt.datetime.fromisoformat(at), str(name)
    except (ValueError, TypeError):
        raise InvalidInput("cursor: not a next_cursor of GET /v1/signals") from None


def step_listing(store, task_id, after: int, limit: int) -> dict:
    """GET /v1/tasks/{id}/steps' answer (also `skiplock tasks steps`): TaskNotFound for no task."""
    steps = store.steps.task_steps_list(task_id, after=after, limit=limit + 1)
    if not steps:
        store.tasks.task_get(task_id)  # TaskNotFound: an empty page may mean no task
    more, steps = len(steps) > limit, steps[:limit]
    return {"steps": [step_json(s) for s in steps], "next_after": steps[-1].position if more else None}


def signal_listing(store, prefix: str | None, limit: int, cursor: str | None) -> dict:
    """GET /v1/signals' answer (also `skiplock signals list`)."""
    rows = store.steps.signal_list(prefix=prefix, limit=limit + 1, before=signal_after(cursor))
    more, rows = len(rows) > limit, rows[:limit]
    return {"signals": [signal_json(s) for s in rows], "next_cursor": signal_cursor(rows[-1]) if more else None}


def queue_overview(store) -> dict:
    """GET /v1/queues' answer (also `skiplock queues list`)."""
    counts = store.tasks.queue_task_counts()
    pauses = store.tasks.pause_list()
    claimable = store.tasks.queue_claimable([name for scope, name, _ in pauses if scope == "kind"])
    queues: dict[str, dict] = {}

    def queue(name: str) -> dict:
        return queues.setdefault(name, {"name": name, "tasks": dict.fromkeys(STATES, 0), "claimable": 0,
                                        "throttled": 0, "oldest_claimable_age_seconds": None, "paused": False})

    for name, state, n in counts:
        queue(name)["tasks"][state] = n
    for name, n, oldest_age, paused, throttled in claimable:
        queue(name).update(claimable=n, oldest_claimable_age_seconds=oldest_age, paused=paused,
                           throttled=throttled)
    for scope, name, _ in pauses:
        if scope == "queue":
            queue(name)["paused"] = True
    return {"queues": [queues[name] for name in sorted(queues)],
            "paused_kinds": sorted(name for scope, name, _ in pauses if scope == "kind")}


def limit_json(record: LimitRecord, stats: LimitStats | None) -> dict:
    body = record.limit.as_dict()
    body["updated_at"] = iso(record.updated_at)
    if stats is None:  # deleted between the two reads
        body.update(throttled=0, running=0, busy_groups=0, saturation=None, tokens=None)
    else:
        body.update(throttled=stats.throttled, running=stats.running, busy_groups=stats.busy_groups,
                    saturation=stats.saturation, tokens=stats.tokens)
    return body


def limit_listing(store) -> dict:
    """GET /v1/limits' answer (also `skiplock limits list -o json`)."""
    records = store.limits.limit_list()
    stats = {s.kind: s for s in store.limits.limit_stats()} if records else {}
    return {"limits": [limit_json(r, stats.get(r.limit.kind)) for r in records]}


def limit_view(store, kind: str) -> dict:
    record = store.limits.limit_get(kind)
    if record is None:
        raise LimitNotFound(f"no limit for kind {kind!r}")
    return limit_json(record, next((s for s in store.limits.limit_stats() if s.kind == kind), None))


def change_of(created: bool | None) -> str:
    """limit_upsert's answer as a word: created, updated or unchanged."""
    return "unchanged" if created is None else "created" if created else "updated"


def limit_detail(limit: Limit, change: str) -> dict:
    """The audit row's detail of a limit set (the API's and the CLI's)."""
    return {"change": change, "concurrency": limit.concurrency, "rate": limit.rate, "burst": limit.burst}
