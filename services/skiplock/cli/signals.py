"""`skiplock signals send|list`: send a signal (the tasks waiting for it in ctx.wait_for_signal
wake), as POST /v1/signals does, with its audit row `signal.send` (actor `cli:<os user>`), and
list the signals sent, newest first, as GET /v1/signals.

The name and the payload are checked before the command connects, by engine/durable.py: the
line a bad one gets is the library's and the API's.
"""

from __future__ import annotations


from ..engine.durable import check_name, encode_json
from ..engine.settings import Settings
from .command import actor, cell, output_option, page_table, payload_flag, query, run_work


def add_parsers(sub) -> None:
    out = output_option()
    sg = sub.add_parser("signals", help="send or list signals (durable execution: ctx.wait_for_signal)")
    sgs = sg.add_subparsers(dest="action", required=True, metavar="ACTION")
    send = sgs.add_parser("send", parents=[out], help="send a signal: the tasks waiting for it wake (the first "
                                                      "send of a name wins)")
    send.add_argument("name")
    send.add_argument("--payload", default="null", help="JSON, what the waits return (default null)")
    ls = sgs.add_parser("list", parents=[out], help="signals newest first (GET /v1/signals)")
    ls.add_argument("--prefix", help="only the signals whose name starts with this")
    ls.add_argument("--limit", default="50", help="signals per page, 1-500 (default 50)")
    ls.add_argument("--cursor", help="the next page: the cursor the previous page printed")
    sg.set_defaults(run=run)


def run(args) -> int:
    settings = Settings.from_env()
    return run_work(args, settings, _send(args, settings) if args.action == "send" else _list(args))


def _send(args, settings: Settings):
    name = check_name("signal", args.name)
    payload = payload_flag(args.payload)
    payload = encode_json("signal payload", payload, settings.max_payload_bytes)[1]

    def send(store):
        with store.transaction() as tx:
            sent = tx.steps.signal_send(name, payload)
            tx.audit.audit_insert(actor=actor(), action="signal.send", target=name, request_id=None, outcome="ok",
                                  detail={"created": sent.created, "woken": sent.woken})
        body = {"name": name, "created": sent.created, "woken": sent.woken}
        return body, lambda: print(f"sent: {name} (woken {sent.woken})" if sent.created
                                   else f"already sent: {name} (unchanged, woken 0)")
    send.audit = ("signal.send", name)
    return send


def _list(args):
    from ..api.listings import SIGNAL_LIST_QUERY, signal_after, signal_listing
    from ..api.render import value_excerpt

    q = query(SIGNAL_LIST_QUERY, {"prefix": args.prefix, "limit": args.limit, "cursor": args.cursor}, {})
    signal_after(q["cursor"])  # a bad cursor fails before the command connects

    def list_(store):
        body = signal_listing(store, q["prefix"], q["limit"], q["cursor"])
        return body, lambda: page_table(("NAME", "SENT AT (UTC)", "PAYLOAD"),
                                        [(s["name"], cell(s["sent_at"]), value_excerpt(s["payload"]))
                                         for s in body["signals"]], "no signals", body["next_cursor"])
    return list_
