"""The console's read-only pages: each reads through the API's views (views.call), so the role
checks, the parameter validation and the replica rule are the API's own. The actions and the
request plumbing are views.py's; the schedule form is schedule_form.py's.
"""

from __future__ import annotations

from flask import current_app, render_template, request, url_for
from werkzeug.datastructures import MultiDict

from ...engine.model import STATES
from ..deliveries import DELIVERY_STATES
from . import display
from .views import API_APP, BULK_FILTERS, bp, call, page_filters

# The schedules page shows each schedule's last decisions, this many.
FIRES_SHOWN = 5
# A task's page shows its first steps (durable execution), this many.
STEPS_SHOWN = 100


@bp.get("/")
def overview():
    data = call("queues.overview")
    chart_range = request.args.get("range", "hour")
    if chart_range not in display.CHART_RANGES:
        chart_range = "hour"
    minutes, per_bar = display.CHART_RANGES[chart_range]
    throughput = call("queues.throughput", query=MultiDict({"minutes": str(minutes)}))
    workers = call("workers.list_workers")["workers"]
    return render_template("overview.html", queues=data["queues"], paused_kinds=data["paused_kinds"],
                           states=STATES, counts=display.state_counts(data["queues"], STATES),
                           charts=display.throughput_charts(throughput, per_bar), chart_range=chart_range,
                           ranges=display.CHART_RANGES, served=display.workers_per_queue(workers),
                           worker_count=len(workers))


def listing(endpoint: str, page_endpoint: str) -> tuple[dict, dict, str | None]:
    """A page of an API list view: its answer, the filters in force and the next page's URL
    (keyset paging with the API's own cursor)."""
    names = current_app.extensions[API_APP].view_functions[endpoint].operation.query
    query = page_filters(names)
    page = call(endpoint, query=query)
    next_url = None
    if page["next_cursor"]:
        following = query.copy()
        following["cursor"] = page["next_cursor"]
        next_url = url_for(page_endpoint, **following.to_dict())
    query.pop("cursor", None)
    return page, query.to_dict(), next_url


@bp.get("/tasks")
def tasks():
    page, filters, next_url = listing("tasks.list_tasks", "console.tasks")
    done = request.args.get("changed", "")
    queues = call("queues.overview")["queues"]
    return render_template("tasks.html", tasks=page["tasks"], filters=filters, states=STATES, next_url=next_url,
                           counts=display.state_counts(queues, STATES, filters.get("queue")),
                           bulk={name: filters[name] for name in BULK_FILTERS if name in filters},
                           changed=int(done) if done.isdigit() else None)


@bp.get("/tasks/<task_id>")
def task(task_id):
    found = call("tasks.get_task", {"task_id": task_id})
    events = call("tasks.task_events", {"task_id": task_id})["events"]
    steps = call("steps.task_steps", {"task_id": task_id}, query=MultiDict({"limit": str(STEPS_SHOWN)}))
    return render_template("task.html", task=found, events=events, steps=steps)


@bp.get("/audit")
def audit():
    page, filters, next_url = listing("audit.list_audit", "console.audit")
    return render_template("audit.html", entries=page["entries"], filters=filters, next_url=next_url)


@bp.get("/schedules")
def schedules():
    schedules = call("schedules.list_schedules")["schedules"]
    fires = {s["name"]: call("schedules.schedule_fires", {"name": s["name"]},
                             query=MultiDict({"limit": str(FIRES_SHOWN)}))["fires"] for s in schedules}
    return render_template("schedules.html", schedules=schedules, fires=fires)


@bp.get("/limits")
def limits():
    return render_template("limits.html", limits=call("limits.list_limits")["limits"])


@bp.get("/webhooks")
def webhooks():
    return render_template("webhooks.html", webhooks=call("webhooks.list_webhooks")["webhooks"])


@bp.get("/deliveries")
def deliveries():
    page, filters, next_url = listing("deliveries.list_deliveries", "console.deliveries")
    endpoints = {w["id"]: w["url"] for w in call("webhooks.list_webhooks")["webhooks"]}
    return render_template("deliveries.html", deliveries=page["deliveries"], filters=filters, next_url=next_url,
                           states=DELIVERY_STATES, endpoints=endpoints)


@bp.get("/workers")
def workers():
    return render_template("workers.html", workers=call("workers.list_workers")["workers"])

