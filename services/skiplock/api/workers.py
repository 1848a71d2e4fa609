"""Workers over HTTP: the worker registry (skiplock.workers), one entry per live worker process,
as the console's Workers page and `skiplock workers list` show it. Read-only: a worker writes
its own row, and the scheduler's maintenance removes the rows of workers that died.
"""

from __future__ import annotations

from flask import Blueprint

from .app_state import reads
from .operations import operation
from .responses import json_response
from .schema import Array, DateTime, Integer, Name, Number, Object, String

bp = Blueprint("workers", __name__)

WORKER = Object({
    "id": String("The worker's name: the lease owner of the tasks it claims."),
    "host": String("SKIPLOCK_POD_NAME when set, else the host name."),
    "pid": Integer(),
    "queues": Array(Name(), "The queues it claims from."),
    "concurrency": Integer("Tasks it runs at once."),
    "in_flight": Integer("Tasks it held at its last heartbeat."),
    "version": String("The skiplock version it runs."),
    "lease_seconds": Number("The lease its claims get; its entry goes after three without a heartbeat."),
    "started_at": DateTime(),
    "heartbeat_at": DateTime("Its last heartbeat, by the database's clock."),
    "heartbeat_age_seconds": Number("Seconds since its last heartbeat."),
}, required=("id", "host", "pid", "queues", "concurrency", "in_flight", "version", "lease_seconds",
             "started_at", "heartbeat_at", "heartbeat_age_seconds"))
LISTING = Object({"workers": Array(WORKER, "Every live worker, by host and start time.")}, required=("workers",))


@operation(bp, "GET", "/v1/workers", summary="Every live worker", role="reader", tag="workers", reads="replica",
           description="A worker registers when it starts, renews its entry with its heartbeat and removes it "
                       "when it exits; the entry of one that died goes after three of its leases.",
           responses={200: ("The workers.", LISTING)})
def list_workers():
    return json_response({"workers": [w._asdict() for w in reads().workers.worker_list()]})
