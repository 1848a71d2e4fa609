"""How a route is declared: `@operation(bp, "POST", "/v1/tasks", ...)` registers the view and
attaches what the rest of the app reads from it — the role it needs (auth), its path, query and
body shapes (validation, before the view runs), its audit action, where its reads may go (the
primary, or a read replica: replica.py states the rule), and its documentation (openapi.py builds
the document from these declarations and the app's URL map).

A route without a declaration cannot exist: `operation()` is the only way views are added.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from flask import Blueprint

from ..engine.errors import SkiplockError
from ..engine.settings import API_ROLES
from .replica import READ_FROM, routed
from .schema import Field, String

# Bodies of small requests (cancel, pause, schedules without a payload) stay under this.
SMALL_BODY = 64 * 1024

READ_FROM_FIELD = String("`primary`: read from the primary even when a read replica is configured (to see "
                         "a change this caller just made).", enum=("primary",))


@dataclasses.dataclass(frozen=True)
class Operation:
    method: str
    rule: str  # the Flask rule, e.g. /v1/tasks/<task_id>
    summary: str
    role: str | None  # None: public (health, metrics, the document itself)
    tag: str
    responses: Mapping[int, tuple[str, Field | None]]
    errors: tuple[type[SkiplockError], ...] = ()
    path: Mapping[str, Field] = dataclasses.field(default_factory=dict)
    query: Mapping[str, Field] = dataclasses.field(default_factory=dict)
    headers: Mapping[str, Field] = dataclasses.field(default_factory=dict)
    body: Field | None = None
    body_required: bool = True
    # the largest body in bytes; a callable gets the app's settings
    max_body: int | Callable = SMALL_BODY
    audit: str | None = None  # the audit action of a mutating route
    bounded: bool = False  # a submission: counted against its token's rate and concurrency (admission_bounds.py)
    description: str = ""
    content_type: str = "application/json"  # of the success response
    # "replica": a pure read that a read replica may serve (replica.py's rule says which routes);
    # "primary": everything else, the default
    reads: str = "primary"


def operation(bp: Blueprint, method: str, rule: str, **declaration) -> Callable:
    """Register the decorated function as the view of (method, rule) and declare it."""
    if declaration.get("reads") == "replica":
        # the caller who must see its own writes says so (replica.py)
        declaration["headers"] = {**declaration.get("headers", {}), READ_FROM: READ_FROM_FIELD}
    op = Operation(method=method, rule=rule, **declaration)
    if op.role is not None and op.role not in API_ROLES:
        raise ValueError(f"{method} {rule}: unknown role {op.role!r}")
    if op.reads not in ("primary", "replica") or (op.reads == "replica" and (method != "GET" or op.audit)):
        raise ValueError(f"{method} {rule}: reads={op.reads!r}: only a GET that changes nothing may read a replica")

    def register(view: Callable) -> Callable:
        if op.reads == "replica":
            view = routed(view)
        view.operation = op
        bp.add_url_rule(rule, endpoint=view.__name__, view_func=view, methods=[method],
                        provide_automatic_options=False)
        return view

    return register
