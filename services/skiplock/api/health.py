"""Probes and metrics, without a token: /healthz (the process answers), /readyz (Postgres
answers and no migration is pending) and /metrics (Prometheus, every gunicorn worker summed)."""

from __future__ import annotations

from flask import Blueprint, Response

from ..engine import migrate
from ..engine.errors import DatabaseUnavailable, MigrationError, SkiplockError
from .app_state import api
from .request_metrics import CONTENT_TYPE
from .operations import operation
from .responses import json_response
from .schema import Object, String

bp = Blueprint("health", __name__)

# answer a probe before its own timeout would: a database that cannot be reached in this long is
# "not ready" now, not after the pool's 15 s wait
READY_TIMEOUT = 2.0

STATUS = Object({"status": String(enum=("ok", "ready"))}, required=("status",))


@operation(bp, "GET", "/healthz", summary="Liveness: the process answers", role=None, tag="health",
           responses={200: ("Alive.", STATUS)})
def healthz():
    return json_response({"status": "ok"})


@operation(bp, "GET", "/readyz", summary="Readiness: Postgres answers and no migration is pending",
           role=None, tag="health", responses={200: ("Ready.", STATUS)},
           errors=(DatabaseUnavailable, MigrationError))
def readyz():
    ctx = api()
    ctx.store.ping(timeout=READY_TIMEOUT)
    if not ctx.migrated:
        try:
            waiting = migrate.pending(ctx.settings.require_database_url(), ctx.settings.db_schema)
        except SkiplockError as exc:
            raise DatabaseUnavailable(f"cannot read the migration state: {exc}") from exc
        if waiting:
            raise DatabaseUnavailable(f"{len(waiting)} migration(s) pending, first {waiting[0].path.name}: "
                                      "run `skiplock migrate`")
        ctx.migrated = True  # the files cannot change under a running process
    return json_response({"status": "ready"})


@operation(bp, "GET", "/metrics", summary="Prometheus metrics", role=None, tag="health",
           content_type="text/plain", responses={200: ("Prometheus text format.", String())})
def metrics():
    return Response(api().metrics.render(), mimetype=None, headers={"Content-Type": CONTENT_TYPE})
