"""GET /v1/kinds: the task kinds this API process knows, with the JSON Schema of each typed
kind's payload (`@task(..., payload=Model)`), for clients that build or check submissions.

The API knows the kinds whose modules it imported from SKIPLOCK_TASKS (app.py imports them when
the app is built), and validates `POST /v1/tasks` payloads of the typed ones (tasks.py). Without
SKIPLOCK_TASKS the list is empty and payloads are stored as given; the worker still validates
them at run. Read-only, and reads no database: the answer is this process's registry.
"""

from __future__ import annotations

from flask import Blueprint

from ..engine.payload_types import json_schema
from ..engine.registry import REGISTRY
from .operations import operation
from .responses import json_response
from .schema import Array, Integer, JsonObject, Name, Object

bp = Blueprint("kinds", __name__)

KIND = Object({
    "kind": Name(),
    "queue": Name("The queue its tasks go to unless a submission names another."),
    "max_attempts": Integer("Executions before a task of the kind fails, unless a submission sets its own."),
    "payload_schema": JsonObject("The JSON Schema (draft 2020-12, as pydantic writes it) a payload must satisfy; "
                                 "null for a kind without a payload model, whose payloads are any JSON object.",
                                 nullable=True),
}, required=("kind", "queue", "max_attempts", "payload_schema"))
LISTING = Object({"kinds": Array(KIND, "By kind. Empty when the API was started without SKIPLOCK_TASKS.")},
                 required=("kinds",))


@operation(bp, "GET", "/v1/kinds", summary="The task kinds this API knows, with their payloads' JSON Schema",
           role="reader", tag="queues",
           description="The kinds defined in the modules named by SKIPLOCK_TASKS, which the API imports at "
                       "startup. `POST /v1/tasks` and `POST /v1/tasks:batch` validate the payload of a kind "
                       "listed here with a schema, and answer 400 `request.invalid` with the validation "
                       "message when it does not match; nothing is enqueued. Other kinds' payloads are "
                       "stored as given, and a worker fails a task whose payload its model refuses. A "
                       "submission without `queue` goes to the kind's `queue` listed here; a kind not listed "
                       "(the API was started without its module) goes to `default`.",
           responses={200: ("The kinds.", LISTING)})
def list_kinds():
    kinds = []
    for kind in REGISTRY.kinds():
        definition = REGISTRY.get(kind)
        kinds.append({"kind": kind, "queue": definition.queue, "max_attempts": definition.max_attempts,
                      "payload_schema": json_schema(definition)})
    return json_response({"kinds": kinds})
