"""What the `skiplock` commands share: the actor their audit rows name and how a change writes
them (`audited`, the CLI's twin of api/audit.audited), the one-connection store a command opens,
and how answers are printed (an aligned table, or with `-o json` one JSON
document, the API's answer to the same request).

Nothing here imports Flask or werkzeug: only `skiplock api` loads them, when it starts the API.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import getpass
import json
import os
import re
from contextlib import contextmanager
from typing import Any, Iterator

from ..engine.errors import InvalidInput, SkiplockError
from ..engine.settings import Settings


def actor() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):  # no name for this uid (a bare container)
        return f"cli:uid-{os.getuid()}"


@dataclasses.dataclass
class Change:
    """The audit row of one command's change, filled in as its target and detail become known."""

    action: str
    target: str | None = None
    detail: dict[str, Any] | None = None


@contextmanager
def audited(store, action: str, target: str | None = None) -> Iterator[tuple[Any, Change]]:
    """Run a change on one transaction's store and add its audit row (outcome ok, actor
    `cli:<os user>`) to that transaction, as the API's route does; a refusal (a 4xx error) rolls
    the change back and writes its row on its own, outcome = the error's code."""
    change = Change(action, target)
    try:
        with store.transaction() as tx:
            yield tx, change
            tx.audit.audit_insert(actor=actor(), action=change.action, target=change.target, request_id=None,
                                  outcome="ok", detail=change.detail)
    except SkiplockError as exc:
        _record_refusal(store, (change.action, change.target), exc)
        raise


def open_store(settings: Settings):
    """The store of one command: one connection, named `cli`; the caller closes it. A database
    that cannot be reached is one line at once (DatabaseUnavailable), as `enqueue` says it: the
    pool alone would retry for its whole timeout, then raise its own error."""
    from ..engine.store import Store, connect

    url = settings.require_database_url()
    connect(url, pooler=settings.database_pooler).close()
    return Store.pooled(url, settings.db_schema, max_size=1, name="cli").open(wait=True)


def output_option() -> argparse.ArgumentParser:
    """`-o table|json`, as a parent parser of the commands that answer as the API does."""
    out = argparse.ArgumentParser(add_help=False)
    out.add_argument("-o", "--output", choices=("table", "json"), default="table",
                     help="an aligned table (default) or one JSON document, the API's answer")
    return out


def run_work(args, settings: Settings, work) -> int:
    """Run `work` (a function of the store returning (JSON body, table printer)) on a store of
    its own, and print its answer as `-o` asks. `work` was planned, its input parsed and
    validated, before this connects: a bad filter fails without a database."""
    store = open_store(settings)
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


class _Options(dict):
    """Option values by query parameter, read as parse_query reads a query string."""

    def getlist(self, name: str) -> list[str]:
        return self.get(name, [])


def query(fields, values: dict, flags: dict[str, str]) -> dict:
    """Options checked as the route checks its query string (its declared `fields`); errors
    name the option."""
    from ..api.schema import parse_query

    given = _Options()
    for k, vs in values.items():
        if vs is not None:
            given[k] = list(vs) if isinstance(vs, list) else [vs]
    try:
        return parse_query(fields, given)
    except InvalidInput as exc:
        name, _, rest = str(exc).partition(":")
        raise InvalidInput(f"--{flags.get(name, name).replace('_', '-')}:{rest}") from None


# C0, DEL and C1 controls, line and paragraph separators, and the bidirectional overrides and
# isolates: task data (payloads, errors, names) is anyone's text, and these would move the cursor,
# retitle or recolour the operator's terminal, or reorder what the row seems to say
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """`text` with each control character written as its escape (`\\x1b`, `\\u202e`)."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m[0]):02x}" if ord(m[0]) < 0x100 else f"\\u{ord(m[0]):04x}", text)


def print_table(header: tuple[str, ...], rows: list[tuple[str, ...]], empty: str) -> None:
    """Columns aligned to their widest cell, or `empty` when there are no rows."""
    if not rows:
        print(empty)
        return
    rows = [[printable(cell) for cell in r] for r in (header, *rows)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for r in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())


def page_table(header, rows, empty: str, next_cursor: str | None) -> None:
    print_table(header, rows, empty)
    if next_cursor:
        print(f"more: --cursor {next_cursor}")


def cell(value) -> str:
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



def payload_flag(text: str):
    """A `--payload` flag's JSON value, or one line saying why not."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"--payload is not valid JSON: {exc}") from None
