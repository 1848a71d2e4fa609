"""`skiplock limits set|list|delete|apply`: the flow-control limits per task kind, from a terminal.

They run what the API's /v1/limits routes run: the same validation (engine/limits.py), the same
store statements, the same answer for `list -o json`, and an audit row per change (`limit.set`,
`limit.delete`, `limit.apply`) with the actor `cli:<os user>`. Input is checked before the
database is opened: a refused command writes nothing.
"""

from __future__ import annotations

import datetime as dt
import json

from ..engine.errors import LimitNotFound
from ..engine.settings import Settings
from .command import actor, audited, open_store, print_table


def add_parsers(sub) -> None:
    """Add `limits` to `skiplock`'s subparsers."""
    lm = sub.add_parser("limits", help="flow control: concurrency and rate limits per task kind")
    lms = lm.add_subparsers(dest="action", required=True, metavar="ACTION")
    st = lms.add_parser("set", help="create or replace a kind's limit (flags left out are no limit)")
    st.add_argument("kind")
    st.add_argument("--concurrency", type=int, help="at most N runs at once per concurrency key")
    st.add_argument("--rate", help="at most N starts per period and key: N/s, N/m, N/h, N/d (e.g. 100/s)")
    st.add_argument("--burst", type=int, help="starts at once on top of the rate (default: one second's worth)")
    ls = lms.add_parser("list", help="every limit, with what it holds back now")
    ls.add_argument("-o", "--output", choices=("table", "json"), default="table",
                    help="an aligned table (default) or one JSON document, GET /v1/limits' answer")
    dl = lms.add_parser("delete", help="delete a kind's limit: its throttled tasks are claimable at once")
    dl.add_argument("kind")
    ap = lms.add_parser("apply", help="create or update the limits a YAML file declares")
    ap.add_argument("-f", "--file", required=True, help="YAML file: a list of limits or `limits: [...]`")
    ap.add_argument("--prune", action="store_true", help="also delete the limits of kinds the file does not name")
    ap.add_argument("--dry-run", action="store_true", help="validate the file; change nothing")
    lm.set_defaults(run=run)


def run(args) -> int:
    from ..engine.limits import Limit, load_file

    settings = Settings.from_env()
    if args.action == "set":
        limit = Limit.build(args.kind, args.concurrency, args.rate, args.burst)
    elif args.action == "apply":
        limits = load_file(args.file)
        if args.dry_run:
            for limit in limits:
                print(f"valid: {limit.kind} ({describe(limit)})")
            return 0
    elif args.action == "delete":
        from ..engine.settings import check_name

        check_name("task kind", args.kind)
    store = open_store(settings)
    try:
        if args.action == "set":
            _set(store, limit)
        elif args.action == "list":
            _list(store, args.output)
        elif args.action == "delete":
            _delete(store, args.kind)
        else:
            _apply(store, limits, args.prune)
    finally:
        store.close()
    return 0


def describe(limit) -> str:
    parts = [] if limit.concurrency is None else [f"concurrency {limit.concurrency}"]
    if limit.rate is not None:
        parts.append(f"rate {limit.rate}, burst {limit.burst}")
    return ", ".join(parts)


def _set(store, limit) -> None:
    from ..api.listings import change_of, limit_detail

    with store.transaction() as tx:
        change = change_of(tx.limits.limit_upsert(limit))
        tx.audit.audit_insert(actor=actor(), action="limit.set", target=limit.kind, request_id=None, outcome="ok",
                              detail=limit_detail(limit, change))
    print(f"{change}: {limit.kind} ({describe(limit)})")


def _delete(store, kind: str) -> None:
    with audited(store, "limit.delete", kind) as (tx, _change):
        if not tx.limits.limit_delete([kind]):  # raising rolls back; the refusal's row is written
            raise LimitNotFound(f"no limit for kind {kind!r}")
    print(f"deleted: {kind}")


def _apply(store, limits, prune: bool) -> None:
    from ..engine.limits import apply_limits

    with store.transaction() as tx:
        report = apply_limits(tx, limits, prune=prune)
        if any(report[k] for k in ("created", "updated", "deleted")):
            tx.audit.audit_insert(actor=actor(), action="limit.apply", target=None, request_id=None, outcome="ok",
                                  detail={k: report[k] for k in ("created", "updated", "deleted")})
    for outcome in ("created", "updated", "unchanged", "deleted"):
        for kind in report[outcome]:
            print(f"{outcome}: {kind}")
    print(", ".join(f"{len(report[k])} {k}" for k in ("created", "updated", "unchanged", "deleted")))


def _list(store, output: str) -> None:
    from ..api.listings import limit_listing

    body = limit_listing(store)
    if output == "json":
        print(json.dumps(body, indent=2))
        return
    rows = [(b["kind"], _cell(b["concurrency"]), _cell(b["rate"]), _cell(b["burst"]), str(b["throttled"]),
             str(b["running"]), "-" if b["saturation"] is None else f"{b['saturation']:.0%}",
             "-" if b["tokens"] is None else f"{b['tokens']:.1f}",
             dt.datetime.fromisoformat(b["updated_at"].replace("Z", "+00:00")).strftime("%Y-%m-%d %H:%M:%S"))
            for b in body["limits"]]
    print_table(("KIND", "CONCURRENCY", "RATE", "BURST", "THROTTLED", "RUNNING", "SATURATION", "TOKENS",
                 "UPDATED (UTC)"), rows, "no limits")


def _cell(value) -> str:
    return "-" if value is None else str(value)
