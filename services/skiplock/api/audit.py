"""The audit log: every mutating request that passed authentication leaves one row naming the
token, the action, its target, the request id and the outcome.

A change and its row commit together: the view makes the change inside `audited()`, on the
store of one transaction, and the row is inserted in that transaction before it commits. A
refused request (bad input, not found, conflict) changes nothing; `record_refusal()` writes its
row on its own afterwards. Requests without a valid token or with too weak a role are not
recorded here (anyone could fill the table); they are logged.
Also GET /v1/audit, which lists the rows (admin).
"""

from __future__ import annotations

import dataclasses
import logging
from contextlib import contextmanager
from typing import Any, Iterator

from flask import Blueprint, g, request

from ..engine.errors import SkiplockError
from ..engine.store import Store
from .app_state import api
from .listings import AUDIT_LIST_QUERY
from .operations import operation
from .render import AUDIT_ENTRY, audit_json, page
from .responses import page_response

log = logging.getLogger("skiplock.api.audit")

bp = Blueprint("audit", __name__)


@dataclasses.dataclass
class Draft:
    """The audit row of the current request, filled in by the view."""

    action: str
    target: str | None = None
    detail: dict[str, Any] | None = None
    written: bool = False


def current_draft() -> Draft | None:
    draft = g.get("audit")
    if draft is None and g.get("operation") is not None and g.operation.audit and g.get("principal"):
        draft = g.audit = Draft(g.operation.audit, _target_from_path())
    return draft


def _target_from_path() -> str | None:
    args = request.view_args or {}
    return str(next(iter(args.values()))) if args else None


@contextmanager
def audited(target: str | None = None) -> Iterator[tuple[Store, Draft]]:
    """Run the request's change on one transaction's store and add its audit row (outcome ok)
    to that transaction. Set `draft.target` / `draft.detail` inside the block as they become known."""
    draft = current_draft()
    if target is not None:
        draft.target = target
    with api().store.transaction() as tx:
        yield tx, draft
        tx.audit.audit_insert(actor=g.principal.name, action=draft.action, target=draft.target,
                              request_id=g.request_id, outcome="ok", detail=draft.detail)
    draft.written = True


TARGET_CHARS = 200
MESSAGE_CHARS = 500


def recordable(text: str, limit: int) -> str:
    """`text` as Postgres text and jsonb can hold it, at most `limit` characters: NUL and lone
    UTF-16 surrogates (which neither can store) are escaped, not dropped, so the row still shows
    what was sent."""
    text = text.replace("\x00", "\\x00")
    if not text.isascii():
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= limit else text[:limit - 3] + "..."


def record_refusal(exc: SkiplockError) -> None:
    """After a mutating request failed with a 4xx: its row, outcome = the error code."""
    if not 400 <= exc.status < 500 or exc.status in (401, 403):
        return
    draft = current_draft()
    if draft is None or draft.written:
        return
    # a refusal's target and message echo the request: made storable here, so that no input
    # can make its row fail (and the refusal become a 500)
    draft.target = None if draft.target is None else recordable(draft.target, TARGET_CHARS)
    message = recordable(" ".join(str(exc).split()), MESSAGE_CHARS)
    try:
        api().store.audit.audit_insert(actor=g.principal.name, action=draft.action, target=draft.target,
                                       request_id=g.request_id, outcome=exc.code, detail={"message": message})
        draft.written = True
    except Exception as audit_exc:  # noqa: BLE001 - the refusal still goes back to the client
        log.error("audit row of a refused request not written",
                  extra={"action": draft.action, "request_id": g.request_id, "error": str(audit_exc)})


@operation(bp, "GET", "/v1/audit", summary="List audit entries, newest first", role="admin", tag="audit",
           query=AUDIT_LIST_QUERY,
           responses={200: ("A page of entries.", page("entries", AUDIT_ENTRY))})
def list_audit():
    q = g.query
    cursor = int(q["cursor"]) if q["cursor"] is not None else None
    entries = api().store.audit.audit_list(action=q["action"], actor=q["actor"], target=q["target"],
                                        cursor=cursor, limit=q["limit"] + 1)
    return page_response("entries", entries, q["limit"], audit_json)
