"""`skiplock audit list`: the audit log, newest first, with GET /v1/audit's filters."""

from __future__ import annotations

from ..engine.settings import Settings
from .command import cell, output_option, page_table, query, run_work

FILTERS = ("action", "actor", "target", "limit", "cursor")


def add_parsers(sub) -> None:
    au = sub.add_parser("audit", help="the audit log")
    aus = au.add_subparsers(dest="action", required=True, metavar="ACTION")
    al = aus.add_parser("list", parents=[output_option()], help="entries newest first (GET /v1/audit's filters)")
    for name in FILTERS:
        al.add_argument(f"--{name}")
    au.set_defaults(run=run)


def run(args) -> int:
    return run_work(args, Settings.from_env(), _plan(args))


def _plan(args):
    """The command as a function of the store returning (JSON body, table printer)."""
    from ..api import render
    from ..api.listings import AUDIT_LIST_QUERY

    q = query(AUDIT_LIST_QUERY, {k: getattr(args, k) for k in FILTERS}, {})

    def audit(store):
        limit, cursor = q["limit"], q["cursor"]
        rows = store.audit.audit_list(action=q["action"], actor=q["actor"], target=q["target"],
                                      cursor=None if cursor is None else int(cursor), limit=limit + 1)
        more, rows = len(rows) > limit, rows[:limit]
        body = {"entries": [render.audit_json(e) for e in rows], "next_cursor": str(rows[-1].id) if more else None}
        return body, lambda: page_table(
            ("ID", "AT (UTC)", "ACTOR", "ACTION", "TARGET", "OUTCOME", "DETAIL"),
            [(str(e["id"]), cell(e["at"]), e["actor"], e["action"], cell(e["target"]), e["outcome"],
              cell(e["detail"])) for e in body["entries"]], "no audit entries", body["next_cursor"])
    return audit
