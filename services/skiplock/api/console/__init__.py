"""The operations console: server-rendered pages under /ui/ (Flask and Jinja2), for people who
run skiplock — queues, tasks and their events, the audit log — with the API's own actions.

It is a WSGI application of its own, mounted on the API's at /ui, so that the API keeps its
invariants (every route declared and documented in the OpenAPI document, JSON errors) while the
console answers HTML. Both share one ApiContext (settings, store, authenticator): the console
reads through the API's views and acts through them, so an action here runs the same code and
writes the same audit row as the API route, with the signed-in token's name as the actor.

Its scripts and styles are files of this package (static/); nothing loads from elsewhere, and
no page holds an inline script (the Content-Security-Policy forbids it).
"""

from __future__ import annotations

import logging

from flask import Flask
from werkzeug.middleware.dispatcher import DispatcherMiddleware

from ..app_state import KEY
from .session import DISABLED, Sessions

PREFIX = "/ui"

log = logging.getLogger("skiplock.api.console")


def create_console(api_app: Flask) -> Flask:
    """The console app, sharing `api_app`'s context and calling its views."""
    from . import live, pages, schedule_form, signals, views  # noqa: F401 - each adds its pages to views.bp

    ctx = api_app.extensions[KEY]
    console = Flask(__name__, static_folder="static", static_url_path="/static")
    console.config.update(PROVIDE_AUTOMATIC_OPTIONS=False)
    console.extensions[KEY] = ctx
    console.extensions[views.API_APP] = api_app
    sessions = console.extensions[views.SESSIONS] = Sessions(ctx.settings, ctx.auth.enabled, ctx.store, ctx.replica)
    if sessions.key_missing:
        log.warning(DISABLED)  # the API itself serves: the console alone fails closed
    console.register_blueprint(views.bp)
    views.install(console)
    return console


def mount_console(api_app: Flask) -> None:
    """Serve the console at /ui/ next to the API."""
    console = create_console(api_app)
    api_app.wsgi_app = DispatcherMiddleware(api_app.wsgi_app, {PREFIX: console.wsgi_app})
