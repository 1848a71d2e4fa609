"""`skiplock schedules apply|add|list|delete|pause|resume|fire|fires`: schedules, declared in a
YAML file and applied, or added one at a time. Each change writes the audit row of the API's
matching route (actor `cli:<os user>`): apply one `schedule.create|update|delete` per schedule it
changes, add `schedule.create`, delete
`schedule.delete`, pause and resume `schedule.update` (PATCH {"enabled"}), fire `schedule.fire`;
a refused one (not found) its row with the error's code."""

from __future__ import annotations

import datetime as dt

from ..engine.errors import InvalidInput
from ..engine.settings import Settings
from .command import actor, audited, open_store, payload_flag, print_table


def add_parsers(sub) -> None:
    sc = sub.add_parser("schedules", help="manage schedules (declarative: apply a file)")
    scs = sc.add_subparsers(dest="action", required=True, metavar="ACTION")
    ap = scs.add_parser("apply", help="create or update the schedules a YAML file declares")
    ap.add_argument("-f", "--file", required=True, help="YAML file: a list of schedules or `schedules: [...]`")
    ap.add_argument("--prune", action="store_true", help="also delete schedules the file does not name")
    ap.add_argument("--dry-run", action="store_true", help="validate the file; change nothing")
    ad = scs.add_parser("add", help="create one schedule from flags (a name already in use is refused)")
    ad.add_argument("name")
    ad.add_argument("--kind", required=True, help="the task kind it enqueues")
    when = ad.add_mutually_exclusive_group(required=True)
    when.add_argument("--cron", metavar="EXPR", help="cron expression, e.g. '*/5 * * * *'")
    when.add_argument("--every", type=float, metavar="SECONDS", help="fire every N seconds instead")
    ad.add_argument("--payload", default=None, metavar="JSON", help="the task's payload (a JSON object)")
    ad.add_argument("--queue", default=None, help="the task's queue (default: default, as a schedules file)")
    ad.add_argument("--timezone", default=None, metavar="TZ", help="the cron expression's time zone (default UTC)")
    scs.add_parser("list", help="show every schedule and when it fires next")
    for action, text in (("delete", "delete a schedule"), ("pause", "stop firing a schedule"),
                         ("resume", "fire a paused schedule again, from its next time after now"),
                         ("fire", "enqueue its task now, under the current tick's idempotency key (audited)"),
                         ("fires", "its last decisions: fired, skipped, buffered or missed, with the lag")):
        a = scs.add_parser(action, help=text)
        a.add_argument("name")
        if action == "fires":
            a.add_argument("--limit", type=int, default=20, help="how many, newest first (1-1000, default 20)")
    sc.set_defaults(run=run)


def run(args) -> int:
    return _schedules(args, Settings.from_env())


def _schedules(args, settings: Settings) -> int:
    from ..engine.schedule_actions import set_schedule_enabled
    from ..engine.schedules import load_file

    definitions = load_file(args.file) if args.action == "apply" else None
    if args.action == "add":
        definitions = [_from_flags(args)]
    if args.action == "apply" and args.dry_run:
        from ..engine.schedules import check_schedule_payloads

        check_schedule_payloads(definitions, settings.max_payload_bytes)
        for s in definitions:
            print(f"valid: {s.name} ({s.describe})")
        return 0
    if args.action == "fires" and not 1 <= args.limit <= 1000:
        raise InvalidInput(f"--limit {args.limit}: must be 1-1000")
    store = open_store(settings)
    try:
        if args.action == "apply":
            _apply(store, definitions, args, settings)
        elif args.action == "add":
            _add(store, definitions[0], settings)
        elif args.action == "list":
            _print_schedules(store.schedules.schedule_list())
        elif args.action == "delete":
            with audited(store, "schedule.delete", args.name) as (tx, _change):
                tx.schedules.schedule_delete(args.name)
            print(f"deleted: {args.name}")
        elif args.action == "fire":
            _fire_schedule(store, args.name, settings)
        elif args.action == "fires":
            _print_fires(store, args.name, args.limit)
        else:
            # as PATCH /v1/schedules/{name} {"enabled": ...}, the API's pause and resume
            with audited(store, "schedule.update", args.name) as (tx, change):
                set_schedule_enabled(tx, args.name, args.action == "resume")
                change.detail = {"fields": ["enabled"]}
            print(f"{'resumed' if args.action == 'resume' else 'paused'}: {args.name}")
    finally:
        store.close()
    return 0


def _fire_schedule(store, name: str, settings: Settings) -> None:
    """As POST /v1/schedules/{name}/fire: the task of the current tick, and an audit row
    (`schedule.fire`, actor cli:<os user>), also when the schedule is not found."""
    from ..api.render import iso
    from ..engine.schedule_actions import fire_schedule_now

    with audited(store, "schedule.fire", name) as (tx, change):
        nominal, task_id, created = fire_schedule_now(tx, name, detail=f"fired now by {actor()}",
                                                      max_payload_bytes=settings.max_payload_bytes)
        change.detail = {"nominal_at": iso(nominal), "task_id": str(task_id), "created": created}
    tick = iso(nominal)
    print(f"fired: {name} at {tick}, task {task_id}" if created
          else f"already fired in this tick: {name} at {tick}, task {task_id}")


def _apply(store, definitions, args, settings: Settings) -> None:
    """The file's schedules in one transaction, with the audit rows the API writes for the same
    changes: `schedule.create`, `schedule.update` or `schedule.delete` (--prune) per schedule
    changed (an unchanged one writes none), each naming the file."""
    from ..engine.schedule_actions import apply_schedules

    with store.transaction() as tx:
        report = apply_schedules(tx, definitions, prune=args.prune, max_payload_bytes=settings.max_payload_bytes)
        for outcome, action in (("created", "schedule.create"), ("updated", "schedule.update"),
                                ("deleted", "schedule.delete")):
            for name in report[outcome]:
                tx.audit.audit_insert(actor=actor(), action=action, target=name, request_id=None, outcome="ok",
                                      detail={"file": args.file})
    for outcome in ("created", "updated", "unchanged", "deleted"):
        for name in report[outcome]:
            print(f"{outcome}: {name}")
    print(", ".join(f"{len(report[k])} {k}" for k in ("created", "updated", "unchanged", "deleted")))


def _from_flags(args):
    """The schedule `schedules add` names, checked as a file's entry is (one line per error)."""
    from ..engine.schedules import Schedule

    fields = {"name": args.name, "kind": args.kind}
    if args.cron is not None:
        fields["cron"] = args.cron
    else:
        fields["interval_seconds"] = args.every
    if args.payload is not None:
        fields["payload"] = payload_flag(args.payload)
    for field in ("queue", "timezone"):
        if getattr(args, field) is not None:
            fields[field] = getattr(args, field)
    return Schedule.from_mapping(fields)


def _add(store, schedule, settings: Settings) -> None:
    """As POST /v1/schedules: `schedule.create`; a name in use is refused and nothing changes
    (the upsert and its refusal roll back together: no read-then-write)."""
    from ..engine.schedule_actions import apply_schedules

    with audited(store, "schedule.create", schedule.name) as (tx, _change):
        report = apply_schedules(tx, [schedule], max_payload_bytes=settings.max_payload_bytes)
        if not report["created"]:
            raise InvalidInput(f"schedule {schedule.name!r} exists: change it with `schedules apply`, "
                               "or delete it first")
    print(f"created: {schedule.name} ({schedule.describe})")


def _print_fires(store, name: str, limit: int) -> None:
    store.schedules.schedule_get(name)  # an unknown name is an error, not an empty list
    rows = [(nominal_at.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"), outcome,
             f"{(at - nominal_at).total_seconds():.3f}", "-" if task_id is None else str(task_id), detail or "")
            for _schedule, nominal_at, at, outcome, task_id, detail in store.schedules.schedule_fires_list(name, limit)]
    print_table(("NOMINAL (UTC)", "OUTCOME", "LAG (S)", "TASK", "DETAIL"), rows, f"no decisions for {name} yet")


def _print_schedules(statuses) -> None:
    header = ("NAME", "KIND", "QUEUE", "WHEN", "OVERLAP", "CATCHUP", "STATE", "NEXT FIRE (UTC)", "FIRES", "SKIPS")
    rows = []
    for st in statuses:
        s = st.schedule
        rows.append((s.name, s.kind, s.queue, s.describe, s.overlap, s.catchup,
                     "enabled" if s.enabled else "paused",
                     st.next_fire_at.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3],
                     str(st.fires), str(st.skips)))
    print_table(header, rows, "no schedules")
