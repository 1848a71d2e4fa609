"""The `skiplock` command. Thin: parse arguments, build settings, call the role's entry.

Exit codes: 0 done (or stopped by a signal after draining); 1 bad configuration or input, with a
one-line reason on stderr; 2 bad command line (argparse); 3 the worker exited for a clean restart.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys

from . import cli_limits, cli_tasks
from .engine.errors import ConfigError, DatabaseUnavailable, DeliveryNotFound, InvalidInput, SkiplockError
from .engine.settings import API_ROLES, Settings, check_name
from .engine.version import package_version


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="skiplock", description="A durable task engine on one Postgres.")
    p.add_argument("--version", action="version", version=f"skiplock {package_version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    m = sub.add_parser("migrate", help="apply pending migrations (serialized, idempotent)")
    m.add_argument("--check", action="store_true", help="apply nothing; exit 1 while any is pending")

    w = sub.add_parser("worker", help="claim and run tasks")
    w.add_argument("--queues", help="comma-separated queues (SKIPLOCK_QUEUES)")
    w.add_argument("--concurrency", type=int, help="tasks run at once (SKIPLOCK_CONCURRENCY)")
    w.add_argument("--tasks", help="comma-separated handler modules (SKIPLOCK_TASKS)")

    sub.add_parser("scheduler", help="fire due schedules, reclaim expired leases, export queue gauges")

    api = sub.add_parser("api", help="the HTTP API under gunicorn")
    api.add_argument("--bind", default="0.0.0.0:8080", help="HOST:PORT to listen on (default 0.0.0.0:8080)")
    api.add_argument("--workers", type=int, default=2, help="gunicorn worker processes (default 2)")
    api.add_argument("--threads", type=int, default=4, help="request threads per worker (default 4)")
    sub.add_parser("dispatcher", help="deliver outbox events to webhook endpoints")

    wh = sub.add_parser("webhooks", help="manage webhook endpoints")
    whs = wh.add_subparsers(dest="action", required=True, metavar="ACTION")
    add = whs.add_parser("add", help="register an endpoint; prints its id and secret (shown once)")
    add.add_argument("url")
    add.add_argument("--events", default="task.*",
                     help="comma-separated event types, or task.* for all (default)")
    add.add_argument("--secret", help="a whsec_ secret (default: generated)")
    add.add_argument("--description")
    whs.add_parser("list", help="show endpoints")
    for action, text in (("remove", "delete an endpoint and its deliveries"),
                         ("rotate-secret", "replace an endpoint's secret; prints the new one"),
                         ("enable", "deliver to an endpoint again (after a 410 disabled it)")):
        a = whs.add_parser(action, help=text)
        a.add_argument("id")

    dl = sub.add_parser("deliveries", help="inspect and redeliver webhook deliveries")
    dls = dl.add_subparsers(dest="action", required=True, metavar="ACTION")
    ls = dls.add_parser("list", help="show deliveries")
    ls.add_argument("--state", choices=("pending", "delivering", "delivered", "dead"))
    ls.add_argument("--endpoint")
    ls.add_argument("--limit", type=int, default=50)
    rd = dls.add_parser("redeliver", help="send dead deliveries again: one by id, or all of an endpoint")
    target = rd.add_mutually_exclusive_group(required=True)
    target.add_argument("id", nargs="?")
    target.add_argument("--endpoint")

    sc = sub.add_parser("schedules", help="manage schedules (declarative: apply a file)")
    scs = sc.add_subparsers(dest="action", required=True, metavar="ACTION")
    ap = scs.add_parser("apply", help="create or update the schedules a YAML file declares")
    ap.add_argument("-f", "--file", required=True, help="YAML file: a list of schedules or `schedules: [...]`")
    ap.add_argument("--prune", action="store_true", help="also delete schedules the file does not name")
    ap.add_argument("--dry-run", action="store_true", help="validate the file; change nothing")
    scs.add_parser("list", help="show every schedule and when it fires next")
    for action, text in (("delete", "delete a schedule"), ("pause", "stop firing a schedule"),
                         ("resume", "fire a paused schedule again, from its next time after now"),
                         ("fire", "enqueue its task now, under the current tick's idempotency key (audited)"),
                         ("fires", "its last decisions: fired, skipped, buffered or missed, with the lag")):
        a = scs.add_parser(action, help=text)
        a.add_argument("name")
        if action == "fires":
            a.add_argument("--limit", type=int, default=20, help="how many, newest first (1-1000, default 20)")

    wk = sub.add_parser("workers", help="the worker registry: every live worker")
    wks = wk.add_subparsers(dest="action", required=True, metavar="ACTION")
    wl = wks.add_parser("list", help="show every live worker: host, queues, concurrency, in flight, heartbeat")
    wl.add_argument("-o", "--output", choices=("table", "json"), default="table", help="default: table")

    cli_tasks.add_parsers(sub)
    cli_limits.add_parsers(sub)

    tk = sub.add_parser("tokens", help="make API credentials (SKIPLOCK_API_TOKENS entries)")
    tks = tk.add_subparsers(dest="action", required=True, metavar="ACTION")
    new = tks.add_parser("new", help="print a new random token (shown once) and its SKIPLOCK_API_TOKENS entry")
    new.add_argument("--name", required=True, help="who uses it; the audit log's actor")
    new.add_argument("--role", required=True, choices=API_ROLES, help="what it may do")

    d = sub.add_parser("dev", help="every role in one process; embedded Postgres if no URL is set")
    d.add_argument("--no-demo", action="store_true", help="do not enqueue the demo workload")

    e = sub.add_parser("enqueue", help="enqueue one task and print its id")
    e.add_argument("kind")
    e.add_argument("--payload", default="{}", help="JSON payload (default {})")
    e.add_argument("--queue", default="default")
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
    return p


def _names(value: str | None) -> tuple[str, ...] | None:
    return None if value is None else tuple(v.strip() for v in value.split(",") if v.strip())


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _run(args)
    except (ConfigError, DatabaseUnavailable, SkiplockError) as exc:
        one_line = " ".join(str(exc).split())  # libpq messages span lines; ours are one
        print(f"skiplock {args.command}: {one_line}", file=sys.stderr)
        return 1


def _run(args) -> int:
    if args.command == "migrate":
        from .engine import migrate

        settings = Settings.from_env()
        url = settings.require_database_url()
        if args.check:
            waiting = migrate.pending(url, settings.db_schema)
            for m in waiting:
                print(f"pending: {m.path.name}")
            if waiting:
                return 1
            print("up to date")
            return 0
        applied = migrate.apply(url, settings.db_schema)
        for m in applied:
            print(f"applied: {m.path.name}")
        print("up to date" if not applied else f"{len(applied)} migration(s) applied")
        return 0

    if args.command == "worker":
        from . import worker

        settings = Settings.from_env(queues=_names(args.queues), concurrency=args.concurrency,
                                     tasks=_names(args.tasks))
        return worker.main(settings)

    if args.command == "dispatcher":
        from . import dispatcher

        return dispatcher.main(Settings.from_env())

    if args.command in ("webhooks", "deliveries"):
        return _webhooks(args, Settings.from_env())

    if args.command == "api":
        from . import api

        return api.main(Settings.from_env(), bind=args.bind, workers=args.workers, threads=args.threads)

    if args.command == "scheduler":
        from . import scheduler

        return scheduler.main(Settings.from_env())

    if args.command == "schedules":
        return _schedules(args, Settings.from_env())

    if args.command == "tokens":
        return _new_token(args.name, args.role)

    if args.command == "workers":
        return _workers(args, Settings.from_env())

    if args.command in ("tasks", "queues", "kinds", "audit"):
        return cli_tasks.run(args, Settings.from_env())

    if args.command == "limits":
        return cli_limits.run(args, Settings.from_env())

    if args.command == "dev":
        from . import dev

        return dev.main(Settings.from_env(), demo=not args.no_demo)

    if args.command == "enqueue":
        from .enqueueing import enqueue

        settings = Settings.from_env()
        try:
            payload = json.loads(args.payload)
        except json.JSONDecodeError as exc:
            raise InvalidInput(f"--payload is not valid JSON: {exc}") from None
        run_at = None
        if args.run_at:
            try:
                run_at = dt.datetime.fromisoformat(args.run_at)
            except ValueError:
                raise InvalidInput(f"--run-at {args.run_at!r}: not an ISO 8601 time") from None
            if run_at.tzinfo is None:
                raise InvalidInput(f"--run-at {args.run_at!r}: add a UTC offset, e.g. 2030-01-01T09:00:00+00:00")
        try:
            task_id = enqueue(settings.require_database_url(), args.kind, payload, queue=args.queue,
                              priority=args.priority, delay=args.delay, run_at=run_at,
                              idempotency_key=args.idempotency_key, max_attempts=args.max_attempts,
                              concurrency_key=args.concurrency_key, depends_on=args.depends_on,
                              on_parent_failure=args.on_parent_failure, schema=settings.db_schema)
        except InvalidInput as exc:
            # the library's names, as this command spells its options
            message = str(exc)
            for name in ("depends_on", "on_parent_failure"):
                if message.startswith(name):
                    raise InvalidInput(f"--{name.replace('_', '-')}{message[len(name):]}") from None
            raise
        print(task_id)
        return 0
    raise AssertionError(args.command)


def _webhooks(args, settings: Settings) -> int:
    from .engine.store import Store
    from .engine.webhooks import AddressGuard, check_event_types, check_secret, generate_secret

    if args.command == "webhooks" and args.action == "add":
        events = check_event_types(args.events)
        secret = check_secret(args.secret) if args.secret else generate_secret()
        AddressGuard.from_settings(settings).resolve(args.url)
    if args.command == "deliveries" and args.action == "list" and not 1 <= args.limit <= 1000:
        raise InvalidInput(f"--limit {args.limit}: must be 1-1000")
    store = Store(settings.require_database_url(), settings.db_schema, max_size=1, name="cli").open(wait=True)
    try:
        if args.command == "webhooks":
            if args.action == "add":
                endpoint = store.webhooks.webhook_endpoint_insert(args.url, events, secret, args.description)
                print(f"id: {endpoint.id}")
                print(f"secret: {secret}   (shown once: store it with the receiver)")
            elif args.action == "list":
                endpoints = store.webhooks.webhook_endpoint_list()
                if not endpoints:
                    print("no webhook endpoints")
                for e in endpoints:
                    state = "enabled" if e.enabled else f"disabled ({e.disabled_reason})"
                    print(f"{e.id}  {e.url}  events={','.join(e.event_types)}  {state}  "
                          f"pending={e.pending} dead={e.dead}")
            elif args.action == "remove":
                store.webhooks.webhook_endpoint_delete(args.id)
                print(f"removed: {args.id}")
            elif args.action == "rotate-secret":
                secret = generate_secret()
                store.webhooks.webhook_endpoint_set_secret(args.id, secret)
                print(f"secret: {secret}   (shown once)")
            else:
                store.webhooks.webhook_endpoint_set_enabled(args.id, True)
                print(f"enabled: {args.id}")
        elif args.action == "list":
            for d in store.webhooks.webhook_delivery_list(state=args.state, endpoint_id=args.endpoint,
                                                          limit=args.limit):
                print(f"{d.id}  {d.event_type}  {d.state}  attempts={d.attempts}  "
                      f"last_status={d.last_status}  {d.last_error or ''}".rstrip())
        else:
            n = store.webhooks.webhook_delivery_redeliver(delivery_id=args.id, endpoint_id=args.endpoint)
            if args.id and not n:
                raise DeliveryNotFound(f"no dead delivery {args.id}")
            print(f"{n} deliver{'y' if n == 1 else 'ies'} queued again")
    finally:
        store.close()
    return 0


def _new_token(name: str, role: str) -> int:
    """A token only its holder knows: the API is configured with its SHA-256 (api/auth.py)."""
    import hashlib
    import secrets

    check_name("token", name)
    token = "skl_" + secrets.token_urlsafe(32)  # the prefix lets secret scanners spot a leaked one
    digest = hashlib.sha256(token.encode()).hexdigest()
    print(f"token: {token}   (shown once: the client sends `Authorization: Bearer <token>`)")
    print(f"entry: {name}:{role}:{digest}   (add to SKIPLOCK_API_TOKENS, comma-separated)")
    return 0


def _schedules(args, settings: Settings) -> int:
    from .engine.schedule_actions import apply_schedules, set_schedule_enabled
    from .engine.schedules import load_file
    from .engine.store import Store

    definitions = load_file(args.file) if args.action == "apply" else None
    if args.action == "apply" and args.dry_run:
        from .engine.schedules import check_schedule_payloads

        check_schedule_payloads(definitions, settings.max_payload_bytes)
        for s in definitions:
            print(f"valid: {s.name} ({s.describe})")
        return 0
    if args.action == "fires" and not 1 <= args.limit <= 1000:
        raise InvalidInput(f"--limit {args.limit}: must be 1-1000")
    store = Store(settings.require_database_url(), settings.db_schema, max_size=1, name="cli").open(wait=True)
    try:
        if args.action == "apply":
            report = apply_schedules(store, definitions, prune=args.prune,
                                            max_payload_bytes=settings.max_payload_bytes)
            for outcome in ("created", "updated", "unchanged", "deleted"):
                for name in report[outcome]:
                    print(f"{outcome}: {name}")
            print(", ".join(f"{len(report[k])} {k}" for k in ("created", "updated", "unchanged", "deleted")))
        elif args.action == "list":
            _print_schedules(store.schedules.schedule_list())
        elif args.action == "delete":
            store.schedules.schedule_delete(args.name)
            print(f"deleted: {args.name}")
        elif args.action == "fire":
            _fire_schedule(store, args.name, settings)
        elif args.action == "fires":
            _print_fires(store, args.name, args.limit)
        else:
            set_schedule_enabled(store, args.name, args.action == "resume")
            print(f"{'resumed' if args.action == 'resume' else 'paused'}: {args.name}")
    finally:
        store.close()
    return 0


def _fire_schedule(store, name: str, settings: Settings) -> None:
    """As POST /v1/schedules/{name}/fire: the task of the current tick, and an audit row
    (`schedule.fire`, actor cli:<os user>), also when the schedule is not found."""
    from .api.render import iso
    from .engine.schedule_actions import fire_schedule_now

    who = cli_tasks.actor()
    try:
        with store.transaction() as tx:
            nominal, task_id, created = fire_schedule_now(tx, name, detail=f"fired now by {who}",
                                                          max_payload_bytes=settings.max_payload_bytes)
            tx.audit.audit_insert(actor=who, action="schedule.fire", target=name, request_id=None, outcome="ok",
                                  detail={"nominal_at": iso(nominal), "task_id": str(task_id), "created": created})
    except SkiplockError as exc:
        if 400 <= exc.status < 500:
            store.audit.audit_insert(actor=who, action="schedule.fire", target=name, request_id=None,
                                     outcome=exc.code, detail={"message": " ".join(str(exc).split())[:500]})
        raise
    tick = iso(nominal)
    print(f"fired: {name} at {tick}, task {task_id}" if created
          else f"already fired in this tick: {name} at {tick}, task {task_id}")


def _print_fires(store, name: str, limit: int) -> None:
    store.schedules.schedule_get(name)  # an unknown name is an error, not an empty list
    rows = [(nominal_at.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"), outcome,
             f"{(at - nominal_at).total_seconds():.3f}", "-" if task_id is None else str(task_id), detail or "")
            for _schedule, nominal_at, at, outcome, task_id, detail in store.schedules.schedule_fires_list(name, limit)]
    _print_table(("NOMINAL (UTC)", "OUTCOME", "LAG (S)", "TASK", "DETAIL"), rows, f"no decisions for {name} yet")


def _print_schedules(statuses) -> None:
    header = ("NAME", "KIND", "QUEUE", "WHEN", "OVERLAP", "CATCHUP", "STATE", "NEXT FIRE (UTC)", "FIRES", "SKIPS")
    rows = []
    for st in statuses:
        s = st.schedule
        rows.append((s.name, s.kind, s.queue, s.describe, s.overlap, s.catchup,
                     "enabled" if s.enabled else "paused",
                     st.next_fire_at.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3],
                     str(st.fires), str(st.skips)))
    _print_table(header, rows, "no schedules")


# C0, DEL and C1 controls, line and paragraph separators, and the bidirectional overrides and
# isolates: task data (payloads, errors, names) is anyone's text, and these would move the cursor,
# retitle or recolour the operator's terminal, or reorder what the row seems to say
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """`text` with each control character written as its escape (`\\x1b`, `\\u202e`)."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m[0]):02x}" if ord(m[0]) < 0x100 else f"\\u{ord(m[0]):04x}", text)


def _print_table(header: tuple[str, ...], rows: list[tuple[str, ...]], empty: str) -> None:
    """Columns aligned to their widest cell, or `empty` when there are no rows."""
    if not rows:
        print(empty)
        return
    rows = [[printable(cell) for cell in r] for r in (header, *rows)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for r in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())


def _workers(args, settings: Settings) -> int:
    """`skiplock workers list`: the registry, as GET /v1/workers shows it."""
    from .engine.store import Store

    store = Store(settings.require_database_url(), settings.db_schema, max_size=1, name="cli").open(wait=True)
    try:
        workers = store.workers.worker_list()
    finally:
        store.close()
    if args.output == "json":
        from .api.render import iso

        print(json.dumps({"workers": [{**w._asdict(), "started_at": iso(w.started_at),
                                       "heartbeat_at": iso(w.heartbeat_at)} for w in workers]}, indent=2))
        return 0
    header = ("ID", "HOST", "PID", "QUEUES", "CONCURRENCY", "IN FLIGHT", "STARTED (UTC)", "LAST HEARTBEAT", "VERSION")
    _print_table(header, [(w.id, w.host, str(w.pid), ",".join(w.queues), str(w.concurrency), str(w.in_flight),
                           w.started_at.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
                           f"{w.heartbeat_age_seconds:.1f}s ago", w.version) for w in workers], "no workers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
