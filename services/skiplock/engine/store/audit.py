"""The API's audit log: one method per audit statement of engine/sql/api.sql, named after it.

What is audited, and with which outcome, is the API's and the CLI's decision.
"""

from __future__ import annotations

from ..model import AuditEntry
from .connection import jsonb
from .database import Database


class AuditStore:
    """Queries of the audit_log table."""

    def __init__(self, db: Database):
        self.db = db

    def audit_insert(self, *, actor: str, action: str, target: str | None, request_id: str | None,
                     outcome: str, detail: dict | None = None) -> int:
        """Append an audit row; on a transaction's store it commits with the change it records."""
        return self.db.fetch("audit_insert", dict(actor=actor, action=action, target=target, request_id=request_id,
                                                  outcome=outcome, detail=jsonb(detail)))[0][0]

    def audit_delete_old(self, older_than_seconds: float, limit: int = 500) -> int:
        """Retention: deletes up to `limit` rows older than that; how many it deleted."""
        return len(self.db.fetch("audit_delete_old", dict(older_than=older_than_seconds, limit=limit)))

    def audit_list(self, *, action: str | None = None, actor: str | None = None, target: str | None = None,
                   cursor: int | None = None, limit: int = 50) -> list[AuditEntry]:
        """Newest first; `cursor` is the id of the last entry of the previous page."""
        return self.db.fetch_as("audit_list", dict(action=action, actor=actor, target=target, cursor=cursor,
                                                   limit=limit), AuditEntry)
