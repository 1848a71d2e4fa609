"""`skiplock queues list|pause|resume` and `skiplock kinds pause|resume`: the queue overview
(GET /v1/queues' answer) and the pause flags, audited as the API audits them."""

from __future__ import annotations

from ..engine.settings import Settings
from ..engine.task_actions import set_paused
from .command import actor, cell, output_option, print_table, run_work


def add_parsers(sub) -> None:
    out = output_option()
    qs = sub.add_parser("queues", help="queue overview; pause or resume a queue")
    qss = qs.add_subparsers(dest="action", required=True, metavar="ACTION")
    qss.add_parser("list", parents=[out], help="tasks per state, claimable, throttled, paused (GET /v1/queues)")
    kd = sub.add_parser("kinds", help="pause or resume a task kind in every queue")
    kds = kd.add_subparsers(dest="action", required=True, metavar="ACTION")
    for subs, scope in ((qss, "queue"), (kds, "kind")):
        for action, text in (("pause", f"stop claiming the {scope}'s tasks (they stay queued)"),
                             ("resume", f"claim a paused {scope}'s tasks again")):
            subs.add_parser(action, parents=[out], help=text).add_argument("name")
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
            set_paused(store, scope, name, paused, actor=actor())
            return {scope: name, "paused": paused}, lambda: print(f"{'paused' if paused else 'resumed'}: {name}")
        return pause

    from ..api.listings import queue_overview

    def queues(store):
        body = queue_overview(store)
        states = list(body["queues"][0]["tasks"]) if body["queues"] else []
        rows = [(q["name"], *(str(q["tasks"][s]) for s in states), str(q["claimable"]), str(q["throttled"]),
                 cell(None if q["oldest_claimable_age_seconds"] is None
                      else f"{q['oldest_claimable_age_seconds']:.1f}s"), "yes" if q["paused"] else "no")
                for q in body["queues"]]

        def table():
            print_table(("QUEUE", *(s.upper() for s in states), "CLAIMABLE", "THROTTLED", "OLDEST", "PAUSED"),
                        rows, "no queues")
            if body["paused_kinds"]:
                print(f"paused kinds: {', '.join(body['paused_kinds'])}")
        return body, table
    return queues
