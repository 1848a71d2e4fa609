"""Queues and kinds over HTTP: the overview of every queue (tasks per state, what is claimable
now and how long the oldest of it has waited, the paused flag), each queue's completions and
failures per minute (the console's throughput chart), and pausing or resuming a queue or a task
kind. A pause is a flag: tasks stay queued and are not claimed until it is lifted.
"""

from __future__ import annotations

import datetime as dt

from flask import Blueprint, g

from ..engine.errors import InvalidInput
from ..engine.model import STATES
from ..engine.task_actions import set_paused
from .audit import current_draft
from .app_state import api, reads
from .listings import queue_overview
from .operations import operation
from .render import iso
from .responses import json_response
from .schema import Array, Boolean, DateTime, Integer, Name, Number, Object

bp = Blueprint("queues", __name__)

QUEUE = Object({
    "name": Name(),
    "tasks": Object({state: Integer() for state in STATES}, "Tasks per state."),
    "claimable": Integer("Queued tasks a worker could claim now (run_after reached, kind not paused)."),
    "throttled": Integer("Queued tasks a flow-control limit holds back now (GET /v1/limits); not counted "
                         "in claimable."),
    "oldest_claimable_age_seconds": Number("How long the oldest claimable task has waited.", nullable=True),
    "paused": Boolean(),
}, required=("name", "tasks", "claimable", "throttled", "oldest_claimable_age_seconds", "paused"))
OVERVIEW = Object({"queues": Array(QUEUE, "Every queue with tasks or a pause, by name."),
                   "paused_kinds": Array(Name(), "Task kinds paused in every queue.")},
                  required=("queues", "paused_kinds"))
MINUTE = Object({"minute": DateTime("The minute's start."), "completed": Integer(), "failed": Integer()},
                required=("minute", "completed", "failed"))
THROUGHPUT = Object({
    "minutes": Integer("The window's length; the current minute is its last."),
    "since": DateTime("The first minute's start."),
    "queues": Array(Object({
        "name": Name(),
        "completed": Integer("Completed in the window."),
        "failed": Integer("Failures in the window (each failed attempt that ended the task)."),
        "per_minute": Array(MINUTE, "Every minute of the window, oldest first, zeros included."),
    }, required=("name", "completed", "failed", "per_minute")),
        "Every queue with an outcome in the window, by name."),
}, required=("minutes", "since", "queues"))
PAUSE = {"queue": Object({"queue": Name(), "paused": Boolean()}, required=("queue", "paused")),
         "kind": Object({"kind": Name(), "paused": Boolean()}, required=("kind", "paused"))}


@operation(bp, "GET", "/v1/queues", summary="Overview of every queue", role="reader", tag="queues", reads="replica",
           responses={200: ("The queues.", OVERVIEW)})
def overview():
    return json_response(queue_overview(reads()))


@operation(bp, "GET", "/v1/queues/throughput", summary="Tasks completed and failed per queue and minute",
           role="reader", tag="queues", reads="replica",
           query={"minutes": Integer("The window, in whole minutes up to now.", minimum=1, maximum=1440,
                                     default=60)},
           description="Counted from the tasks' completed and failed events; tasks deleted by the "
                       "retention no longer count.",
           responses={200: ("Per queue, its outcomes per minute.", THROUGHPUT)}, errors=(InvalidInput,))
def throughput():
    return json_response(queue_throughput(reads(), g.query["minutes"]))


def queue_throughput(store, minutes: int) -> dict:
    """GET /v1/queues/throughput's answer: a dense series per queue (a minute without outcomes is
    a zero), so a chart needs no arithmetic on times."""
    since, rows = store.tasks.task_event_throughput(minutes)
    starts = [since + dt.timedelta(minutes=i) for i in range(minutes)]
    series: dict[str, dict[dt.datetime, tuple[int, int]]] = {}
    for queue, minute, completed, failed in rows:
        series.setdefault(queue, {})[minute] = (completed, failed)
    queues = []
    for name in sorted(series):
        counts = [series[name].get(start, (0, 0)) for start in starts]
        queues.append({"name": name, "completed": sum(c for c, _ in counts), "failed": sum(f for _, f in counts),
                       "per_minute": [{"minute": iso(start), "completed": c, "failed": f}
                                      for start, (c, f) in zip(starts, counts)]})
    return {"minutes": minutes, "since": iso(since), "queues": queues}


def _register(scope: str, plural: str, action: str) -> None:
    pause = action == "pause"

    def view(name):
        set_paused(api().store, scope, name, pause, actor=g.principal.name, request_id=g.request_id)
        current_draft().written = True
        return json_response({scope: name, "paused": pause})

    view.__name__ = f"{action}_{scope}"
    summary = (f"Pause a {scope}: its tasks stay queued and are not claimed" if pause
               else f"Resume a paused {scope}")
    operation(bp, "POST", f"/v1/{plural}/<name>/{action}", summary=summary, role="admin", tag="queues",
              path={"name": Name(f"The {scope}'s name.")}, audit=f"{scope}.{action}",
              description="Idempotent: pausing a paused one (or resuming a running one) changes nothing.",
              responses={200: (f"The {scope}'s pause flag now.", PAUSE[scope])}, errors=(InvalidInput,))(view)


for _scope, _plural in (("queue", "queues"), ("kind", "kinds")):
    for _action in ("pause", "resume"):
        _register(_scope, _plural, _action)
