"""`skiplock workers list`: the worker registry, as GET /v1/workers shows it."""

from __future__ import annotations

import datetime as dt
import json

from ..engine.settings import Settings
from .command import open_store, print_table


def add_parsers(sub) -> None:
    wk = sub.add_parser("workers", help="the worker registry: every live worker")
    wks = wk.add_subparsers(dest="action", required=True, metavar="ACTION")
    wl = wks.add_parser("list", help="show every live worker: host, queues, concurrency, in flight, heartbeat")
    wl.add_argument("-o", "--output", choices=("table", "json"), default="table", help="default: table")
    wk.set_defaults(run=run)


def run(args) -> int:
    return _workers(args, Settings.from_env())


def _workers(args, settings: Settings) -> int:
    """`skiplock workers list`: the registry, as GET /v1/workers shows it."""
    store = open_store(settings)
    try:
        workers = store.workers.worker_list()
    finally:
        store.close()
    if args.output == "json":
        from ..api.render import iso

        print(json.dumps({"workers": [{**w._asdict(), "started_at": iso(w.started_at),
                                       "heartbeat_at": iso(w.heartbeat_at)} for w in workers]}, indent=2))
        return 0
    header = ("ID", "HOST", "PID", "QUEUES", "CONCURRENCY", "IN FLIGHT", "STARTED (UTC)", "LAST HEARTBEAT", "VERSION")
    print_table(header, [(w.id, w.host, str(w.pid), ",".join(w.queues), str(w.concurrency), str(w.in_flight),
                          w.started_at.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
                          f"{w.heartbeat_age_seconds:.1f}s ago", w.version) for w in workers], "no workers")
    return 0
