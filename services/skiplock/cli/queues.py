"""`skiplock queues list|pause|resume` and `skiplock kinds list|pause|resume`: the queue overview
(GET /v1/queues' answer), the kinds tasks have had, and the pause flags, audited as the API
audits them.

A pause is refused for a name no task has had (no row in queue_kinds, and not paused already):
a typo would otherwise pause nothing and say `paused`. `--force` pauses it anyway, as the API
does (a queue's workers may start before its first task). The refusal writes nothing.
"""

from __future__ import annotations

from ..engine.errors import InvalidInput
from ..engine.settings import Settings
from ..engine.task_actions import set_paused
from ..api.render import duration_text
from .command import actor, cell, output_option, print_table, run_work

# how many known names a refused pause names
NAMES_SHOWN = 5


def add_parsers(sub) -> None:
    out = output_option()
    qs = sub.add_parser("queues", help="queue overview; pause or resume a queue")
    qss = qs.add_subparsers(dest="action", required=True, metavar="ACTION")
    qss.add_parser("list", parents=[out], help="tasks per state, claimable, throttled, paused (GET /v1/queues)")
    kd = sub.add_parser("kinds", help="the task kinds tasks have had; pause or resume one in every queue")
    kds = kd.add_subparsers(dest="action", required=True, metavar="ACTION")
    kds.add_parser("list", help="every kind a task has had, its queues, and whether it is paused"
                   ).set_defaults(output="table")  # a table only: no API route answers it
    for subs, scope in ((qss, "queue"), (kds, "kind")):
        for action, text in (("pause", f"stop claiming the {scope}'s tasks (they stay queued)"),
                             ("resume", f"claim a paused {scope}'s tasks again")):
            a = subs.add_parser(action, parents=[out], help=text)
            a.add_argument("name")
            if action == "pause":
                a.add_argument("--force", action="store_true",
                               help=f"pause it even if no task has had this {scope} yet")
    qs.set_defaults(run=run)
    kd.set_defaults(run=run)


def run(args) -> int:
    return run_work(args, Settings.from_env(), _plan(args))


def _plan(args):
    """The command as a function of the store returning (JSON body, table printer)."""
    if args.action in ("pause", "resume"):
        from ..api.schema import Name

        scope = "queue" if args.command == "queues" else "kind"
        name = Name().from_text(args.name, scope)
        paused = args.action == "pause"

        def pause(store):
            if paused and not args.force:
                _refuse_unknown(store, scope, name)
            set_paused(store, scope, name, paused, actor=actor())
            return {scope: name, "paused": paused}, lambda: print(f"{'paused' if paused else 'resumed'}: {name}")
        return pause
    return _kinds if args.command == "kinds" else _queues


def _refuse_unknown(store, scope: str, name: str) -> None:
    """InvalidInput naming a few known names, unless a task has had `name` or it is paused."""
    pairs = store.tasks.queue_kind_list()
    known = sorted({queue if scope == "queue" else kind for queue, kind in pairs}
                   | {n for s, n, _ in store.tasks.pause_list() if s == scope})
    if name in known:
        return
    if not known:
        listed = f"no task has had a {scope} yet"
    else:
        more = len(known) - NAMES_SHOWN
        listed = "known: " + ", ".join(known[:NAMES_SHOWN]) + (f" and {more} more" if more > 0 else "")
    raise InvalidInput(f"no task has had the {scope} {name!r} ({listed}); --force pauses it anyway")


def _kinds(store):
    pairs = store.tasks.queue_kind_list()
    paused = {n for s, n, _ in store.tasks.pause_list() if s == "kind"}
    queues: dict[str, list[str]] = {name: [] for name in paused}
    for queue, kind in pairs:
        queues.setdefault(kind, []).append(queue)
    rows = [(kind, ",".join(queues[kind]) or "-", "yes" if kind in paused else "no") for kind in sorted(queues)]
    return None, lambda: print_table(("KIND", "QUEUES", "PAUSED"), rows, "no kinds: no task has been enqueued yet")


def _queues(store):
    from ..api.listings import queue_overview

    body = queue_overview(store)
    states = list(body["queues"][0]["tasks"]) if body["queues"] else []
    rows = [(q["name"], *(str(q["tasks"][s]) for s in states),
             # the JSON's claimable counts a paused queue's ready tasks; none of them is claimed
             f"0 (paused, {q['claimable']} ready)" if q["paused"] and q["claimable"] else
             "0 (paused)" if q["paused"] else str(q["claimable"]), str(q["throttled"]),
             cell(None if q["oldest_claimable_age_seconds"] is None
                  else duration_text(q["oldest_claimable_age_seconds"])), "yes" if q["paused"] else "no")
            for q in body["queues"]]

    def table():
        print_table(("QUEUE", *(s.upper() for s in states), "CLAIMABLE", "THROTTLED", "OLDEST", "PAUSED"),
                    rows, "no queues")
        if body["paused_kinds"]:
            print(f"paused kinds: {', '.join(body['paused_kinds'])}")
    return body, table
