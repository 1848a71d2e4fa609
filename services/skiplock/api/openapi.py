"""GET /v1/openapi.json: the OpenAPI 3 document of the API, built from the app's URL map and each
route's declaration (operations.py), so every registered route is in it with its parameters,
body, responses and errors, and nothing that is not registered is. Nothing is written by hand.
"""

from __future__ import annotations

import re
from collections import defaultdict

from flask import Blueprint, Flask, current_app

from ..engine.errors import (DatabaseUnavailable, Forbidden, InvalidInput, PayloadTooLarge, SkiplockError,
                             TooManyRequests, Unauthorized)
from .operations import SMALL_BODY, Operation, operation
from .render import ERROR
from .responses import json_response
from .schema import JsonObject

bp = Blueprint("openapi", __name__)

VERSION = "1"
_PARAM = re.compile(r"<(?:[^:<>]+:)?([^<>]+)>")
_ERROR_REF = {"$ref": "#/components/schemas/Error"}


def openapi_path(rule: str) -> str:
    """/v1/tasks/<task_id> -> /v1/tasks/{task_id}"""
    return _PARAM.sub(r"{\1}", rule)


def _errors(op: Operation) -> dict[int, list[type[SkiplockError]]]:
    errors: list[type[SkiplockError]] = list(op.errors)
    if op.body is not None or op.query or op.path or op.headers:
        errors.append(InvalidInput)
    if op.body is not None:
        errors.append(PayloadTooLarge)
    # a submission's admission bounds, or a body that may be large (its room per worker may be full)
    if op.bounded or (op.body is not None and op.max_body != SMALL_BODY):
        errors.append(TooManyRequests)
    if op.role is not None:
        errors += [Unauthorized, Forbidden, DatabaseUnavailable]
    by_status: dict[int, list[type[SkiplockError]]] = defaultdict(list)
    for error in errors:
        if error not in by_status[error.status]:
            by_status[error.status].append(error)
    return by_status


def _operation(op: Operation, endpoint: str) -> dict:
    doc: dict = {"operationId": endpoint.replace(".", "_"), "summary": op.summary, "tags": [op.tag]}
    description = op.description
    if op.role is not None:
        description = f"{description}\n\nRequires role `{op.role}` or stronger.".strip()
        doc["x-required-role"] = op.role
    else:
        doc["security"] = []
    if description:
        doc["description"] = description
    parameters = [{"name": name, "in": "path", "required": True, "schema": field.json_schema()}
                  for name, field in op.path.items()]
    parameters += [{"name": name, "in": "query", "required": False, "schema": field.json_schema()}
                   for name, field in op.query.items()]
    parameters += [{"name": name, "in": "header", "required": False, "schema": field.json_schema()}
                   for name, field in op.headers.items()]
    if parameters:
        doc["parameters"] = parameters
    if op.body is not None:
        doc["requestBody"] = {"required": op.body_required,
                              "content": {"application/json": {"schema": op.body.json_schema()}}}
    responses: dict[str, dict] = {}
    for status, (text, schema) in sorted(op.responses.items()):
        response: dict = {"description": text}
        if schema is not None:
            response["content"] = {op.content_type: {"schema": schema.json_schema()}}
        responses[str(status)] = response
    for status, errors in sorted(_errors(op).items()):
        codes = ", ".join(f"`{e.code}`" for e in errors)
        responses[str(status)] = {"description": f"Error: {codes}.",
                                  "content": {"application/json": {"schema": _ERROR_REF}}}
    doc["responses"] = responses
    return doc


def document(app: Flask) -> dict:
    paths: dict[str, dict] = defaultdict(dict)
    for rule in sorted(app.url_map.iter_rules(), key=lambda r: r.rule):
        if rule.endpoint == "static":
            continue
        op: Operation = app.view_functions[rule.endpoint].operation
        paths[openapi_path(rule.rule)][op.method.lower()] = _operation(op, rule.endpoint)
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "skiplock API",
            "version": VERSION,
            "description": "Submit, find and operate durable tasks. Every error is "
                           '{"error": {"code": ..., "message": ...}}. Authenticate with '
                           "`Authorization: Bearer <token>`; roles rank reader < submitter < admin.",
        },
        "paths": dict(paths),
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {"Error": ERROR.json_schema()},
        },
        "security": [{"bearer": []}],
    }


@operation(bp, "GET", "/v1/openapi.json", summary="This document", role=None, tag="health",
           responses={200: ("The OpenAPI 3 document.", JsonObject())})
def openapi_document():
    cached = current_app.extensions.get("skiplock.openapi")
    if cached is None:
        cached = current_app.extensions["skiplock.openapi"] = document(current_app)
    return json_response(cached)
