"""`skiplock tasks list|show|wait|events|steps|cancel|resume|retry` and `skiplock enqueue`.

They read SKIPLOCK_DATABASE_URL like every command and run what the API's routes run: the same
validation of filters (the routes' declared fields), the same store calls and the same audit rows
(engine/task_actions.py), the actor being `cli:<os user>`. Output: an aligned table, or with
`-o json` one JSON document, the API's answer to the same request (command.py).
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys

from ..engine.errors import InvalidInput
from ..engine.settings import Settings
from ..engine.task_actions import BULK_DEFAULT_LIMIT, TaskFilter, bulk, cancel_task, check_bulk, resume_task
from .command import (actor, cell, open_store, output_option, page_table, payload_flag, print_table, printable,
                      query, run_work)

# `tasks wait` gives up after this many seconds unless told otherwise
WAIT_DEFAULT_SECONDS = 60

# --option → the API's query parameter it sets
TASK_FILTERS = {"queue": "queue", "state": "state", "kind": "kind", "created_after": "created-after",
                "created_before": "created-before"}


def add_parsers(sub) -> None:
    """Add `tasks` to `skiplock`'s subparsers."""
    out = output_option()
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
    st = tks.add_parser("steps", parents=[out], help="a task's step log (durable execution), in call order")
    st.add_argument("id")
    st.add_argument("--after", default="0", help="only the steps after this position (the next page)")
    st.add_argument("--limit", default="100", help="steps per page, 1-500 (default 100)")
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
    tk.set_defaults(run=run)


def add_enqueue_parser(sub) -> None:
    """Add `enqueue` to `skiplock`'s subparsers."""
    e = sub.add_parser("enqueue", help="enqueue one task and print its id")
    e.add_argument("kind")
    e.add_argument("--payload", default="{}", help="JSON payload (default {})")
    e.add_argument("--queue", default=None,
                   help="default: the queue @task declared for the kind if SKIPLOCK_TASKS names its module, "
                        "else 'default'")
    e.add_argument("--priority", type=int, default=0, help="higher runs first")
    when = e.add_mutually_exclusive_group()
    when.add_argument("--delay", type=float, help="seconds from now")
    when.add_argument("--run-at", help="ISO 8601 time with a UTC offset")
    e.add_argument("--idempotency-key")
    e.add_argument("--max-attempts", type=int, help="default: the kind's (3 if undeclared)")
    e.add_argument("--concurrency-key", help="the task's group under its kind's limit (`skiplock limits`)")
    e.add_argument("--depends-on", action="append", metavar="ID",
                   help="a task that must be final first (repeat it); until then the task is waiting")
    e.add_argument("--on-parent-failure", default="cancel", metavar="cancel|run",
                   help="a parent that ends failed or cancelled cancels the task (default), or it runs anyway")
    u = e.add_argument_group("unique (any --unique-* option implies --unique)")
    u.add_argument("--unique", action="store_true",
                   help="at most one such task of this kind and queue at a time; a duplicate prints the holder's id")
    u.add_argument("--unique-by-payload", action="store_true", help="unique by the whole payload too")
    u.add_argument("--unique-key", action="append", metavar="NAME", help="unique by this payload key too (repeat it)")
    u.add_argument("--unique-period", type=float, metavar="SECONDS",
                   help="the key holds within one fixed window of this many seconds of the database's clock")
    u.add_argument("--unique-states", metavar="STATE,...",
                   help="where a task blocks its duplicates (default waiting,queued,running,cancelling; "
                        "add completed, failed or cancelled)")
    d = e.add_argument_group("debounce")
    d.add_argument("--debounce-key", metavar="KEY", help="merge into the task of this key that waits to start")
    d.add_argument("--debounce-delay", type=float, metavar="SECONDS", help="start this long after the last enqueue")
    d.add_argument("--debounce-max-wait", type=float, metavar="SECONDS",
                   help="... but never later than this long after the first")
    e.set_defaults(run=run_enqueue)


def run(args) -> int:
    settings = Settings.from_env()
    return run_work(args, settings, _plan(args, settings))


def run_enqueue(args) -> int:
    from ..enqueueing import enqueue

    settings = Settings.from_env()
    payload = payload_flag(args.payload)
    run_at = None
    if args.run_at:
        try:
            run_at = dt.datetime.fromisoformat(args.run_at)
        except ValueError:
            raise InvalidInput(f"--run-at {args.run_at!r}: not an ISO 8601 time") from None
        if run_at.tzinfo is None:
            raise InvalidInput(f"--run-at {args.run_at!r}: add a UTC offset, e.g. 2030-01-01T09:00:00+00:00")
    if args.queue is None and settings.tasks:
        from ..engine.registry import import_task_modules

        import_task_modules(settings.tasks)  # the kind's declared queue (and its payload model)
    unique, debounce = _unique(args), _debounce(args)
    store = open_store(settings)
    try:
        # the task and its audit row (task.submit, as POST /v1/tasks writes) commit together; input
        # the library refuses is refused before it writes anything, and leaves no row
        with store.transaction() as tx, tx.connection() as conn:
            task_id = enqueue(conn, args.kind, payload, queue=args.queue, priority=args.priority, delay=args.delay,
                              run_at=run_at, idempotency_key=args.idempotency_key, max_attempts=args.max_attempts,
                              concurrency_key=args.concurrency_key, depends_on=args.depends_on,
                              on_parent_failure=args.on_parent_failure, unique=unique, debounce=debounce,
                              schema=settings.db_schema)
            tx.audit.audit_insert(actor=actor(), action="task.submit", target=str(task_id), request_id=None,
                                  outcome="ok", detail=None if task_id.created else {"replayed": True})
    except InvalidInput as exc:
        # the library's names, as this command spells its options
        message = str(exc)
        for name in ("depends_on", "on_parent_failure"):
            if message.startswith(name):
                raise InvalidInput(f"--{name.replace('_', '-')}{message[len(name):]}") from None
        raise
    finally:
        store.close()
    print(task_id)
    if not task_id.created:
        print(f"{task_id}: an existing task (its key was taken, or the enqueue merged into it)", file=sys.stderr)
    return 0


def _unique(args):
    from ..engine.enqueue_options import unique_from

    given = (args.unique_by_payload, args.unique_key, args.unique_period is not None, args.unique_states)
    if not (args.unique or any(given)):
        return None
    states = None if args.unique_states is None else [s.strip() for s in args.unique_states.split(",") if s.strip()]
    return unique_from({"by_payload": args.unique_by_payload, "payload_keys": args.unique_key,
                        "period": args.unique_period, "states": states})


def _debounce(args):
    from ..engine.enqueue_options import debounce_from

    if args.debounce_key is None:
        if args.debounce_delay is not None or args.debounce_max_wait is not None:
            raise InvalidInput("--debounce-delay and --debounce-max-wait need --debounce-key")
        return None
    if args.debounce_delay is None:
        raise InvalidInput("--debounce-key needs --debounce-delay SECONDS")
    return debounce_from({"key": args.debounce_key, "delay": args.debounce_delay,
                          "max_wait": args.debounce_max_wait})


def _plan(args, settings: Settings):
    """The command as a function of the store returning (JSON body, table printer)."""
    from ..api import render

    if args.command == "tasks" and args.action == "list":
        from ..api.listings import TASK_LIST_QUERY

        q = query(TASK_LIST_QUERY, {**{k: getattr(args, k) for k in TASK_FILTERS}, "id": args.id,
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

    if args.command == "tasks" and args.action == "steps":
        return _steps(args)

    if args.command == "tasks" and args.action in ("show", "events"):
        def show(store):
            if args.action == "show":
                return _task_view(store, store.tasks.task_get(args.id))
            events = store.tasks.task_events_list(args.id)
            if not events:  # every task has its 'queued' event: none means no task
                store.tasks.task_get(args.id)
            body = {"events": [render.event_json(e) for e in events]}
            return body, lambda: print_table(
                ("SEQ", "TYPE", "AT (UTC)", "ATTEMPT", "DATA"),
                [(str(e["seq"]), e["type"], cell(e["at"]), cell(e["attempt"]), cell(e["data"]))
                 for e in body["events"]], "no events")
        return show

    if args.command == "tasks":
        return _task_action(args)

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
        elif name == "last_error" and value is not None:
            rows.append((name, error_text(body)))
        elif name == "last_error_traceback" and value is not None:
            rows.append((name, "(below)"))
        elif not name.endswith("_truncated"):
            rows.append((name, cell(value)))

    def table():
        print_table(("FIELD", "VALUE"), rows, "")
        if body["last_error_traceback"] is not None:
            # its own lines, as Python printed it: a traceback flattened onto one line is unreadable
            print("\nearlier traceback:" if body["state"] == "completed" else "\ntraceback:")
            for line in body["last_error_traceback"].rstrip("\n").splitlines():
                print("  " + printable(line))
    return body, table


def error_text(task: dict) -> str:
    """A task's last_error on one line; a completed task's is an earlier attempt's, and says so."""
    text = cell(task["last_error"])
    return f"earlier error: {text}" if task["state"] == "completed" else text


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


def _steps(args):
    """`tasks steps ID`: GET /v1/tasks/{id}/steps' answer, one row per step, its result excerpted."""
    from ..api import render
    from ..api.listings import STEP_LIST_QUERY, step_listing
    from ..api.schema import Uuid

    task_id = Uuid().from_text(args.id, "id")
    q = query(STEP_LIST_QUERY, {"after": args.after, "limit": args.limit}, {})

    def table(body):
        print_table(("POS", "STEP", "TYPE", "ATTEMPT", "RUN", "RECORDED (UTC)", "RESULT"),
                    [(str(s["position"]), render.step_label(s), s["type"], str(s["attempt"]), str(s["lease_token"]),
                      cell(s["recorded_at"]), render.value_excerpt(s["result"])) for s in body["steps"]],
                    "no steps")
        if body["next_after"] is not None:
            print(f"more: --after {body['next_after']}")

    def steps(store):
        body = step_listing(store, task_id, q["after"], q["limit"])
        return body, lambda: table(body)
    return steps


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

    from ..api.listings import TASK_LIST_QUERY

    q = query(TASK_LIST_QUERY, {k: getattr(args, k) for k in TASK_FILTERS}, TASK_FILTERS)
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
    from ..api.render import waiting_text

    page_table(("ID", "KIND", "QUEUE", "STATE", "ATTEMPTS", "CREATED (UTC)", "LAST ERROR"),
                [(t["id"], t["kind"], t["queue"],
                  f"{t['state']} ({waiting_text(t['waiting_for'])})" if t["waiting_for"] else t["state"],
                  f"{t['attempts']}/{t['max_attempts']}" if t.get("max_attempts") else str(t["attempts"]),
                  cell(t["created_at"]), "-" if t["last_error"] is None else error_text(t)[:60])
                 for t in body["tasks"]],
                "no tasks", body["next_cursor"])
