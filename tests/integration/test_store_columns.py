"""Every statement that fills a row type returns exactly that type's fields, in order: a column
renamed or reordered in engine/sql/ (or a field in the type) fails here, not in production. A claim
returns its tasks and a summary row in one result: the task type's fields, then the summary's."""

from __future__ import annotations

import psycopg
import pytest

from skiplock.engine import queries
from skiplock.engine.model import AuditEntry, ClaimedTask, Task, TaskEvent
from skiplock.engine.store import Delivery, DeliveryRecord, DueSchedule, ReclaimedTask, WebhookEndpoint, WorkerRecord
from skiplock.engine.store.rows import row_fields, row_maker
from skiplock.engine.store.schedules import ScheduleRow
from skiplock.engine.store.tasks import ClaimSummary, LimitedClaimSummary

# statement -> the row type it fills (the store's fetch_as calls)
ROW_TYPES = {
    "task_reclaim_expired": ReclaimedTask,
    "task_get": Task,
    "task_list": Task,
    "task_events_list": TaskEvent,
    "audit_list": AuditEntry,
    "schedule_claim_due": DueSchedule,
    "schedule_list": ScheduleRow,
    "schedule_get": ScheduleRow,
    "webhook_endpoint_list": WebhookEndpoint,
    "webhook_endpoint_get": WebhookEndpoint,
    "webhook_delivery_claim": Delivery,
    "webhook_delivery_list": DeliveryRecord,
    "webhook_delivery_get": DeliveryRecord,
    "worker_list": WorkerRecord,
}

# statement -> the row type of its rows and that of its summary row (rows_and_summary)
SUMMARY_TYPES = {
    "task_claim": (ClaimedTask, ClaimSummary),
    "task_claim_limited": (ClaimedTask, LimitedClaimSummary),
}


class _Nulls(dict):
    """Every parameter NULL: enough for Postgres to plan the statement and describe its result."""

    def __missing__(self, key):
        return None


def _columns(conn: psycopg.Connection, sql: str) -> tuple[str, ...]:
    """The result columns of a statement, run with NULL parameters in a transaction rolled back."""
    with conn.transaction(force_rollback=True):
        cur = conn.execute(sql, _Nulls())
        return tuple(c.name for c in cur.description)


@pytest.mark.parametrize("statement", sorted(ROW_TYPES))
def test_statement_columns_match_the_row_type(db_url, statement):
    sql = queries.load()[statement]
    with psycopg.connect(db_url, autocommit=True) as conn:
        columns = _columns(conn, sql)
    fields = row_fields(ROW_TYPES[statement])
    # a type may end in fields a statement does not fill (task_list has no traceback): with defaults,
    # which row_maker checks
    assert columns == fields[:len(columns)], f"{statement} returns {columns}; {ROW_TYPES[statement].__name__} " \
                                             f"has {fields}"
    row_maker(statement, ROW_TYPES[statement], columns)  # raises TypeError when a required field is unfilled


@pytest.mark.parametrize("statement", sorted(SUMMARY_TYPES))
def test_claim_columns_are_the_task_then_the_summary(db_url, statement):
    sql = queries.load()[statement]
    with psycopg.connect(db_url, autocommit=True) as conn:
        columns = _columns(conn, sql)
    row_type, summary_type = SUMMARY_TYPES[statement]
    assert columns == row_fields(row_type) + row_fields(summary_type)


def test_every_row_type_statement_exists():
    assert set(ROW_TYPES) | set(SUMMARY_TYPES) <= set(queries.load())
