"""Flow-control limits over HTTP: list them with what each holds back now, read one, set one
(PUT: create or replace) and delete one. Reading takes a reader's token; changing one takes an
admin's, since a limit binds every worker's claims, and each change commits with its audit row.

What a limit means, and its validation, are engine/limits.py's (the same rules as `skiplock
limits set` and a limits file); the API's own admission bounds per token are api/admission_bounds.py's,
a different thing.
"""

from __future__ import annotations

from flask import Blueprint, Response, g

from ..engine.errors import InvalidInput, LimitNotFound
from ..engine.limits import Limit
from .audit import audited
from .app_state import reads
from .listings import change_of, limit_detail, limit_listing, limit_view
from .operations import operation
from .responses import json_response
from .schema import Array, DateTime, Integer, Name, Number, Object, String

bp = Blueprint("limits", __name__)

_MAX_INT = 2**31 - 1
KIND = {"kind": Name("The task kind the limit applies to.")}
RATE = String("At most N starts per period and group: N/s, N/m, N/h, N/d, or N/<seconds>s (5/10s). null: "
              "no rate limit.", max_length=64, nullable=True, example="100/s")
SETTING = Object({
    "concurrency": Integer("At most this many tasks of a group running at once. null: no concurrency limit.",
                           minimum=1, maximum=_MAX_INT, nullable=True, example=2),
    "rate": RATE,
    "burst": Integer("Starts a group may make at once, on top of its rate (its token bucket's size). Only "
                     "with a rate; null: one second's worth of the rate, at least 1.", minimum=1, maximum=_MAX_INT,
                     nullable=True),
}, "A kind's limit: a concurrency, a rate, or both. It replaces the kind's limit whole: a field left out "
   "is no limit.")
LIMIT = Object({
    "kind": Name(),
    "concurrency": Integer("Runs at once per group.", nullable=True),
    "rate": RATE,
    "rate_per_second": Number("The rate as starts per second.", nullable=True),
    "burst": Integer("The token bucket's size.", nullable=True),
    "updated_at": DateTime("When the limit was last set."),
    "throttled": Integer("Queued tasks the limit holds back now (not claimable until their group has room)."),
    "running": Integer("Live runs of the kind's groups (lease not expired)."),
    "busy_groups": Integer("Groups (concurrency keys) with runs or throttled tasks."),
    "saturation": Number("running / (concurrency x busy_groups): 1.0 when every group with work is at its "
                         "limit. null without a concurrency limit.", nullable=True),
    "tokens": Number("Tokens in the emptiest bucket among groups with throttled tasks. null without a rate "
                     "limit or such a group.", nullable=True),
}, "A kind's limit, and what it holds back now.",
    required=("kind", "concurrency", "rate", "rate_per_second", "burst", "updated_at", "throttled", "running",
              "busy_groups", "saturation", "tokens"))
LISTING = Object({"limits": Array(LIMIT, "Every limit, by kind.")}, required=("limits",))


@operation(bp, "GET", "/v1/limits", summary="Every flow-control limit, with what it holds back now",
           role="reader", tag="limits", reads="replica",
           description="A limit applies per (kind, concurrency_key) group: at most `concurrency` runs at once "
                       "and at most `rate` starts, `burst` at once, in every group of the kind.",
           responses={200: ("The limits.", LISTING)})
def list_limits():
    return json_response(limit_listing(reads()))


@operation(bp, "GET", "/v1/limits/<kind>", summary="Read a kind's limit", role="reader", tag="limits",
           path=KIND, reads="replica", responses={200: ("The limit.", LIMIT)},
           errors=(InvalidInput, LimitNotFound))
def get_limit(kind):
    return json_response(limit_view(reads(), kind))


@operation(bp, "PUT", "/v1/limits/<kind>", summary="Set a kind's limit", role="admin", tag="limits",
           path=KIND, body=SETTING, audit="limit.set",
           description="Creates the kind's limit or replaces it whole; every worker's next claim applies "
                       "it. The same limit again changes nothing (200).",
           responses={201: ("Created.", LIMIT), 200: ("Replaced, or already so.", LIMIT)},
           errors=(InvalidInput,))
def set_limit(kind):
    limit = Limit.build(kind, **g.body)
    with audited(kind) as (tx, draft):
        change = change_of(tx.limits.limit_upsert(limit))
        draft.detail = limit_detail(limit, change)
        body = limit_view(tx, kind)
    return json_response(body, 201 if change == "created" else 200, {"Location": f"/v1/limits/{kind}"})


@operation(bp, "DELETE", "/v1/limits/<kind>", summary="Delete a kind's limit", role="admin", tag="limits",
           path=KIND, audit="limit.delete", content_type="",
           description="The kind's throttled tasks are claimable again at once; runs in flight finish.",
           responses={204: ("Deleted.", None)}, errors=(InvalidInput, LimitNotFound))
def delete_limit(kind):
    with audited(kind) as (tx, _draft):
        if not tx.limits.limit_delete([kind]):  # raising rolls back and records the refusal
            raise LimitNotFound(f"no limit for kind {kind!r}")
    return Response(status=204)
