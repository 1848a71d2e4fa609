"""The tasks, their events and the pauses: one method per statement of engine/sql/tasks.sql
(and the task listings of api.sql, the retention and queue reads of maintenance.sql), named
after it, so that one grep finds both.

These methods run queries and fence writes; which task to retry, when, and what a replayed
request means is decided by the roles that call them.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import psycopg
from psycopg.types.json import Jsonb

from ..errors import InvalidInput, TaskNotCancellable, TaskNotFound, TaskNotResumable
from ..model import (CANCELLED, FAILED, FINISHED_STATES, QUEUED, WAITING, Claim, ClaimedTask, Parent, Settlement,
                     Task, TaskEvent, TaskSpec, uuid7)
from .. import queries
from .connection import jsonb
from .database import Database
from . import routed_graph
from .plans import _run
from .routed import RoutedTasks
from .rows import rows_and_summary
from .task_inserts import task_insert
from .translation import translated_errors

_SETTLEMENT_OPTIONAL = ("result", "error", "delay", "cursor", "progress", "message", "deadline_seconds",
                        "kind_max_attempts", "traceback", "suspended", "wake_at", "awaited_signal",
                        "waiting_on_add", "ready")
# settle_params reads them by position; the last field, the queue, routes (store/routed.py)
assert _SETTLEMENT_OPTIONAL == Settlement._fields[3:-1] and Settlement._fields[-1] == "queue"
_NO_OPTIONALS = (None,) * len(_SETTLEMENT_OPTIONAL)


class ReclaimedTask(NamedTuple):
    """A claim task_reclaim_expired took back, and the state it left the task in."""

    id: uuid.UUID
    queue: str
    state: str  # queued (reclaimed), failed (reclaims or deadline spent) or cancelled
    kind: str
    attempts: int
    error: str | None


class ClaimSummary(NamedTuple):
    """task_claim's summary row: what the claim saw besides the tasks it leased."""

    parked: int          # tasks of limited kinds it parked instead of claiming
    limited_work: bool   # a group of parked tasks may have work (task_claim_limited has something to look at)
    crowded_queues: int  # queues left out: every claim lane was taken


class LimitedClaimSummary(NamedTuple):
    """task_claim_limited's summary row."""

    token_wait_seconds: float | None  # until the first throttled bucket has a token (None: none waits)


def settle_params(settlements: Sequence[Settlement]) -> dict:
    """task_settle's parameters: one JSON object per settlement, with only the fields it sets."""
    rows = []
    optional = _SETTLEMENT_OPTIONAL
    for s in settlements:
        # the id as 32 hex digits (a third of str()'s cost; Postgres reads it as a uuid)
        row = {"id": s.task_id.hex, "token": s.lease_token, "outcome": s.outcome}
        if s[3:-1] != _NO_OPTIONALS:  # the common completion, with no result, has none
            for name, value in zip(optional, s[3:-1]):  # the fields after outcome, in order
                if value is not None:
                    row[name] = value
        rows.append(row)
    return {"settlements": Jsonb(rows)}


def parse_uuid(value: uuid.UUID | str, error: type[Exception], what: str) -> uuid.UUID:
    if isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise error(f"{what} id {value!r} is not a UUID") from None


def _parse_id(task_id: uuid.UUID | str) -> uuid.UUID:
    return parse_uuid(task_id, TaskNotFound, "task")


def _id_list(ids: Sequence[uuid.UUID | str] | None) -> list[uuid.UUID] | None:
    return None if ids is None else [_parse_id(i) for i in ids]


class TaskStore:
    """Queries of the tasks, task_events and pauses tables."""

    def __init__(self, db: Database, store_on: Callable[[Database], Any]):
        self.db = db
        self._store_on = store_on  # the facade over a transaction's database, for `last` of _many
        self.routed = RoutedTasks(db)  # the worker's statements on the distributed placement

    # -- enqueue
    def task_insert(self, specs: Sequence[TaskSpec]) -> list[uuid.UUID]:
        """Insert tasks in one transaction (the caller's, on a transaction's store); see task_insert()."""
        with self.db.unit() as conn:
            return task_insert(conn, specs, self.db.schema, self.db.distributed)

    def task_submitted(self, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, tuple]:
        """{id: (request_hash, inserted by this transaction, kind, queue, priority, payload,
        max_attempts)} of tasks just inserted, on the inserting transaction's store."""
        return {row[0]: row[1:] for row in self.db.fetch("task_submitted", {"ids": list(ids)})}

    def task_annotate(self, ids: Sequence[uuid.UUID], hashes: Sequence[str | None],
                      deadlines: Sequence[dt.datetime | None]) -> None:
        """Write the request fingerprints and deadlines of tasks just inserted (same transaction)."""
        with self.db.connection() as conn:
            conn.execute(self.db.sql["task_annotate"], dict(ids=list(ids), hashes=list(hashes),
                                                            deadlines=list(deadlines)))

    # -- the worker
    def task_claim(self, queues: Sequence[str], limit: int, owner: str, lease_seconds: float,
                   kind_max_attempts: Mapping[str, int] | None = None, park_limit: int = 0, lanes: int = 0
                   ) -> Claim:
        """Lease up to `limit` claimable tasks of `queues` (on the claims connection, if the store
        has worker connections), parking those of limited kinds (up to `park_limit` more rows
        are read for that). A claimed task without max_attempts of its own gets its kind's from
        `kind_max_attempts` ({kind: max_attempts}). `lanes` (0: no bound): a queue whose that many
        claim lanes are all held by other claims is left out (Claim.crowded counts them).
        On the distributed placement: one queue after another (store/routed.py)."""
        if self.db.distributed:
            return self.routed.claim(queues, limit, owner, lease_seconds, kind_max_attempts)
        with self.db.connection(pool=self.db.claim_pool) as conn:
            cursor = conn.execute(self.db.sql["task_claim"], dict(
                queues=list(queues), limit=limit, owner=owner, lease_seconds=lease_seconds, park_limit=park_limit,
                kind_max_attempts=jsonb(kind_max_attempts), lanes=lanes))
            rows, summary = rows_and_summary("task_claim", ClaimedTask, ClaimSummary, cursor)
        return Claim(rows, parked=summary.parked, limited_work=summary.limited_work, crowded=summary.crowded_queues)

    def task_claim_limited(self, queues: Sequence[str], limit: int, owner: str, lease_seconds: float,
                           kind_max_attempts: Mapping[str, int] | None = None, groups: int | None = None
                           ) -> Claim:
        """Lease up to `limit` parked tasks of `queues` under their groups' limits, round robin
        over up to `groups` groups (default `limit`), least recently visited first:
        limit_group_lock, then task_claim_limited, in one transaction."""
        with self.db.connection(pool=self.db.claim_pool) as conn, conn.transaction():
            locked = conn.execute(self.db.sql["limit_group_lock"],
                                  dict(groups=groups or limit)).fetchall()
            if not locked:
                return Claim([])
            cursor = conn.execute(self.db.sql["task_claim_limited"], dict(
                kinds=[k for k, _ in locked], keys=[c for _, c in locked], queues=list(queues),
                limit=limit, owner=owner, lease_seconds=lease_seconds,
                kind_max_attempts=jsonb(kind_max_attempts)))
            rows, summary = rows_and_summary("task_claim_limited", ClaimedTask, LimitedClaimSummary, cursor)
        return Claim(rows, limited_work=True, wake_in=summary.token_wait_seconds)

    def task_heartbeat(self, leases: Iterable[tuple], lease_seconds: float) -> dict[uuid.UUID, str]:
        """Renew claims, each (task id, lease token, queue; the queue routes it on the distributed
        placement); returns {task id: state} for the claims still held ('busy': held, but
        another transaction had the row for the moment, so not renewed this time)."""
        leases = list(leases)
        if not leases:
            return {}
        if self.db.distributed:
            return self.routed.heartbeat(leases, lease_seconds)
        rows = self.db.fetch("task_heartbeat", dict(ids=[lease[0] for lease in leases],
                                                    tokens=[lease[1] for lease in leases],
                                                    lease_seconds=lease_seconds))
        return dict(rows)

    def task_settle(self, settlements: Sequence[Settlement], conn: psycopg.Connection | None = None
                    ) -> dict[uuid.UUID, str]:
        """Apply fenced outcomes, many in one statement (on `conn`, else on the outcomes
        connection if the store has worker connections); returns {task id: new state} for those
        applied. A settlement missing from the result was refused by its fence; one whose state
        is model.BUSY was not written (another transaction had the row for the moment, and it is never
        waited for): write it again."""
        if not settlements:
            return {}
        if self.db.distributed:
            return self.routed.settle(settlements, settle_params, conn)
        params = settle_params(settlements)
        if conn is not None:
            with translated_errors():
                return dict(conn.execute(self.db.sql["task_settle"], params).fetchall())
        return dict(self.db.fetch("task_settle", params, pool=self.db.outcome_pool))

    def task_outcome_stands(self, leases: Sequence[tuple[uuid.UUID, int]]) -> dict[uuid.UUID, str]:
        """{task id: state} of the claims (id, lease token) whose outcome is already written: after a
        write whose answer was lost, a repeat the fence refused may be one that stands."""
        if not leases:
            return {}
        return dict(self.db.fetch("task_outcome_stands", dict(ids=[i for i, _ in leases],
                                                               tokens=[t for _, t in leases])))

    def task_reclaim_expired(self, max_reclaims: int, limit: int = 500) -> list[ReclaimedTask]:
        """The reclaimer's unit of work: each claim it took back, with the state it left it in."""
        if self.db.distributed:
            return [ReclaimedTask(*row) for row in self.routed.reclaim_expired(max_reclaims, limit)]
        return self.db.fetch_as("task_reclaim_expired", dict(limit=limit, max_reclaims=max_reclaims,
                                                             channel=self.db.channel), ReclaimedTask)

    # -- reads
    def task_get(self, task_id: uuid.UUID | str) -> Task:
        task_id = _parse_id(task_id)
        rows = self.db.fetch_as("routed_task_get" if self.db.distributed else "task_get", {"id": task_id}, Task)
        if not rows:
            raise TaskNotFound(f"task {task_id} not found")
        return rows[0]

    def queue_kind_register(self, queue: str, kind: str) -> None:
        with self.db.connection() as conn:
            conn.execute(self.db.sql["queue_kind_register"], {"queue": queue, "kind": kind})

    def task_parents(self, task_id: uuid.UUID, limit: int = 1000) -> list[Parent]:
        """The task's parents with their state, result and last error (ctx.parents())."""
        statement = "routed_task_parents" if self.db.distributed else "task_parents"
        return [Parent(*row) for row in self.db.fetch(statement, {"id": task_id, "limit": limit})]

    def task_outcomes(self, ids: Sequence[uuid.UUID], conn: psycopg.Connection | None = None) -> list[Parent]:
        """The tasks of `ids` as parents (ctx.wait_for_tasks), on `conn` if given (a run's own
        transaction sees the children it has not committed)."""
        params = {"ids": list(ids)}
        if conn is None:
            rows = self.db.fetch("task_outcomes", params)
        else:
            with translated_errors(conn):
                rows = conn.execute(self.db.sql["task_outcomes"], params).fetchall()
        return [Parent(*row) for row in rows]

    def task_awaited_watch(self, conn: psycopg.Connection, ids: Sequence[uuid.UUID]
                           ) -> tuple[dict[uuid.UUID, str], dict[uuid.UUID, str]]:
        """task_parents_watch for tasks a run awaits (ctx.wait_for_tasks), on its transaction:
        ({id: queue}, {id: state}) of those that exist, locked to its commit."""
        if self.db.distributed:
            return _run(conn, routed_graph.watch_plan(ids, self.db.sql, self.db.schema))
        with translated_errors(conn):
            rows = conn.execute(self.db.sql["task_parents_watch"],
                                {"ids": list(ids), "channel": self.db.channel}).fetchall()
        return {i: queue for i, _, queue in rows}, {i: state for i, state, _ in rows}

    def task_relatives(self, task_id: uuid.UUID | str, limit: int = 100) -> tuple[list[uuid.UUID], list[uuid.UUID]]:
        """(parent ids, child ids) of a task, at most `limit` of each, in id order."""
        task_id = _parse_id(task_id)
        with self.db.connection() as conn:
            parents = [r[0] for r in conn.execute(self.db.sql["task_parent_ids"], {"id": task_id, "limit": limit})]
            children = [r[0] for r in conn.execute(self.db.sql["task_children"], {"id": task_id, "limit": limit})]
        return parents, children

    def task_events_list(self, task_id: uuid.UUID | str) -> list[TaskEvent]:
        return self.db.fetch_as("task_events_list", {"id": _parse_id(task_id)}, TaskEvent)

    def task_list(self, *, queue: str | None = None, state: str | None = None, kind: str | None = None,
                  created_after: dt.datetime | None = None, created_before: dt.datetime | None = None,
                  ids: Sequence[uuid.UUID] | None = None, idempotency_key: str | None = None,
                  cursor: uuid.UUID | None = None, limit: int = 50) -> list[Task]:
        """Newest first; `cursor` is the id of the last task of the previous page."""
        return self.db.fetch_as("task_list", dict(
            queue=queue, state=state, kind=kind, created_after=created_after, created_before=created_before,
            ids=_id_list(ids), idempotency_key=idempotency_key, cursor=cursor, limit=limit), Task)

    # -- operator actions
    def task_cancel(self, task_id: uuid.UUID | str, data: dict | None = None) -> str:
        task_id = _parse_id(task_id)
        if self.db.distributed:
            rows = self.routed.act("cancel", self.routed.targets([task_id]), data)
        else:
            rows = self.db.fetch("task_cancel", {"id": task_id, "data": jsonb(data)})
        if rows:
            return rows[0][1]
        state = self.task_get(task_id).state  # raises TaskNotFound
        if state in ("cancelling", "cancelled"):
            return state  # already asked: cancelling twice is not an error
        # the task finished before the request arrived
        raise TaskNotCancellable(f"task {task_id} is {state}; only queued or running tasks can be cancelled")

    def task_resume(self, task_id: uuid.UUID | str, data: dict | None = None) -> str:
        task_id = _parse_id(task_id)
        if self.db.distributed:
            rows = self.routed.act("resume", self.routed.targets([task_id]), data)
        else:
            rows = self.db.fetch("task_resume", {"id": task_id, "data": jsonb(data), "channel": self.db.channel})
        if rows:
            return rows[0][1]
        state = self.task_get(task_id).state
        if state in (FAILED, CANCELLED):  # _task_unique_free held it back
            raise TaskNotResumable(f"task {task_id} is {state}, and another task holds its unique key now: "
                                   "resume it once that one no longer blocks (finished outside its unique states)")
        raise TaskNotResumable(f"task {task_id} is {state}; only failed or cancelled tasks can be resumed")

    # -- bulk operator actions: the tasks of a filter, in batches of short transactions
    def task_cancel_many(self, task_filter: dict, limit: int, data: dict | None = None, **batching) -> int:
        """Cancel up to `limit` queued or running tasks of `task_filter` (the keyword arguments of
        task_list but cursor and limit), as task_cancel does each; returns how many changed."""
        if self.db.distributed:
            return self._routed_many("cancel", ("waiting", "queued", "running"), task_filter, limit, data, **batching)
        return self._many("task_cancel_many", {**task_filter, "data": jsonb(data)}, limit, **batching)

    def task_retry_many(self, task_filter: dict, limit: int, data: dict | None = None, **batching) -> int:
        """Resume up to `limit` failed or cancelled tasks of `task_filter`, as task_resume does each."""
        if self.db.distributed:
            return self._routed_many("resume", (FAILED, CANCELLED), task_filter, limit, data, **batching)
        return self._many("task_retry_many", {**task_filter, "data": jsonb(data), "channel": self.db.channel},
                          limit, **batching)

    def task_purge_many(self, task_filter: dict, limit: int, **batching) -> int:
        """Delete up to `limit` finished tasks of `task_filter` with their events."""
        return self._many("task_purge_many", dict(task_filter), limit, **batching)

    def _many(self, name: str, params: dict, limit: int, *, batch_size: int = 500,
              last: Callable[[Any, int], None] | None = None) -> int:
        """Run a `*_many` statement in transactions of at most `batch_size` rows until `limit` rows
        changed or a batch comes back short. `last(tx, total)` runs in the last batch's transaction,
        `tx` its store (an audit row then commits with the batch that ends the action)."""
        params = {**params, "ids": _id_list(params.get("ids"))}
        total = 0
        while True:
            size = min(batch_size, limit - total)
            with self.db.transaction() as tx:
                changed = len(tx.fetch(name, {**params, "limit": size}))
                total += changed
                # short: nothing more matches, or the rest is locked right now (a repeat gets it)
                done = changed < size or total >= limit
                if done and last is not None:
                    last(self._store_on(tx), total)
            if done:
                return total

    def _routed_many(self, action: str, states: Sequence[str], task_filter: dict, limit: int, data: dict | None,
                     *, batch_size: int = 500, last: Callable[[Any, int], None] | None = None) -> int:
        """_many on the distributed placement: each batch's tasks read with their queues, then
        cancelled or resumed a queue at a time (RoutedTasks.act); `last` in a transaction of its
        own after the last batch."""
        params = {**task_filter, "ids": _id_list(task_filter.get("ids")), "states": list(states)}
        total, after = 0, None
        while True:
            size = min(batch_size, limit - total)
            targets = self.db.fetch("routed_task_targets", {**params, "after": after, "limit": size})
            total += len(self.routed.act(action, [tuple(t) for t in targets], data))
            if len(targets) < size or total >= limit:
                break
            after = targets[-1][1]
        if last is not None:
            with self.db.transaction() as tx:
                last(self._store_on(tx), total)
        return total

    # -- pauses
    def pause_list(self) -> list[tuple[str, str, dt.datetime]]:
        """[(scope, name, since)]."""
        return self.db.fetch("pause_list", {})

    def pause_set(self, scope: str, name: str) -> None:
        with self.db.connection() as conn:
            conn.execute(self.db.sql["pause_set"], {"scope": scope, "name": name})

    def pause_clear(self, scope: str, name: str) -> None:
        self.db.fetch("pause_clear", {"scope": scope, "name": name, "channel": self.db.channel})

    # -- retention and the queue reads
    def task_delete_finished(self, state: str, older_than_seconds: float, limit: int = 500) -> int:
        """One retention batch: finished tasks (and their events) older than the retention."""
        if self.db.distributed:
            return self.routed.delete_finished(state, older_than_seconds, limit)
        return len(self.db.fetch("task_delete_finished", dict(state=state, older_than=older_than_seconds,
                                                              limit=limit)))

    def queue_task_counts(self) -> list[tuple[str, str, int]]:
        """[(queue, state, tasks)]."""
        return self.db.fetch("queue_task_counts", {})

    def queue_suspended_counts(self) -> list[tuple[str, str, int]]:
        """[(queue, reason, tasks)]: suspended tasks (sleep, signal, tasks)."""
        return self.db.fetch("queue_suspended_counts", {})

    def queue_claimable(self, paused_kinds: Sequence[str] = ()) -> list[tuple[str, int, float | None, bool, int]]:
        """[(queue, claimable now, oldest pending age s, paused, throttled)]; tasks of
        `paused_kinds` are not claimable (queue_claimable_without_kinds); throttled: held back
        by a limit (parked)."""
        if paused_kinds:
            return self.db.fetch("queue_claimable_without_kinds", {"paused_kinds": list(paused_kinds)})
        return self.db.fetch("queue_claimable", {})

    def task_event_throughput(self, minutes: int) -> tuple[dt.datetime, list[tuple[str, dt.datetime, int, int]]]:
        """(the window's first minute, [(queue, minute, completed, failed)]) over the last `minutes`
        whole minutes, the current one included; minutes without an outcome have no row."""
        with self.db.connection() as conn:
            since = conn.execute(self.db.sql["task_event_throughput_since"], {"minutes": minutes}).fetchone()[0]
            statement = "routed_task_event_throughput" if self.db.distributed else "task_event_throughput"
            rows = conn.execute(self.db.sql[statement], {"since": since}).fetchall()
        return since, rows

    # -- the names a submission brings (api/names.py decides how many may exist)
    def queue_kind_new(self, queues: Sequence[str], kinds: Sequence[str]) -> list[tuple[str, str]]:
        """[(scope 'queue' or 'kind', name)] of those no task has had."""
        return self.db.fetch("queue_kind_new", {"queues": list(queues), "kinds": list(kinds)})

    def queue_kind_list(self) -> list[tuple[str, str]]:
        """[(queue, kind)] of every pair a task has had, by kind."""
        return [tuple(row) for row in self.db.fetch("queue_kind_list", {})]

    def queue_kind_lock(self) -> None:
        self.db.fetch("queue_kind_lock", {})

    def queue_kind_count(self) -> tuple[int, int]:
        """(queues, kinds) that exist."""
        return tuple(self.db.fetch("queue_kind_count", {})[0])
