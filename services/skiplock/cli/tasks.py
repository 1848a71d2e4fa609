"""The operator's commands of `skiplock`: `tasks list|show|wait|events|cancel|resume|retry`,
`queues list|pause|resume`, `kinds pause|resume`, `audit list` (`limits`: cli_limits.py).

They read SKIPLOCK_DATABASE_URL like every command and run what the API's routes run: the same
validation of filters (the routes' declared fields), the same store calls and the same audit rows
(engine/task_actions.py), the actor being `cli:<os user>`. Output: an aligned table, or with
`-o json` one JSON document, the API's answer to the same request.
"""

from __future__ import annotations

import argparse
import datetime as dt
import getpass
import json
import os

from werkzeug.datastructures import MultiDict

from ..engine.errors import InvalidInput, SkiplockError
from ..engine.settings import Settings
from ..engine.task_actions import (BULK_DEFAULT_LIMIT, TaskFilter, bulk, cancel_task, check_bulk, resume_task,
                                   set_paused)

# `tasks wait` gives up after this many seconds unless told otherwise
WAIT_DEFAULT_SECONDS = 60

# --option → the API's query parameter it sets
TASK_FILTERS = {"queue": "queue", "state": "state", "kind": "kind", "created_after": "created-after",
                "created_before": "created-before"}


def add_parsers(sub) -> None:
    """Add the commands to `skiplock`'s subparsers."""
    out = argparse.ArgumentParser(add_help=False)
    out.add_argument("-o", "--output", choices=("table", "json"), default="table",
                     help="an aligned table (default) or one JSON document, the API's answer")
    filters = argparse.ArgumentParser(add_help=False)
    for dest, flag in TASK_FILTERS.items():
        filters.add_argument(f"--{flag}", dest=dest, metavar=dest.upper().replace("_", "-"))

    tk = sub.add_parser("tasks", help="list, inspect, cancel, resume or retry tasks")
    tks = tk.add_subparsers(dest="action", required=True, metavar="ACTION")
    ls = tks.add_parser("list", parents=[out, filters], help="tasks newest first (GET /v1/tasks's filters)")
    ls.add_argument("--id", action="append", help="only this task")
    ls.add_argument("--idempotency-key")
    ls.add_argument("--limit", default="50", help="tasks per page, 1-500 (default 50)")
    ls.add_argument("--cursor", help="the next page: the cursor the previous page printed")
    for action in ("show", "events"):
        a = tks.add_parser(action, parents=[out], help="one task, with its parents and children" if action == "show"
                           else "a task's events")
        a.add_argument("id")
    wt = tks.add_parser("wait", parents=[out], help="wait until a task is final and show it; exit 1 on timeout")
    wt.add_argument("id")
    wt.add_argument("--timeout", default=str(WAIT_DEFAULT_SECONDS),
                    help=f"give up after this many seconds (default {WAIT_DEFAULT_SECONDS})")
    for action, text in (("cancel", "cancel a task, or with --all the waiting, queued and running tasks of a filter"),
                         ("resume", "queue a failed or cancelled task again; --all: the tasks of a filter"),
                         ("retry", "the same as resume (--all: POST /v1/tasks:retry)")):
        a = tks.add_parser(action, parents=[out, filters], help=text)
        a.add_argument("id", nargs="?", help="the task (not with --all)")
        a.add_argument("--all", action="store_true", help="every task of the filter, up to --limit")
        a.add_argument("--id", dest="ids", action="append", help="with --all: only these tasks (repeat it)")
        a.add_argument("--limit", type=int, default=BULK_DEFAULT_LIMIT,
                       help=f"with --all: at most this many tasks change (default {BULK_DEFAULT_LIMIT})")
        a.add_argument("--reason", help="recorded in each task's event")

    qs = sub.add_parser("queues", help="queue overview; pause or resume a queue")
    qss = qs.add_subparsers(dest="action", required=True, metavar="ACTION")
    qss.add_parser("list", parents=[out], help="tasks per state, claimable, throttled, paused (GET /v1/queues)")
    kd = sub.add_parser("kinds", help="pause or resume a task kind in every queue")
    kds = kd.add_subparsers(dest="action", required=True, metavar="ACTION")
    for subs in (qss, kds):
        for action in ("pause", "resume"):
            subs.add_parser(action, parents=[out]).add_argument("name")

    au = sub.add_parser("audit", help="the audit log")
    aus = au.add_subparsers(dest="action", required=True, metavar="ACTION")
    al = aus.add_parser("list", parents=[out], help="entries newest first (GET /v1/audit's filters)")
    for name in ("action", "actor", "target", "limit", "cursor"):
        al.add_argument(f"--{name}")


def actor() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):  # no name for this uid (a bare container)
        return f"cli:uid-{os.getuid()}"


def run(args, settings: Settings) -> int:
    from ..engine.store import Store

    # parse and validate before connecting: a bad filter fails without a database
    work = _plan(args, settings)
    store = Store(settings.require_database_url(), settings.db_schema, max_size=1, name="cli").open(wait=True)
    try:
        try:
            body, table = work(store)
        except SkiplockError as exc:
            _record_refusal(store, getattr(work, "audit", None), exc)
            raise
    finally:
        store.close()
    if args.output == "json":
        print(json.dumps(body, indent=2, default=str))
    else:
        table()
    return 0


def _record_refusal(store, audit: tuple[str, str | None] | None, exc: SkiplockError) -> None:
    """A refused change (not found, not cancellable): its audit row, as the API writes one."""
    if audit is None or not 400 <= exc.status < 500:
        return
    action, target = audit
    store.audit.audit_insert(actor=actor(), action=action, target=target, request_id=None, outcome=exc.code,
                             detail={"message": " ".join(str(exc).split())[:500]})


def _query(operation, values: dict, flags: dict[str, str]) -> dict:
    """Options checked as the route checks its query string; errors name the option."""
    from ..api.schema import parse_query

    given = MultiDict([(k, v) for k, vs in values.items() if vs is not None
                       for v in (vs if isinstance(vs, list) else [vs])])
    try:
        return parse_query(operation.query, given)
    except InvalidInput as exc:
        name, _, rest = str(exc).partition(":")
        raise InvalidInput(f"--{flags.get(name, name).replace('_', '-')}:{rest}") from None


def _plan(args, settings: Settings):
    """The command as a function of the store returning (JSON body, table printer)."""
    from ..api import render

    if args.command == "tasks" and args.action == "list":
        from ..api.tasks import list_tasks

        q = _query(list_tasks.operation, {**{k: getattr(args, k) for k in TASK_FILTERS}, "id": args.id,
                                          "idempotency_key": args.idempotency_key, "limit": args.limit,
                                          "cursor": args.cursor}, TASK_FILTERS)
        limit, task_id = q.pop("limit"), q.pop("id")

        def list_(store):
            rows = store.tasks.task_list(**q, ids=None if task_id is None else [task_id], limit=limit + 1)
            more, rows = len(rows) > limit, rows[:limit]
            body = {"tasks": [render.task_json(t) for t in rows], "next_cursor": str(rows[-1].id) if more else None}
            return body, lambda: _tasks_table(body)
        return list_

    if args.command == "tasks" and args.action == "wait":
        return _wait(args, settings)

    if args.command == "tasks" and args.action in ("show", "events"):
        def show(store):
            if args.action == "show":
                return _task_view(store, store.tasks.task_get(args.id))
            events = store.tasks.task_events_list(args.id)
            if not events:  # every task has its 'queued' event: none means no task
                store.tasks.task_get(args.id)
            body = {"events": [render.event_json(e) for e in events]}
            return body, lambda: _print_table(
                ("SEQ", "TYPE", "AT (UTC)", "ATTEMPT", "DATA"),
                [(str(e["seq"]), e["type"], _cell(e["at"]), _cell(e["attempt"]), _cell(e["data"]))
                 for e in body["events"]], "no events")
        return show

    if args.command == "tasks":
        return _task_action(args)

    if args.command in ("queues", "kinds") and args.action in ("pause", "resume"):
        from ..api.schema import Name

        scope = "queue" if args.command == "queues" else "kind"
        name = Name().from_text(args.name, scope)
        paused = args.action == "pause"

        def pause(store):
            set_paused(store, scope, name, paused, actor=actor())
            return {scope: name, "paused": paused}, lambda: print(f"{'paused' if paused else 'resumed'}: {name}")
        return pause

    if args.command == "queues":
        from ..api.queues import queue_overview

        def queues(store):
            body = queue_overview(store)
            states = list(body["queues"][0]["tasks"]) if body["queues"] else []
            rows = [(q["name"], *(str(q["tasks"][s]) for s in states), str(q["claimable"]), str(q["throttled"]),
                     _cell(None if q["oldest_claimable_age_seconds"] is None
                           else f"{q['oldest_claimable_age_seconds']:.1f}s"), "yes" if q["paused"] else "no")
                    for q in body["queues"]]

            def table():
                _print_table(("QUEUE", *(s.upper() for s in states), "CLAIMABLE", "THROTTLED", "OLDEST", "PAUSED"),
                             rows, "no queues")
                if body["paused_kinds"]:
                    print(f"paused kinds: {', '.join(body['paused_kinds'])}")
            return body, table
        return queues

    if args.command == "audit":
        from ..api.audit import list_audit

        q = _query(list_audit.operation, {k: getattr(args, k) for k in ("action", "actor", "target", "limit",
                                                                        "cursor")}, {})

        def audit(store):
            limit, cursor = q["limit"], q["cursor"]
            rows = store.audit.audit_list(action=q["action"], actor=q["actor"], target=q["target"],
                                       cursor=None if cursor is None else int(cursor), limit=limit + 1)
            more, rows = len(rows) > limit, rows[:limit]
            body = {"entries": [render.audit_json(e) for e in rows], "next_cursor": str(rows[-1].id) if more else None}
            return body, lambda: _page_table(
                ("ID", "AT (UTC)", "ACTOR", "ACTION", "TARGET", "OUTCOME", "DETAIL"),
                [(str(e["id"]), _cell(e["at"]), e["actor"], e["action"], _cell(e["target"]), e["outcome"],
                  _cell(e["detail"])) for e in body["entries"]], "no audit entries", body["next_cursor"])
        return audit
    raise AssertionError(args.command)


def _task_view(store, task) -> tuple[dict, object]:
    """`tasks show`'s answer for a task: GET /v1/tasks/{id}'s JSON and its table, one row per
    field and per parent or child id."""
    from ..api import render

    parents, children = store.tasks.task_relatives(task.id, render.RELATIVES_SHOWN + 1)
    body = render.task_json(task, parents=parents, children=children)
    rows = []
    for name, value in body.items():
        if name in ("parents", "children"):
            ids = value or ["-"]
            if body[f"{name}_truncated"]:
                ids = [*ids, f"... (the first {render.RELATIVES_SHOWN} shown)"]
            rows += [(name if i == 0 else "", v) for i, v in enumerate(ids)]
        elif not name.endswith("_truncated"):
            rows.append((name, _cell(value)))
    return body, lambda: _print_table(("FIELD", "VALUE"), rows, "")


def _wait(args, settings: Settings):
    """`tasks wait ID`: skiplock.wait on a connection of its own, then the task as `tasks show`
    prints it; a timeout is WaitTimeout (one line, exit 1)."""
    from ..api.schema import Number, Uuid
    from ..engine import store as store_mod
    from ..waiting import wait

    task_id = Uuid().from_text(args.id, "id")
    timeout = Number(minimum=0).from_text(args.timeout, "--timeout")

    def waited(store):
        url = settings.listen_database_url or settings.require_database_url()
        pooler = "none" if settings.listen_database_url else settings.database_pooler
        with store_mod.connect(url, autocommit=True, pooler=pooler) as conn:
            task = wait(conn, task_id, timeout, schema=settings.db_schema)
        return _task_view(store, task)
    return waited


def _task_action(args):
    """cancel, resume or retry: one task by id, or with --all the tasks of a filter."""
    from ..api import render

    if args.all == (args.id is not None):
        raise InvalidInput(f"{args.action}: give a task id or --all with a filter, not "
                           f"{'both' if args.all else 'neither'}")
    if not args.all:
        if args.ids or any(getattr(args, k) is not None for k in TASK_FILTERS):
            raise InvalidInput(f"{args.action}: filters go with --all, not with a task id")

        def one(store):
            change = cancel_task if args.action == "cancel" else resume_task
            state = change(store, args.id, actor=actor(), reason=args.reason)
            return render.task_json(store.tasks.task_get(args.id)), lambda: print(f"{state}: {args.id}")
        one.audit = ("task.cancel" if args.action == "cancel" else "task.resume", args.id)
        return one

    from ..api.tasks import list_tasks

    q = _query(list_tasks.operation, {k: getattr(args, k) for k in TASK_FILTERS}, TASK_FILTERS)
    ids = None
    if args.ids:
        from ..api.schema import Uuid

        ids = tuple(Uuid().from_text(i, "--id") for i in args.ids)
    task_filter = TaskFilter(**{k: q[k] for k in TASK_FILTERS}, ids=ids)
    action = "cancel" if args.action == "cancel" else "retry"
    check_bulk(action, task_filter, args.limit)

    def many(store):
        changed = bulk(store, action, task_filter, actor=actor(), limit=args.limit, reason=args.reason)
        verb = "cancelled" if action == "cancel" else "retried"
        return {"changed": changed, "limit": args.limit}, lambda: print(
            f"{verb}: {changed} task{'' if changed == 1 else 's'}" + (" (the limit: more may match)"
                                                                     if changed == args.limit else ""))
    return many


def _tasks_table(body: dict) -> None:
    _page_table(("ID", "KIND", "QUEUE", "STATE", "ATTEMPTS", "CREATED (UTC)", "LAST ERROR"),
                [(t["id"], t["kind"], t["queue"], t["state"],
                  f"{t['attempts']}/{t['max_attempts']}" if t.get("max_attempts") else str(t["attempts"]),
                  _cell(t["created_at"]), _cell(t["last_error"])[:60]) for t in body["tasks"]],
                "no tasks", body["next_cursor"])


def _page_table(header, rows, empty: str, next_cursor: str | None) -> None:
    _print_table(header, rows, empty)
    if next_cursor:
        print(f"more: --cursor {next_cursor}")


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        if value.endswith("Z") and "T" in value:  # a time from render.iso: to the second
            try:
                return dt.datetime.fromisoformat(value[:-1]).strftime("%Y-%m-%d %H:%M:%S")
            except ValueError:
                pass
        return " ".join(value.split())
    return json.dumps(value, separators=(",", ":"), default=str)


def _print_table(header, rows, empty: str) -> None:
    from . import _print_table as print_table

    print_table(header, rows, empty)
