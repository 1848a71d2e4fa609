"""The console's live feed: `/ui/events/stream`, the API's event stream (GET /v1/events/stream)
with the console's session instead of a bearer token. static/console.js follows it and refreshes
the page's live part when an event of what the page shows arrives.

It runs the API's view, as every console page does: the same role check (a reader may follow),
the same filters and Last-Event-ID, the same bound per worker (past it 429, and the page falls
back to reading itself again every few seconds).
"""

from __future__ import annotations

from flask import g, request

from ..schema import parse_query
from .views import bp, declare

RESUME = "Last-Event-ID"


@bp.get("/events/stream")
def event_stream():
    view = declare("events.stream_events")
    g.query = parse_query(view.operation.query, request.args)
    resume = request.headers.get(RESUME)
    g.headers = {RESUME: None if resume is None else view.operation.headers[RESUME].from_text(resume, RESUME)}
    return view()
