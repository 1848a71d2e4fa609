"""The Flask application of the HTTP API: `create_app(settings=None)`.

It registers one blueprint per resource and runs, before every view, what each route's
declaration asks for (operations.py): authentication and role, then the path, query, header and
body validation, so a view only ever sees valid input. Every failure leaves through one
`error_response()` (render.py) as {"error": {"code", "message"}} — unknown routes, wrong
methods and unexpected exceptions included, never an HTML page or a traceback.
Building an app opens the store's pool (in the background); it serves no request by itself.
"""

from __future__ import annotations

import importlib
import logging
import re
import time

from flask import Flask, Response, current_app, g, request
from werkzeug.exceptions import HTTPException, MethodNotAllowed, NotFound, RequestEntityTooLarge

from ..engine import tracing, tracing_setup
from ..engine.errors import (DatabaseError, DatabaseUnavailable, Forbidden, InvalidInput,
                             MethodNotAllowed as MethodRefused, PayloadTooLarge, RouteNotFound, SkiplockError, TooManyRequests, Unauthorized)
from ..engine.model import uuid7
from ..engine.registry import import_task_modules
from ..engine.settings import ApiSettings, Settings
from ..engine.store import Store
from . import refusals
from .audit import record_refusal
from .auth import Authenticator, Principal
from .auth_throttle import AuthThrottle
from .console import mount_console
from .app_state import KEY, ApiContext, api
from .admission_bounds import AdmissionBounds
from .replica import BORROW_TIMEOUT, Replica
from .request_body import parse_json, read_body
from .request_metrics import ApiMetrics
from .responses import error_response
from .schema import parse_query, type_name

log = logging.getLogger("skiplock.api")

# One blueprint per resource, in the order the document lists them; adding a resource is one
# more name here (its module defines `bp`).
RESOURCES = ("index", "health", "openapi", "tasks", "steps", "signals", "events", "queues", "kinds", "flow_control",
             "schedules", "webhooks", "deliveries", "audit", "workers")

_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def create_app(settings: Settings | ApiSettings | None = None, *, pool_size: int = 8,
               request_threads: int | None = None) -> Flask:
    """`request_threads`: gunicorn's threads per worker, of which long-polls and event feeds leave
    one to the other requests (admission_bounds.py); None: as many as requests (a test's server)."""
    # the API's variables, and no other (engine/settings: each Variable names its roles)
    settings = ApiSettings.of(settings or Settings.from_env())
    tracing_setup.setup_from_environment("api")  # only when OTEL_TRACES_EXPORTER names an exporter
    # refuses to build an open API by accident: before anything is started
    auth = Authenticator(settings.api_tokens, enabled=settings.api_auth == "enabled")
    url = settings.require_database_url()
    # the kinds of SKIPLOCK_TASKS: submissions of the typed ones are validated (kinds.py)
    import_task_modules(settings.tasks)
    app = Flask(__name__, static_folder=None)
    app.config.update(PROVIDE_AUTOMATIC_OPTIONS=False)  # no OPTIONS: routes declare their methods
    for name in RESOURCES:
        app.register_blueprint(importlib.import_module(f"{__package__}.{name}").bp)
    # every statement of the API's pool, its reads above all, is cut at the statement timeout (503)
    store = Store.pooled(url, settings.db_schema, min_size=1, max_size=pool_size, name="api",
                  statement_timeout=settings.api_statement_timeout_seconds, pooler=settings.database_pooler).open()
    metrics = ApiMetrics()
    app.extensions[KEY] = ApiContext(settings, store, auth, metrics,
                                     trusted_proxies=refusals.parse_networks(settings.api_trusted_proxies),
                                     admission_bounds=AdmissionBounds(settings, request_threads=request_threads), replica=_replica(settings, store, pool_size, metrics),
                                     auth_throttle=AuthThrottle(store, settings.api_max_auth_failures,
                                                                metrics.auth_throttled))
    app.before_request(_trace_begin)
    app.before_request(_prepare)
    app.after_request(_finish)
    app.teardown_request(_release)
    app.register_error_handler(SkiplockError, _skiplock_error)
    app.register_error_handler(HTTPException, _http_error)
    app.register_error_handler(Exception, _unexpected_error)
    mount_console(app)  # /ui/: the web console, an app of its own on this app's context
    return app


def _replica(settings: ApiSettings, primary: Store, pool_size: int, metrics: ApiMetrics) -> Replica | None:
    """SKIPLOCK_READ_DATABASE_URL's pool, as large as the primary's (replica.py routes the reads).
    It gives up on a connection sooner than the primary's pool, and on an answer a little after
    the statement timeout (a silent path to it), so that a replica that is gone costs a read
    seconds, not the pool's 15 s and TCP's timeouts, before the primary serves it."""
    if not settings.read_database_url:
        return None
    store = Store.pooled(settings.read_database_url, settings.db_schema, min_size=1, max_size=pool_size, name="api-read",
                  statement_timeout=settings.api_statement_timeout_seconds, pooler=settings.database_pooler,
                  reply_timeout=settings.api_statement_timeout_seconds + 2, borrow_timeout=BORROW_TIMEOUT).open()
    return Replica(primary, store, settings.read_max_lag_seconds, metrics)


def close_app(app: Flask) -> None:
    """Close the app's pools (gunicorn's worker_exit, tests)."""
    ctx = app.extensions[KEY]
    ctx.store.close()
    if ctx.replica is not None:
        ctx.replica.close()


def _trace_begin() -> None:
    # the caller's traceparent is the context of the request: the tasks it enqueues continue
    # the caller's trace (engine/tracing.py); ended in _release, which runs whatever happens
    g.trace = tracing.request_begin(request.headers, request.method)


def _prepare() -> None:
    g.started = time.perf_counter()
    supplied = request.headers.get("X-Request-Id", "")
    g.request_id = supplied if _REQUEST_ID.fullmatch(supplied) else uuid7().hex
    g.principal = None
    view = current_app.view_functions.get(request.endpoint) if request.endpoint else None
    op = g.operation = getattr(view, "operation", None)
    ctx = api()
    if op is None:
        # no route or no such method: the routing error answers (404 / 405), but under /v1/ only
        # to a valid token, so that without one no path tells whether it exists
        if request.path.startswith("/v1/"):
            g.principal = _authenticate(ctx)
        return
    if op.role is not None:
        g.principal = _authenticate(ctx)
        ctx.auth.require(g.principal, op.role, f"{op.method} {op.rule}")
    g.releases = []
    if op.bounded:  # before the body is read: a refused submission costs no parsing
        g.releases.append(ctx.admission_bounds.admit(g.principal.name))
    for name, field in op.path.items():
        request.view_args[name] = field.from_text(request.view_args[name], name)
    g.query = parse_query(op.query, request.args)
    g.headers = {name: None if request.headers.get(name) is None else field.from_text(request.headers[name], name)
                 for name, field in op.headers.items()}
    g.body = None
    if op.body is not None:
        max_bytes = op.max_body(ctx.settings) if callable(op.max_body) else op.max_body
        if ctx.admission_bounds.is_large(request.content_length, max_bytes):
            # held until the request ends: the parsed body lives as long as the view
            g.releases.append(ctx.admission_bounds.large_body())
        raw = read_body(request.stream, request.content_length, max_bytes)
        if not raw.strip():
            if op.body_required:
                raise InvalidInput("body: required (a JSON object)")
            g.body = op.body.parse({}, "")
        else:
            value = parse_json(raw)
            if not isinstance(value, dict):
                raise InvalidInput(f"body: must be a JSON object, not {type_name(value)}")
            g.body = op.body.parse(value, "")


def _authenticate(ctx) -> Principal:
    """The request's principal; a wrong token counts against its address (auth_throttle.py)."""
    header = request.headers.get("Authorization")
    if not ctx.auth.enabled:
        return ctx.auth.authenticate(header)
    client = refusals.request_client()
    ctx.auth_throttle.check(client, "api")
    try:
        return ctx.auth.authenticate(header)
    except Unauthorized:
        if header:  # a token that matches none; no token at all is not a guess
            ctx.auth_throttle.failed(client, "api")
        raise


def _route() -> str:
    return request.url_rule.rule if request.url_rule is not None else "unmatched"


def _finish(response: Response) -> Response:
    route = _route()
    elapsed = time.perf_counter() - g.get("started", time.perf_counter())
    api().metrics.observe(request.method, route, response.status_code, elapsed)
    response.headers["X-Request-Id"] = g.get("request_id", "")
    if request.path.startswith("/v1"):
        # answers hold task data (payloads, results, errors): never sniffed as another type, never
        # kept by a browser's or a proxy's cache; the console sets its own
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("Cache-Control", "no-store")
    g.status = response.status_code
    return response


def _release(_exc) -> None:
    for release in reversed(g.pop("releases", ())):
        release()
    tracing.request_end(g.pop("trace", None), _route(), g.get("status"))


def _skiplock_error(exc: SkiplockError) -> Response:
    if isinstance(exc, DatabaseError):  # the driver's error, translated: still not the client's doing
        return _unexpected_error(exc)
    headers = {}
    if isinstance(exc, TooManyRequests):
        # neither logged nor audited: an admission bound sheds load, one line or row per refusal would add it
        headers["Retry-After"] = str(exc.retry_after)
    elif isinstance(exc, (Unauthorized, Forbidden)):
        refusals.report(log, "request refused", exc, _route())
        if isinstance(exc, Unauthorized):
            headers["WWW-Authenticate"] = 'Bearer realm="skiplock"'
    elif exc.status >= 500:
        log.error("request failed", extra={"code": exc.code, "error": str(exc), "request_id": g.get("request_id")})
        if isinstance(exc, DatabaseUnavailable):
            headers["Retry-After"] = "1"
    elif request.method != "GET" and g.get("principal") is not None:
        record_refusal(exc)
    return error_response(exc, headers)


def _short(path: str) -> str:
    return path if len(path) <= 200 else path[:197] + "..."


def _http_error(exc: HTTPException) -> Response:
    headers = {}
    if isinstance(exc, NotFound):
        error: SkiplockError = RouteNotFound(f"no route {request.method} {_short(request.path)}")
    elif isinstance(exc, MethodNotAllowed):
        allowed = sorted(set(exc.valid_methods or ()) - {"HEAD", "OPTIONS"})
        error = MethodRefused(f"{request.method} is not allowed on {_short(request.path)} "
                              f"(allowed: {', '.join(allowed)})")
        headers["Allow"] = ", ".join(allowed)
    elif isinstance(exc, RequestEntityTooLarge):
        error = PayloadTooLarge("request body too large")
    else:  # anything else werkzeug raises (a malformed request line, ...): its status, our shape
        error = SkiplockError(exc.description or exc.name)
        error.code = "request." + re.sub(r"[^a-z]+", "_", (exc.name or "error").lower()).strip("_")
        error.status = exc.code or 400
    return error_response(error, headers)


def _unexpected_error(exc: Exception) -> Response:
    log.exception("unhandled error in a request", extra={"request_id": g.get("request_id"),
                                                         "method": request.method, "path": request.path})
    error = SkiplockError(f"internal error (request id {g.get('request_id')})")
    error.code = "internal.error"
    return error_response(error)
