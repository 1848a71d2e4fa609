"""The one package that talks to Postgres at run time (migrations and the listener aside).

`Store` is its door: `store.tasks`, `store.schedules`, `store.webhooks`, `store.audit`, `store.workers`,
`store.limits`, `store.replication`, `store.steps` and `store.events` are its rooms, one class per table group, each method named after the named
statement of engine/sql/ it runs (`store.tasks.task_claim` runs `task_claim`), so that one grep
finds both. Rows become the frozen types of engine/model.py (and of the rooms) by column name;
psycopg errors become skiplock errors (translation.translated_errors). Decisions belong to the
roles that call it. Creating a Store opens nothing; `open()` starts the pools.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

from .audit import AuditStore
from .console_sessions import ConsoleSessionStore
from .connection import AsyncConnection, Connection, connect, connect_async
from .copy import COPY_THRESHOLD
from .database import Database
from .events import EventStore, FeedCursor, FeedEvent, FeedPage
from .limits import LimitRecord, LimitStats, LimitStore
from .reply_timeout import wait_unbounded
from .replication import ReplicationStore
from .schedules import DueSchedule, ScheduleStore
from .steps import StepStore
from .task_inserts import TaskWrite, copy_many, schema_check, task_insert, tasks_write, tasks_write_async
from .tasks import ReclaimedTask, TaskStore
from .translation import translated_errors
from .webhooks import Delivery, DeliveryRecord, WebhookEndpoint, WebhookStore
from .workers import WorkerRecord, WorkerStore

__all__ = ["COPY_THRESHOLD", "Connection", "Delivery", "DeliveryRecord", "DueSchedule", "FeedCursor", "FeedEvent",
           "FeedPage", "LimitRecord", "LimitStats",
           "ReclaimedTask", "Store",
           "WebhookEndpoint", "WorkerRecord", "TaskWrite", "connect", "connect_async", "copy_many", "schema_check", "task_insert", "tasks_write", "tasks_write_async",
           "translated_errors", "wait_unbounded"]


class Store:
    """Pooled access for the roles. Thread-safe: each call borrows a connection."""

    def __init__(self, db: Database):
        """The rooms over `db`: a pooled Database (Store.pooled), or a transaction's (transaction())."""
        self.db = db
        self.url, self.schema, self.channel = db.url, db.schema, db.channel
        self.tasks = TaskStore(db, Store)
        self.schedules = ScheduleStore(db)
        self.webhooks = WebhookStore(db)
        self.audit = AuditStore(db)
        self.console_sessions = ConsoleSessionStore(db)
        self.workers = WorkerStore(db)
        self.limits = LimitStore(db)
        self.replication = ReplicationStore(db)
        self.steps = StepStore(db, self.tasks.routed)  # one record of the nodes that do not answer
        self.events = EventStore(db)

    @classmethod
    def pooled(cls, url: str, schema: str = "skiplock", *, min_size: int = 1, max_size: int = 8,
               name: str = "skiplock", worker_connections: bool = False, statement_timeout: float | None = None,
               pooler: str = "none", reply_timeout: float | None = None, borrow_timeout: float = 15.0) -> "Store":
        """A store on pools of its own (opened by `open()`). `worker_connections`: give task_claim
        and task_settle a connection each of their own, on which those statements run with
        generic plans (see database.Database); `pooler`: SKIPLOCK_DATABASE_POOLER
        (settings.POOLERS); `reply_timeout`: the longest wait for an answer of Postgres
        (reply_timeout.AnsweringConnection); `borrow_timeout`: the longest wait for a pooled
        connection."""
        return cls(Database(url, schema, min_size=min_size, max_size=max_size, name=name,
                            worker_connections=worker_connections, statement_timeout=statement_timeout,
                            pooler=pooler, reply_timeout=reply_timeout, borrow_timeout=borrow_timeout))

    def open(self, wait: bool = False) -> "Store":
        self.db.open(wait=wait)
        return self

    def close(self) -> None:
        self.db.close()

    @contextmanager
    def connection(self, timeout: float | None = None) -> Iterator[psycopg.Connection]:
        """Borrow a pooled connection (waiting up to `timeout`, default the pool's borrow timeout); psycopg
        errors inside surface as skiplock errors."""
        with self.db.connection(timeout) as conn:
            yield conn

    @contextmanager
    def transaction(self) -> Iterator["Store"]:
        """A store whose every call runs on one connection, in one transaction that commits when
        the block ends (rolls back if it raises). The API commits a change and its audit row
        this way. On a transaction's store, a savepoint of its transaction."""
        with self.db.transaction() as db:
            yield Store(db)

    def ping(self, timeout: float | None = None) -> None:
        with self.connection(timeout) as conn:
            conn.execute("SELECT 1")
