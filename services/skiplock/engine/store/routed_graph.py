"""Dependencies on the distributed placement (Citus; engine/migrate.py, distribute): what the
tasks_watched trigger and its walk (migration 0019) do on one Postgres, done by the store in the
transaction of the change that sets it off. A parent and its dependents may live in different
queues, so on different worker nodes: the walk reads a parent's edges on the parent's shard and
updates each queue's dependents with one statement routed to theirs; Citus commits the
transaction on every node it touched at once (two-phase commit), so a parent's outcome and its
dependents' counters are written together, as on one Postgres.

Every routed transition of a task (a worker's outcome, a reclaim, a cancel, a resume) hands its
rows to `walk`; a task that is not watched (no dependents, no skiplock.wait()) costs nothing.
"""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import psycopg
from psycopg.types.json import Jsonb

from ..errors import InvalidInput
from ..model import CANCELLED, FAILED, FINISHED_STATES, QUEUED, TaskSpec
from .plans import Plan, _Query, dependent_columns
from .plans import columns as _columns


class Transition(NamedTuple):
    """A task's change of state, as a routed statement returns it."""
    id: uuid.UUID
    queue: str
    old_state: str
    new_state: str
    watched: bool


def walk(conn: psycopg.Connection, sql: Mapping[str, str], schema: str, now, outbox: bool,
         transitions: Sequence[Transition]) -> None:
    """Carry `transitions` to the dependents of the tasks that changed, breadth first, as the
    trigger's walk does: a parent that became final takes one off each dependent's count of
    parents not final (and counts itself failed if it failed or was cancelled); one resumed puts
    them back. Dependents that change state get their event, their queue's wake-up, and are walked
    in turn; skiplock.wait() hears of each watched task that ended."""
    todo = deque(t for t in transitions if t.watched and _final(t.old_state) != _final(t.new_state))
    finished = [t.id for t in todo if _final(t.new_state)]
    woken: set[str] = set()
    while todo:
        parent = todo.popleft()
        ended = _final(parent.new_state)
        if ended:
            waiting_delta, failed_delta = -1, int(parent.new_state in (FAILED, CANCELLED))
        else:  # resumed: not final again
            waiting_delta, failed_delta = 1, -int(parent.old_state in (FAILED, CANCELLED))
        edges = conn.execute(sql["routed_task_dependents"], {"queue": parent.queue, "id": parent.id}).fetchall()
        for queue in sorted({q for q, _ in edges}):
            rows = conn.execute(sql["routed_dependents_update"], dict(
                queue=queue, ids=[task_id for q, task_id in edges if q == queue], now=now,
                waiting_delta=waiting_delta, failed_delta=failed_delta,
                error=f"parent {parent.id} ended {parent.new_state}")).fetchall()
            changed = [Transition(task_id, queue, old, new, watched)
                       for task_id, old, new, _, watched in rows if old != new]
            if not changed:
                continue
            seqs = {task_id: seq for task_id, _, _, seq, _ in rows}
            data = {"reason": "parent ended" if ended else "parent resumed", "parent": str(parent.id),
                    "parent_state": parent.new_state}
            conn.execute(sql["routed_task_events"], dict(queue=queue, events=Jsonb([
                {"id": t.id.hex, "seq": seqs[t.id], "type": t.new_state, "data": data} for t in changed])))
            if outbox:
                conn.execute(sql["routed_outbox"], dict(queues=[queue], ids=[t.id for t in changed],
                                                        seqs=[seqs[t.id] for t in changed]))
            if any(t.new_state == QUEUED for t in changed):
                woken.add(queue)
            for t in changed:  # a dependent queued from waiting changes nothing below it
                if t.watched and _final(t.old_state) != _final(t.new_state):
                    todo.append(t)
                    if _final(t.new_state):
                        finished.append(t.id)
    if woken:
        conn.execute(sql["routed_wake"], {"channel": f"skiplock_{schema}", "queues": sorted(woken)})
    if finished:
        conn.execute(sql["routed_finished_notify"], {"channel": f"skiplock_{schema}_finished", "ids": finished})


def _final(state: str) -> bool:
    return state in FINISHED_STATES


def watch_plan(ids: Sequence[uuid.UUID], sql: Mapping[str, str], schema: str) -> Plan:
    """task_parents_watch on this placement, for parents (depends_on) or awaited tasks
    (ctx.wait_for_tasks): their queues read first, then each queue's tasks locked and marked
    watched on their shard (queues in order, ids in order within one: two enqueues of shared
    parents lock them in one order). Returns ({id: queue}, {id: state}) of those that exist."""
    ids = sorted(set(ids))
    queue_of = dict((yield _Query(sql["routed_task_queues"], {"ids": ids})))
    states: dict[uuid.UUID, str] = {}
    for queue in sorted(set(queue_of.values())):
        states.update((yield _Query(sql["routed_task_parents_watch"], {
            "queue": queue, "ids": [i for i in ids if queue_of.get(i) == queue]})))
    # a claim that skipped a queued task while it was locked here looks again at the commit
    skipped = sorted({queue_of[i] for i in states if states[i] == QUEUED})
    if skipped:
        yield _Query(sql["routed_wake"], {"channel": f"skiplock_{schema}", "queues": skipped})
    return {i: queue_of[i] for i in states}, states


def dependent_plan(specs: Sequence[TaskSpec], ids: list[uuid.UUID], sql: Mapping[str, str], schema: str,
                   now) -> Plan:
    """_dependent_plan (task_inserts.py) on this placement: the parents' queues read first, then
    each queue's parents locked and marked watched (queues in order, ids in order within one: two
    enqueues of shared parents lock them in one order), the tasks inserted with their first
    states, then their edges on their parents' shards. Yields the inserted rows (id, queue,
    run_after, state) to the caller, which writes their events; returns them."""
    parents = sorted({p for s in specs for p in s.depends_on})
    queue_of, states = yield from watch_plan(parents, sql, schema)
    missing = [p for p in parents if p not in states]
    if missing:
        raise InvalidInput(f"depends_on: no task {missing[0]} (in schema {schema})")
    inserted = yield _Query(sql["routed_task_insert_dependent"], dict(
        _columns(specs, ids), now=now, **dependent_columns(specs, states)))
    new = {row[0] for row in inserted}
    edges = [(queue_of[p], p, s.queue, i) for s, i in zip(specs, ids) if i in new for p in s.depends_on]
    if edges:
        yield _Query(sql["routed_task_dependencies_insert"], {
            "parent_queues": [e[0] for e in edges], "parent_ids": [e[1] for e in edges],
            "queues": [e[2] for e in edges], "task_ids": [e[3] for e in edges]})
    return inserted

