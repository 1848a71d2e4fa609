"""The console's pages and actions, and what runs around each of them: the session and its CSRF
check, the security headers, the HTML error page.

Every page reads through an API view and every button posts to an action that calls one, by
its endpoint name (`call()`): the view's declared role is checked against the signed-in token,
its query is validated with the API's parameter names, and a change commits with the API's audit
row. No SQL and no store call here. A reader sees no buttons, and a forged POST still meets the
role check (403).

With a read replica (api/replica.py), the page an action leads to must show the action's effect:
the action's answer carries the primary's WAL position after it in a cookie, and the pages read
from the primary until the replica has replayed that far.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from flask import (Blueprint, Flask, Response, current_app, g, redirect, render_template, request,
                   url_for)
from werkzeug.datastructures import MultiDict
from werkzeug.exceptions import HTTPException

from ...engine.errors import (ConsoleDisabled, Forbidden, PayloadTooLarge, SkiplockError, TooManyRequests,
                              Unauthorized, UnsupportedMediaType)
from ...engine.model import uuid7
from .. import refusals
from ..audit import record_refusal
from ..auth import ANONYMOUS, rank
from ..app_state import api
from ..operations import SMALL_BODY
from ..render import duration_text, step_label, value_excerpt, waiting_text
from ..schema import parse_query
from . import display
from .session import DISABLED, Sessions, cookie_options

log = logging.getLogger("skiplock.api.console")

bp = Blueprint("console", __name__)

API_APP = "skiplock.console.api_app"
SESSIONS = "skiplock.console.sessions"

# Pages refresh their live part this often (static/console.js reads it from the page).
REFRESH_SECONDS = 5

SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
                               "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}

# What the console's forms send, and at most this much of it: the form is parsed before the CSRF
# check (the token is in it), so an anonymous POST must not be able to make it parse more.
# multipart is refused unread (werkzeug would spool its file parts to disk). The largest real
# form, a page of ticked task ids, is about a third of it.
FORM_TYPE = "application/x-www-form-urlencoded"
MAX_BODY_BYTES = SMALL_BODY

# Pages anyone may open without a session (the login form needs only its CSRF token).
PUBLIC_ENDPOINTS = {"console.login", "console.login_submit", "static"}

# The primary's WAL position after this browser's last action (a decimal byte offset): until the
# replica has replayed it, the pages read from the primary. A stale or forged value can only send
# reads to the primary; after this long the pages read where the rule says, whatever the replica.
WRITTEN_COOKIE = "skiplock_console_written"
WRITTEN_MAX_AGE_SECONDS = 300


def _sessions() -> Sessions:
    return current_app.extensions[SESSIONS]


# ---- the request around every page --------------------------------------------------------------

def install(app: Flask) -> None:
    # werkzeug stops reading a body without a Content-Length (chunked) here: one byte past the
    # bound tells _check_body it went on
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES + 1
    app.before_request(_open)
    app.after_request(_close)
    app.register_error_handler(SkiplockError, _skiplock_error)
    app.register_error_handler(HTTPException, _http_error)
    app.jinja_env.filters.update(pretty=_pretty, waiting=waiting_text, excerpt=value_excerpt, step_label=step_label,
                                  ago=display.ago, absolute=display.absolute, between=display.between,
                                  duration=duration_text, event_fields=display.event_fields)
    app.context_processor(_page_globals)


def _open() -> Response | None:
    g.started = time.perf_counter()
    g.request_id = uuid7().hex
    g.operation = None
    if request.method == "POST":
        _check_body()
    if _sessions().key_missing:
        if request.endpoint == "static":
            return None  # the error page's stylesheet
        raise ConsoleDisabled(DISABLED)
    session = _sessions().read(request)
    if session is None:
        session = _sessions().new(None if api().auth.enabled else ANONYMOUS)
        # only a page sets a new cookie: a POST without a session is refused below, and its answer
        # must not replace a session the browser holds (another site's form arrives without it)
        if request.method == "GET":
            g.new_session = session
    g.session = session
    g.principal = session.principal
    written = request.cookies.get(WRITTEN_COOKIE, "")
    g.read_after = int(written) if written.isdigit() and len(written) <= 20 else None
    if request.method == "POST" and not Sessions.csrf_ok(session, request.form.get("csrf")):
        raise Forbidden("the form's CSRF token is missing or stale: reload the page and try again")
    if g.principal is None and request.endpoint not in PUBLIC_ENDPOINTS:
        if request.method == "POST":
            raise Unauthorized("sign in first")
        return redirect(url_for("console.login"))
    return None


def _check_body() -> None:
    """Refuse, before anything reads it, a body that is not a console form or is too large."""
    if request.mimetype not in ("", FORM_TYPE):  # no type: nothing parses the body (nor a form, so 403)
        raise UnsupportedMediaType(f"the console reads only {FORM_TYPE} forms, not {request.mimetype[:100]}")
    length = request.content_length
    if length is not None and length > MAX_BODY_BYTES:
        raise PayloadTooLarge(f"request body is {length} bytes; the console's limit is {MAX_BODY_BYTES}")
    # chunked: read now, as far as MAX_CONTENT_LENGTH lets werkzeug, and kept for the form parser
    if length is None and len(request.get_data(cache=True)) > MAX_BODY_BYTES:
        raise PayloadTooLarge(f"request body is over the console's limit of {MAX_BODY_BYTES} bytes")


def _close(response: Response) -> Response:
    new = g.get("new_session")
    if new is not None:
        _sessions().write(response, request, new)
    if g.get("written_at") is not None:
        response.set_cookie(WRITTEN_COOKIE, str(g.written_at), max_age=WRITTEN_MAX_AGE_SECONDS,
                            **cookie_options(request))
    elif g.get("read_after_replayed"):
        response.delete_cookie(WRITTEN_COOKIE, **cookie_options(request))
    response.headers.update(SECURITY_HEADERS)
    response.headers["X-Request-Id"] = g.get("request_id", "")
    # counted with the API's requests (skiplock_api_requests_total), by the console's route template
    api().metrics.observe(request.method, _route(), response.status_code,
                          time.perf_counter() - g.get("started", time.perf_counter()))
    return response


def _route() -> str:
    return request.script_root + request.url_rule.rule if request.url_rule is not None else "unmatched"


def _page_globals() -> dict:
    principal = g.get("principal")
    return {"principal": principal, "csrf": g.session.csrf if g.get("session") else "",
            "auth_disabled": not api().auth.enabled, "can": can, "refresh_seconds": REFRESH_SECONDS}


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


def _skiplock_error(exc: SkiplockError) -> tuple[str, int, dict]:
    if request.method == "POST" and g.get("operation") is not None and g.get("principal") is not None:
        record_refusal(exc)  # the row the API writes for the same refusal
    if isinstance(exc, (Unauthorized, Forbidden)):
        refusals.report(log, "console request refused", exc, _route())
    headers = {"Retry-After": str(exc.retry_after)} if isinstance(exc, TooManyRequests) else {}
    return render_template("error.html", status=exc.status, code=exc.code, message=str(exc)), exc.status, headers


def _http_error(exc: HTTPException) -> tuple[str, int]:
    return render_template("error.html", status=exc.code, code=exc.name, message=exc.description), exc.code or 500


# ---- calling the API's views ------------------------------------------------------------------------

def can(endpoint: str) -> bool:
    """Whether the signed-in token's role may call the API view `endpoint` (buttons show only then)."""
    principal = g.get("principal")
    role = current_app.extensions[API_APP].view_functions[endpoint].operation.role
    return principal is not None and (role is None or rank(principal.role) >= rank(role))


def declare(endpoint: str):
    """The API view `endpoint`, its role checked for this principal (Forbidden); from here on a
    refusal is audited, as the API's are (a form refused before the view runs, too)."""
    view = current_app.extensions[API_APP].view_functions[endpoint]
    op = view.operation
    if op.role is not None:
        api().auth.require(g.principal, op.role, f"{op.method} {op.rule}")
    g.operation, g.audit = op, None
    return view


def call(endpoint: str, path: dict | None = None, query: MultiDict | None = None, body: dict | None = None) -> Any:
    """Run the API view `endpoint` as the API would for this principal; its JSON answer.

    Raises what the API would answer with (Forbidden, InvalidInput, TaskNotFound, ...)."""
    view = declare(endpoint)
    op = view.operation
    args = {name: field.from_text(str((path or {})[name]), name) for name, field in op.path.items()}
    g.query = parse_query(op.query, query if query is not None else MultiDict())
    g.headers = dict.fromkeys(op.headers)
    g.body = None if op.body is None else op.body.parse(body or {}, "")
    answer = view(**args).get_json()
    replica = api().replica
    if op.method != "GET" and replica is not None:
        g.written_at = replica.written_position()  # the page this action leads to reads from there on
    return answer


def page_filters(names) -> MultiDict:
    """The page's query parameters the API view knows, empty ones (a blank form field) left out."""
    return MultiDict([(k, v) for k, v in request.args.items(multi=True) if k in names and v != ""])


# ---- sign in and out -----------------------------------------------------------------------------------

@bp.get("/login")
def login():
    if not api().auth.enabled or g.principal is not None:
        return redirect(url_for("console.overview"))
    return render_template("login.html", error=None)


@bp.post("/login")
def login_submit():
    if not api().auth.enabled:
        return redirect(url_for("console.overview"), 303)
    token = request.form.get("token", "").strip()
    client = refusals.request_client()
    api().auth_throttle.check(client, "console")
    try:
        principal = api().auth.authenticate(f"Bearer {token}")
    except Unauthorized as exc:
        refusals.report(log, "console sign-in refused", exc, _route())
        api().auth_throttle.failed(client, "console")  # past the bound: 429 instead
        return render_template("login.html", error="That token is not valid."), 401
    g.new_session = g.session = _sessions().new(principal)
    log.info("console sign-in", extra={"actor": principal.name, "request_id": g.request_id})
    return redirect(url_for("console.overview"), 303)


@bp.post("/logout")
def logout():
    _sessions().end(g.session)  # on the server: a kept copy of the cookie signs no one in
    g.new_session = _sessions().new(None if api().auth.enabled else ANONYMOUS)
    return redirect(url_for("console.login"), 303)


# the filters the bulk actions act on: GET /v1/tasks' own, but for its paging
BULK_FILTERS = ("queue", "state", "kind", "created_after", "created_before")


# ---- actions: each one API view, then back to the page it was pressed on -----------------------------

@bp.post("/tasks/<task_id>/<any(cancel, resume):action>")
def task_action(task_id, action):
    call(f"tasks.{action}_task", {"task_id": task_id}, body={"reason": None})
    return redirect(url_for("console.task", task_id=task_id), 303)


@bp.post("/tasks:<any(retry, cancel, purge):action>")
def bulk_action(action):
    ids = request.form.getlist("ids")
    if ids:
        # the tasks ticked on the page, whatever filter showed them
        changed = call(f"tasks.{action}_many", body={"ids": ids})["changed"]
        return redirect(url_for("console.tasks", changed=changed), 303)
    # the filter the page showed, as POST /v1/tasks:<action> takes it (every criterion must hold)
    body = {name: request.form[name] for name in BULK_FILTERS if request.form.get(name)}
    changed = call(f"tasks.{action}_many", body=body)["changed"]
    return redirect(url_for("console.tasks", **body, changed=changed), 303)


@bp.post("/<any(queue, kind):scope>s/<name>/<any(pause, resume):action>")
def pause_action(scope, name, action):
    call(f"queues.{action}_{scope}", {"name": name})
    return redirect(url_for("console.overview"), 303)


@bp.post("/schedules/<name>/<any(pause, resume):action>")
def schedule_action(name, action):
    # the API pauses a schedule with PATCH {"enabled": false}
    call("schedules.change_schedule", {"name": name}, body={"enabled": action == "resume"})
    return redirect(url_for("console.schedules"), 303)


@bp.post("/schedules/<name>/fire")
def schedule_fire(name):
    fired = call("schedules.fire_schedule", {"name": name})
    return redirect(url_for("console.schedules", fired=fired["task_id"]), 303)


@bp.post("/webhooks/<webhook_id>/<any(enable, disable):action>")
def webhook_action(webhook_id, action):
    call(f"webhooks.{action}_webhook", {"webhook_id": webhook_id})
    return redirect(url_for("console.webhooks"), 303)


@bp.post("/deliveries/<delivery_id>/redeliver")
def delivery_action(delivery_id):
    call("deliveries.redeliver", {"delivery_id": delivery_id})
    return redirect(url_for("console.deliveries", state="dead"), 303)


@bp.post("/webhooks/<webhook_id>/redeliver")
def webhook_redeliver(webhook_id):
    call("deliveries.redeliver_endpoint", {"webhook_id": webhook_id})
    return redirect(url_for("console.webhooks"), 303)
