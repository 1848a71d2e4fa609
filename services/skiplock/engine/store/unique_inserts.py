"""The inserts that may turn into an existing task: enqueues with a unique key (a unique window)
or a debounce key (engine/enqueue_options.py; statements in engine/sql/unique.sql).

Both are race-free because an index decides, never a read: tasks_unique admits one blocking task
per key, tasks_debounce one not-yet-started queued task per (kind, queue, key) (migration 0021).
An INSERT that meets a taken key waits for its holder's transaction: if it rolls back, the insert
goes ahead; if it commits, the insert does nothing (unique) or updates the holder (debounce), and
a unique enqueue reads the holder's id in a new statement, whose snapshot sees it. (Oban's
open-source unique jobs read first and then insert under an advisory lock, so an uncommitted
holder that later rolls back leaves no job at all: oban-bg/oban#1087, #1093.)

A plain enqueue never comes here (task_inserts._insert_plan), so it runs the statements it ran
before these options existed.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from ..errors import InvalidInput
from ..ids import existing_id
from ..model import TaskSpec
from .connection import jsonb
from .plans import Plan, _Query, _RawJson, columns


def keyed_plan(specs: Sequence[TaskSpec], ids: list[uuid.UUID], sql) -> Plan:
    """Tasks of which some are unique or debounced, with the plain ones of the same batch; one id
    per spec, in order, an existing task's (created False) where a key was taken. Run inside a
    unit (task_inserts._unit): the lookups and the retries belong to one transaction."""
    if any(s.depends_on for s in specs):
        raise InvalidInput("a batch with depends_on cannot also hold unique or debounced tasks")
    out = list(ids)
    rest = [i for i, s in enumerate(specs) if s.debounce is None]
    if rest:
        found = yield from _unique_plan([specs[i] for i in rest], [ids[i] for i in rest], sql)
        for i, task_id in zip(rest, found):
            out[i] = task_id
    for i, s in enumerate(specs):
        if s.debounce is not None:  # one statement each: later enqueues of a key merge into earlier ones
            out[i] = yield from _debounced_plan(s, ids[i], sql)
    return out


def _unique_plan(specs: Sequence[TaskSpec], ids: list[uuid.UUID], sql) -> Plan:
    params = columns(specs, ids)
    params.update(unique_digests=[s.unique.digest(s.kind, s.queue, s.payload) if s.unique else None for s in specs],
                  unique_periods=[s.unique.period if s.unique else None for s in specs],
                  unique_states=[s.unique.state_list() if s.unique else None for s in specs])
    rows = {task_id: (key, inserted) for task_id, key, inserted in (yield _Query(sql["task_insert_unique"], params))}
    out = list(ids)
    refused = [i for i in range(len(specs)) if not rows[ids[i]][1]]
    if not refused:
        return out
    # a holder committed before our INSERT (ON CONFLICT waited for it): this new statement sees it
    keyed = [i for i in refused if specs[i].idempotency_key is not None]
    owners: dict[str, uuid.UUID] = {}
    if keyed:
        owners = dict((yield _Query(sql["task_ids_by_idempotency_key"],
                                    {"keys": list({specs[i].idempotency_key for i in keyed})})))
    unresolved = [i for i in refused if owners.get(specs[i].idempotency_key) is None]
    holders: dict[str, uuid.UUID] = {}
    unique = [rows[ids[i]][0] for i in unresolved if rows[ids[i]][0] is not None]
    if unique:
        holders = dict((yield _Query(sql["task_ids_by_unique_key"], {"keys": list(set(unique))})))
    orphans = []
    for i in refused:
        owner = owners.get(specs[i].idempotency_key) or holders.get(rows[ids[i]][0])
        if owner is None:
            orphans.append(i)
        else:  # another transaction's task, or an earlier one of this batch
            out[i] = existing_id(owner)
    if orphans:
        # the holder left its blocking states (or retention deleted it) between our INSERT and the
        # lookup: the key is free again, so these are inserted once more
        again = yield from _unique_plan([specs[i] for i in orphans], [ids[i] for i in orphans], sql)
        for i, task_id in zip(orphans, again):
            out[i] = task_id
    return out


def _debounced_plan(s: TaskSpec, task_id: uuid.UUID, sql) -> Plan:
    d = s.debounce
    [(stored,)] = yield _Query(sql["task_insert_debounced"], dict(
        id=task_id, kind=s.kind, queue=s.queue, priority=s.priority, payload=_RawJson(s.payload_json),
        max_attempts=s.max_attempts, concurrency_key=s.concurrency_key, trace_context=jsonb(s.trace_context),
        debounce_key=d.key, delay=d.delay, max_wait=d.max_wait))
    return task_id if stored == task_id else existing_id(stored)
