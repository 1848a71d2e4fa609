"""The task lifecycle on the distributed placement (Citus; engine/migrate.py, distribute): the statements of
engine/sql/routed.sql, one queue at a time. TaskStore and the enqueue's plans call these when the
database says its tasks are distributed (Database.distributed); on one Postgres nothing here runs.

A worker of several queues claims each in turn, in the order it lists them, until its free slots
are taken: priority orders the tasks within a queue, not across queues. Claim lanes and limits
do not apply here (docs/SCALING.md).

A worker node that does not answer stops its own queues only: a queue whose statement fails is
left out of that claim, its outcomes are reported busy (written again later) and its heartbeats
too (not lost: renewed once the node is back), while the other nodes' queues go on. Each queue's
failure is logged when it starts and when it ends (NodeFailures).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
import uuid
from contextlib import nullcontext
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from ..errors import InvalidInput
from ..ids import TaskId, existing_id, uuid7
from ..model import BUSY, Claim, ClaimedTask, Settlement, TaskSpec
from .connection import jsonb
from .database import Database
from .plans import Plan, _Idle, _Query, _RawJson, _unit
from . import routed_graph
from .routed_graph import Transition
from .unique_inserts import keyed_plan
from .plans import columns as _columns

log = logging.getLogger("skiplock.store")

# how long the reclaim, the retention and the wake-up reuse their grouping of queues by node
QUEUE_GROUPS_SECONDS = 5.0

def _event_type(state: str, outcome: str) -> str:
    """The event a settle's transition writes (as task_settle's settle_events names it)."""
    if outcome == "suspend" and state in ("queued", "waiting"):
        return "suspended"
    if state != "queued":
        return state
    return {"retry": "retrying", "step": "checkpoint"}.get(outcome, "released")


def _settle_event(row: tuple, settlement: Settlement) -> dict:
    """The event of one settle's transition, its data as task_settle's settle_events builds it (a
    suspension's from its settlement)."""
    task_id, state, seq, token, attempt, outcome, error, delay, traceback = row[:9]
    data = None
    if error is not None or outcome != "completed":
        suspension = outcome == "suspend"
        data = {k: v for k, v in (("outcome", outcome), ("error", error), ("traceback", traceback),
                                  ("delay", delay if state == "queued" else None),
                                  ("suspended", settlement.suspended), ("wake_at", settlement.wake_at),
                                  ("signal", settlement.awaited_signal),
                                  ("waiting", state == "waiting" if suspension else None)) if v is not None}
    return {"id": task_id.hex, "seq": seq, "type": _event_type(state, outcome), "lease_token": token,
            "attempt": attempt, "data": data}


def outbox_params(queues: Sequence[str], events: Sequence[tuple[uuid.UUID, int]]) -> dict:
    return {"queues": list(queues), "ids": [task_id for task_id, _ in events], "seqs": [seq for _, seq in events]}


def _by_queue(items: Iterable, queue_of) -> dict[str, list]:
    grouped: dict[str, list] = {}
    for item in items:
        grouped.setdefault(queue_of(item), []).append(item)
    return grouped


class NodeFailures:
    """The queues whose statements fail (their worker node does not answer, say), shared by the
    claimer, the writer and the keeper threads: one log line when a queue starts failing, one when
    it answers again."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._failing: set[str] = set()

    def failed(self, queue: str, exc: Exception) -> None:
        with self._lock:
            new = queue not in self._failing
            self._failing.add(queue)
        if new:
            log.warning("a queue's node does not answer: its tasks wait, the other queues go on",
                        extra={"queue": queue, "error": " ".join(str(exc).split())[:300]})

    def answered(self, queue: str) -> None:
        if queue not in self._failing:  # the common case, without the lock
            return
        with self._lock:
            back = queue in self._failing
            self._failing.discard(queue)
        if back:
            log.warning("a queue's node answers again", extra={"queue": queue})

    def all_failed(self, queues: Iterable[str]) -> bool:
        with self._lock:
            return all(q in self._failing for q in queues)


class RoutedTasks:
    """The worker's and the reclaim's statements, each run on one queue's shard."""

    def __init__(self, db: Database):
        self.db = db
        self.failures = NodeFailures()
        self._groups: tuple[float, dict] = (float("-inf"), {})  # (read at, _queue_groups's answer)

    def claim(self, queues: Sequence[str], limit: int, owner: str, lease_seconds: float,
              kind_max_attempts: Mapping[str, int] | None) -> Claim:
        claimed: list[ClaimedTask] = []
        error: psycopg.Error | None = None
        with self.db.connection(pool=self.db.claim_pool) as conn:
            for queue in queues:
                if len(claimed) >= limit:
                    break
                try:
                    rows = self._claim_one(conn, queue, limit - len(claimed), owner, lease_seconds, kind_max_attempts)
                except psycopg.Error as exc:
                    if conn.closed:  # the coordinator itself is gone: the worker's outage, not a node's
                        raise
                    self.failures.failed(queue, exc)
                    error = exc
                    continue
                self.failures.answered(queue)
                claimed.extend(rows)
            if error is not None and not claimed and self.failures.all_failed(queues):
                raise error  # every queue's node is away: the worker's claim loop backs off
        return Claim(claimed)

    def _claim_one(self, conn, queue: str, limit: int, owner: str, lease_seconds: float,
                   kind_max_attempts: Mapping[str, int] | None) -> list[ClaimedTask]:
        with conn.transaction():
            found = conn.execute(self.db.sql["routed_task_claim"], dict(
                queue=queue, limit=limit, owner=owner, lease_seconds=lease_seconds,
                kind_max_attempts=jsonb(kind_max_attempts))).fetchall()
            rows = [ClaimedTask(*row[:-1]) for row in found]  # the columns of ClaimedTask, in order
            if rows:
                written = conn.execute(self.db.sql["routed_task_claim_events"],
                                       dict(queue=queue, owner=owner, ids=[r.id for r in rows])).fetchall()
                if found[0][-1]:  # an endpoint is enabled
                    self._outbox(conn, queue, written)
        return rows

    def _outbox(self, conn, queue: str, events: Sequence[tuple[uuid.UUID, int]]) -> None:
        """The webhook deliveries of the events (task id, seq) just written, in their transaction."""
        conn.execute(self.db.sql["routed_outbox"], outbox_params([queue], events))

    def heartbeat(self, leases: Sequence[tuple[uuid.UUID, int, str]], lease_seconds: float) -> dict[uuid.UUID, str]:
        held: dict[uuid.UUID, str] = {}
        with self.db.connection() as conn:
            for queue, group in _by_queue(leases, lambda lease: lease[2]).items():
                try:
                    with conn.transaction():
                        rows = conn.execute(self.db.sql["routed_task_heartbeat"], dict(
                            queue=queue, ids=[i for i, _, _ in group], tokens=[t for _, t, _ in group],
                            lease_seconds=lease_seconds)).fetchall()
                except psycopg.Error as exc:
                    if conn.closed:
                        raise
                    self.failures.failed(queue, exc)
                    rows = [(task_id, BUSY) for task_id, _, _ in group]  # not renewed, not lost
                else:
                    self.failures.answered(queue)
                held.update(rows)
        return held

    def settle(self, settlements: Sequence[Settlement], params_of, conn=None) -> dict[uuid.UUID, str]:
        """Each queue's outcomes in a transaction of their own (a savepoint of `conn`'s, the
        handler's own transaction, when given): the transitions, then their events."""
        applied: dict[uuid.UUID, str] = {}
        lent = nullcontext(conn) if conn is not None else self.db.connection(pool=self.db.outcome_pool)
        with lent as conn:
            by_id = {s.task_id: s for s in settlements}
            for queue, group in _by_queue(settlements, lambda s: s.queue).items():
                if queue is None:
                    raise InvalidInput("a settlement on the distributed placement names its task's queue")
                try:
                    with conn.transaction():
                        [(now, outbox)] = conn.execute(self.db.sql["routed_now"]).fetchall()
                        rows = conn.execute(self.db.sql["routed_task_settle"],
                                            dict(params_of(group), queue=queue, now=now)).fetchall()
                        if rows:
                            events = [_settle_event(r, by_id[r[0]]) for r in rows]
                            written(conn, self.db, queue, now, outbox, events, woken=False,
                                    transitions=[Transition(r[0], queue, r[9], r[1], r[10]) for r in rows])
                except psycopg.Error as exc:
                    if conn.closed or len(_by_queue(settlements, lambda s: s.queue)) == 1:
                        raise  # the caller's own retry, as on one Postgres
                    self.failures.failed(queue, exc)
                    rows = [(s.task_id, BUSY) for s in group]  # written again by the caller
                else:
                    self.failures.answered(queue)
                applied.update((r[0], r[1]) for r in rows)
        return applied

    def reclaim_expired(self, max_reclaims: int, limit: int) -> list[tuple]:
        """Each queue with expired claims, in a transaction of its own; the wake-up on the
        coordinator. Rows as task_reclaim_expired's: (id, queue, state, kind, attempts, error)."""
        reclaimed: list[tuple] = []
        with self.db.connection() as conn:
            for queue in self._queues_with(conn, "routed_expired_queues", {}):
                try:
                    with conn.transaction():
                        [(now, outbox)] = conn.execute(self.db.sql["routed_now"]).fetchall()
                        rows = conn.execute(self.db.sql["routed_task_reclaim_expired"], dict(
                            queue=queue, now=now, limit=limit, max_reclaims=max_reclaims)).fetchall()
                        if rows:
                            events = [{"id": r[0].hex, "seq": r[4], "type": "reclaimed" if r[2] == "queued" else r[2],
                                       "lease_token": r[5], "attempt": r[6],
                                       "data": {"reason": "lease expired", "reclaims": r[7], "error": r[8]}}
                                      for r in rows]
                            written(conn, self.db, queue, now, outbox, events,
                                    woken=any(r[2] == "queued" for r in rows),
                                    transitions=[Transition(r[0], queue, r[9], r[2], r[10]) for r in rows])
                except psycopg.Error as exc:
                    if conn.closed:
                        raise
                    self.failures.failed(queue, exc)  # reclaimed once its node answers
                    continue
                reclaimed.extend((r[0], r[1], r[2], r[3], r[6], r[8]) for r in rows)
        return reclaimed

    def _queue_groups(self, conn) -> dict:
        """{node group: [(queue, group)]} of every queue tasks were enqueued into, read again once
        it is QUEUE_GROUPS_SECONDS old: the wake-up asks every half second, and a queue new since
        is found by the next read (a stale grouping only groups a moved queue with its old node)."""
        at, groups = self._groups
        if time.monotonic() - at > QUEUE_GROUPS_SECONDS:
            known = [q for (q,) in conn.execute(self.db.sql["routed_queues"]).fetchall()]
            groups = _by_queue(conn.execute(self.db.sql["routed_queue_groups"], {"queues": known}).fetchall(),
                               lambda row: row[1])
            self._groups = (time.monotonic(), groups)  # one tuple: a reader sees the old or the new
        return groups

    def _queues_with(self, conn, statement: str, params: dict) -> list[str]:
        """The queues that `statement` (a read of routed.sql naming `queues`) finds work in, asked
        of each worker node for the queues it holds: a node that does not answer leaves its queues
        out (the failure logged once per queue), the other nodes' are found. One read of every
        shard would fail whole while any node is away."""
        found: list[str] = []
        groups = self._queue_groups(conn)
        for group in sorted(groups, key=lambda g: (g is None, g)):
            queues = [queue for queue, _ in groups[group]]
            try:
                with conn.transaction():
                    found += [q for (q,) in conn.execute(self.db.sql[statement], {**params, "queues": queues})]
            except psycopg.Error as exc:
                if conn.closed:
                    raise
                for queue in queues:
                    self.failures.failed(queue, exc)
            else:
                for queue in queues:
                    self.failures.answered(queue)
        return found

    # -- operator actions: cancel and resume, each queue's tasks in a transaction of its own
    def act(self, action: str, targets: Sequence[tuple[str, uuid.UUID]], data: Any = None
            ) -> list[tuple[uuid.UUID, str]]:
        """Cancel ("cancel") or resume ("resume") the tasks of `targets` [(queue, id)], as
        task_cancel and task_resume do on one Postgres: each changed task's event, the wake-up of
        its queue, the walk to its dependents. [(id, the state it took)] of those that changed."""
        changed: list[tuple[uuid.UUID, str]] = []
        with self.db.connection() as conn:
            for queue, group in _by_queue(targets, lambda target: target[0]).items():
                with conn.transaction():
                    [(now, outbox)] = conn.execute(self.db.sql["routed_now"]).fetchall()
                    rows = conn.execute(self.db.sql[f"routed_task_{action}"], dict(
                        queue=queue, ids=sorted(task_id for _, task_id in group), now=now)).fetchall()
                    if not rows:
                        continue
                    if action == "cancel":
                        events = [{"id": r[0].hex, "seq": r[3], "type": r[2], "lease_token": r[5], "attempt": r[6],
                                   "data": data} for r in rows]
                    else:
                        events = [{"id": r[0].hex, "seq": r[3], "type": "resumed", "attempt": 0, "data": data}
                                  for r in rows]
                    written(conn, self.db, queue, now, outbox, events,
                            woken=any(r[2] == "queued" for r in rows),
                            transitions=[Transition(r[0], queue, r[1], r[2], r[4]) for r in rows])
                changed.extend((r[0], r[2]) for r in rows)
        return changed

    def targets(self, ids: Sequence[uuid.UUID]) -> list[tuple[str, uuid.UUID]]:
        """[(queue, id)] of the tasks of `ids` that exist."""
        rows = self.db.fetch("routed_task_queues", {"ids": list(ids)})
        return [(queue, task_id) for task_id, queue in rows]

    def delete_finished(self, state: str, older_than_seconds: float, limit: int) -> int:
        """Retention, one queue after another until `limit` tasks are deleted."""
        deleted = 0
        with self.db.connection() as conn:
            [(now, _)] = conn.execute(self.db.sql["routed_now"]).fetchall()
            before = now - dt.timedelta(seconds=older_than_seconds)
            for queue in self._queues_with(conn, "routed_finished_queues", dict(state=state, before=before)):
                if deleted >= limit:
                    break
                try:
                    deleted += len(conn.execute(self.db.sql["routed_task_delete_finished"], dict(
                        queue=queue, state=state, before=before, now=now, limit=limit - deleted)).fetchall())
                except psycopg.Error as exc:
                    if conn.closed:
                        raise
                    self.failures.failed(queue, exc)
        return deleted

    def wake_due(self, limit: int) -> int:
        """task_wake_due on this placement: each queue with a suspended task whose time came, in a
        transaction of its own; how many were queued."""
        woken = 0
        with self.db.connection() as conn:
            for queue in self._queues_with(conn, "routed_wake_due_queues", {}):
                if woken >= limit:
                    break
                try:
                    with conn.transaction():
                        [(now, outbox)] = conn.execute(self.db.sql["routed_now"]).fetchall()
                        rows = conn.execute(self.db.sql["routed_task_wake_due"],
                                            dict(queue=queue, now=now, limit=limit - woken)).fetchall()
                        if rows:
                            written(conn, self.db, queue, now, outbox, [
                                {"id": task_id.hex, "seq": seq, "type": "queued", "attempt": attempts,
                                 "data": {"reason": "signal wait timed out" if suspended == "signal"
                                          else "sleep ended"}}
                                for task_id, seq, attempts, suspended in rows], woken=True)
                except psycopg.Error as exc:
                    if conn.closed:
                        raise
                    self.failures.failed(queue, exc)
                    continue
                woken += len(rows)
        return woken


def written(conn, db: Database, queue: str, now, outbox: bool, events: list[dict], *, woken: bool,
            transitions: Sequence[Transition] = ()) -> None:
    """What follows one queue's transitions in their transaction: their events, the outbox
    (`outbox`: an endpoint is enabled), the queue's wake-up (`woken`: a task was queued) and the
    walk to the dependents of the tasks that changed."""
    conn.execute(db.sql["routed_task_events"], dict(queue=queue, events=Jsonb(events)))
    if outbox:
        conn.execute(db.sql["routed_outbox"], outbox_params([queue], [(uuid.UUID(e["id"]), e["seq"]) for e in events]))
    if woken:
        conn.execute(db.sql["routed_wake"], dict(channel=db.channel, queues=[queue]))
    if transitions:
        routed_graph.walk(conn, db.sql, db.schema, now, outbox, transitions)


def insert_plan(specs: Sequence[TaskSpec], sql: Mapping[str, str], schema: str, database: tuple) -> Plan:
    """_insert_plan on the distributed placement: plain tasks, idempotency keys, unique windows and
    debounce keys (each unique within its queue), dependencies (routed_graph.py); the new tasks'
    first events, outbox and wake-up written by the plan's own statements. `database`: (host,
    port, name) of the connection, for the pairs of queue_kinds known there."""
    if not specs:
        return []
    # several statements: a transaction of their own on an idle autocommit connection; in the
    # caller's transaction a savepoint where one Postgres takes one too (dependencies and unique
    # windows), none for plain tasks, as the one-statement insert there (the API tells a task it
    # inserted by the row's xmin, its own transaction's id)
    if (yield _Idle()):
        # queue_kinds first, committed on its own: a write of that reference table commits on
        # every node (two-phase), and the task's own transaction then commits on its node alone
        yield from _registered(specs, sql, schema, database, committed=True)
        return (yield from _unit(_routed_insert(specs, sql, schema), one_statement=False))
    yield from _registered(specs, sql, schema, database, committed=False)
    if any(s.depends_on or s.unique is not None or s.debounce is not None for s in specs):
        return (yield from _unit(_routed_insert(specs, sql, schema), one_statement=False))
    return (yield from _routed_insert(specs, sql, schema))


def _registered(specs: Sequence[TaskSpec], sql: Mapping[str, str], schema: str, database: tuple, *,
                committed: bool) -> Plan:
    """The (queue, kind) pairs of `specs` in queue_kinds, written unless found committed before;
    `committed`: the statement is a transaction of its own (what it writes is committed too)."""
    pairs = sorted(p for p in {(s.queue, s.kind) for s in specs} if (*database, schema, *p) not in _KNOWN_PAIRS)
    if pairs:
        added = yield _Query(sql["routed_queue_kinds"], {"queues": [q for q, _ in pairs],
                                                         "kinds": [k for _, k in pairs]})
        if len(_KNOWN_PAIRS) < _KNOWN_PAIRS_BOUND:
            known = set(pairs) if committed else set(pairs) - set(map(tuple, added))
            _KNOWN_PAIRS.update((*database, schema, *pair) for pair in known)


# (host, port, database, schema, queue, kind) seen committed in queue_kinds: rows there are never
# deleted, so an enqueue of a known pair writes nothing there (a set's add and test are atomic)
_KNOWN_PAIRS: set[tuple] = set()
_KNOWN_PAIRS_BOUND = 100_000  # past it, unknown pairs are written (and found there) every time


def _routed_insert(specs: Sequence[TaskSpec], sql: Mapping[str, str], schema: str) -> Plan:
    ids = uuid7.many(len(specs), TaskId)
    single = len(specs) == 1 and not specs[0].depends_on and specs[0].unique is None and specs[0].debounce is None
    [(now, outbox)] = yield _Query(sql["routed_now"], {})
    if single:
        return (yield from _insert_one(specs[0], ids, sql, schema, now, outbox))
    if any(s.depends_on for s in specs):
        inserted = yield from routed_graph.dependent_plan(specs, ids, sql, schema, now)
        new = {task_id for task_id, _, _, _ in inserted}
        yield from _after_insert(sql, schema, [(task_id, queue) for task_id, queue, _, _ in inserted],
                                 due={q for _, q, run_after, state in inserted
                                      if state == "queued" and run_after <= now},
                                 outbox=outbox)
        return (yield from _keyed_owners(specs, ids, new, sql))
    if any(s.unique is not None or s.debounce is not None for s in specs):
        # the one-Postgres statements of unique windows run here as they are: their index holds the
        # queue (placement.sql), and Citus routes what the insert's rows name
        out = yield from keyed_plan(specs, ids, sql)
        yield from _after_insert(sql, schema, [(out[i], s.queue) for i, s in enumerate(specs)
                                               if getattr(out[i], "created", True)], due=None, outbox=outbox)
        return out
    inserted = (yield _Query(sql["routed_task_insert"], dict(_columns(specs, ids), now=now)))
    new = {task_id for task_id, _, _ in inserted}
    yield from _after_insert(sql, schema, [(task_id, queue) for task_id, queue, _ in inserted],
                             due={q for _, q, run_after in inserted if run_after <= now}, outbox=outbox)
    return (yield from _keyed_owners(specs, ids, new, sql))


def _insert_one(s: TaskSpec, ids: list, sql: Mapping[str, str], schema: str, now, outbox: bool) -> Plan:
    """One plain task: its row and its event, each an INSERT ... VALUES sent to its queue's node."""
    run_after = s.run_at if s.run_at is not None else now + dt.timedelta(seconds=s.delay or 0)
    inserted = yield _Query(sql["routed_task_insert_one"], dict(
        id=ids[0], kind=s.kind, queue=s.queue, priority=s.priority, payload=_RawJson(s.payload_json),
        max_attempts=s.max_attempts, run_after=run_after, idempotency_key=s.idempotency_key,
        concurrency_key=s.concurrency_key, trace_context=jsonb(s.trace_context)))
    if inserted:
        yield _Query(sql["routed_task_inserted_event"], {"queue": s.queue, "id": ids[0]})
        if outbox:
            yield _Query(sql["routed_outbox"], outbox_params([s.queue], [(ids[0], 1)]))
        if run_after <= now:
            yield _Query(sql["routed_wake"], {"channel": f"skiplock_{schema}", "queues": [s.queue]})
    return (yield from _keyed_owners([s], ids, {row[0] for row in inserted}, sql))


def _keyed_owners(specs: Sequence[TaskSpec], ids: list, new: set, sql: Mapping[str, str]) -> Plan:
    """`ids` with each spec whose idempotency key was taken (not in `new`) given the key's owner."""
    keyed = [i for i, s in enumerate(specs) if s.idempotency_key is not None and ids[i] not in new]
    if keyed:
        found = {(q, k): i for q, k, i in (yield _Query(sql["routed_task_ids_by_idempotency_key"], {
            "queues": sorted({specs[i].queue for i in keyed}),
            "keys": sorted({specs[i].idempotency_key for i in keyed})}))}
        for i in keyed:
            owner = found.get((specs[i].queue, specs[i].idempotency_key))
            if owner is None:  # a key taken twice in this call: the first of them was inserted
                owner = next(ids[j] for j in range(i) if ids[j] in new and specs[j].queue == specs[i].queue
                             and specs[j].idempotency_key == specs[i].idempotency_key)
            ids[i] = existing_id(owner)
    return ids


def _after_insert(sql: Mapping[str, str], schema: str, new: Sequence[tuple[uuid.UUID, str]],
                  due: set[str] | None, outbox: bool) -> Plan:
    """What the tasks_inserted trigger does on one Postgres, for the tasks (id, queue) just
    inserted: their first events, their webhook deliveries (`outbox`: an endpoint is enabled), and
    the wake-up of the queues with a task due now (`due`; None: every queue of them)."""
    if not new:
        return
    queues = sorted({queue for _, queue in new})
    ids = sorted(task_id for task_id, _ in new)
    yield _Query(sql["routed_task_inserted_events"], {"queues": queues, "ids": ids})
    if outbox:
        yield _Query(sql["routed_outbox"], outbox_params(queues, [(task_id, 1) for task_id in ids]))
    wake = queues if due is None else sorted(due)
    if wake:
        yield _Query(sql["routed_wake"], {"channel": f"skiplock_{schema}", "queues": wake})


def specs_of(template: TaskSpec, payloads: Sequence[Any]) -> list[TaskSpec]:
    """enqueue_many's template and payloads as one spec each (the placement writes no COPY)."""
    return [TaskSpec(template.kind, payload, queue=template.queue, priority=template.priority,
                     max_attempts=template.max_attempts, max_payload_bytes=template.max_payload_bytes,
                     concurrency_key=template.concurrency_key) for payload in payloads]


