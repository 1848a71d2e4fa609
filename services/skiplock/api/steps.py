"""A task's step log over HTTP (durable execution): GET /v1/tasks/{id}/steps, the calls its
handler recorded in order, each with the run that recorded it and its whole result.

What the records mean, and who writes them, is the worker's (worker/durable.py); this only reads.
"""

from __future__ import annotations

from flask import Blueprint, g

from ..engine.errors import InvalidInput, TaskNotFound
from .app_state import reads
from .listings import STEP_LIST_QUERY, step_listing
from .operations import operation
from .render import STEP
from .responses import json_response
from .schema import Array, Integer, Object, Uuid

bp = Blueprint("steps", __name__)

STEPS = Object({
    "steps": Array(STEP, "In call order."),
    "next_after": Integer("Pass as `after` for the next page; null on the last.", nullable=True),
}, required=("steps", "next_after"))


@operation(bp, "GET", "/v1/tasks/<task_id>/steps", summary="A task's step log, in call order", role="reader",
           tag="tasks", path={"task_id": Uuid("The task's id.")}, query=STEP_LIST_QUERY, reads="replica",
           description="Every ctx.step, step_transaction and wait the task's handler recorded: name, occurrence "
                       "(the same name again in a run is its next occurrence), position, type, the run that "
                       "recorded it (lease_token, attempt), when, and the step's result, whole. A task without "
                       "steps answers an empty list; an unknown task, 404.",
           responses={200: ("A page of the task's steps.", STEPS)}, errors=(InvalidInput, TaskNotFound))
def task_steps(task_id):
    return json_response(step_listing(reads(), task_id, g.query["after"], g.query["limit"]))
