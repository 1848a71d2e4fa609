-- The task lifecycle on the distributed placement (placement.sql; engine/store/routed.py runs
-- these). Each statement that writes names one queue, so Citus sends it whole to the worker node
-- holding that queue's shard, where FOR UPDATE SKIP LOCKED works as on one Postgres. Where the
-- statements of tasks.sql differ, it is for what Citus refuses (docs/SCALING.md, "What ran on
-- Citus"):
--   - a transition's event is written by a second statement of the same transaction (an INSERT
--     fed by the UPDATE's RETURNING in one statement becomes several distributed subplans);
--   - rows are found by (queue, id), never by ctid;
--   - now() is never inside CASE or COALESCE: the transaction's time comes as %(now)s (now() is
--     the transaction's start, so it is the same value), and a time plus seconds is
--     seconds_after() (placement.sql);
--   - the lease token is a counter per task (nextval() in an UPDATE of a distributed table is
--     refused); the fence compares a task's token with its holder's, so per task is enough;
--   - the wake-up pg_notify runs on the coordinator, where the roles listen.

-- name: routed_task_insert
-- task_insert with keys unique within their queue; each new task's queue and run_after (a
-- parameter in RETURNING is not sent on to the worker node)
INSERT INTO skiplock.tasks
    (id, kind, queue, priority, payload, max_attempts, run_after, idempotency_key, event_seq, concurrency_key,
     trace_context)
SELECT id, kind, queue, priority, payload, max_attempts,
       coalesce(run_at, %(now)s::timestamptz + coalesce(delay, 0) * interval '1 second'), idempotency_key, 1,
       concurrency_key, trace_context
FROM {{_task_insert_arrays}}
ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id, queue, run_after;

-- name: routed_task_inserted_events
-- the first event of each task just inserted, named after its first state (what the
-- tasks_inserted trigger writes on one Postgres): an INSERT ... SELECT between colocated tables,
-- run on each queue's shard
INSERT INTO skiplock.task_events (queue, task_id, seq, type, attempt)
SELECT t.queue, t.id, 1, t.state, 0
FROM skiplock.tasks AS t
WHERE t.queue = ANY (%(queues)s::text[]) AND t.id = ANY (%(ids)s::uuid[]);

-- name: routed_task_insert_dependent
-- task_insert_dependent with keys unique within their queue (routed_task_insert's changes)
INSERT INTO skiplock.tasks
    (id, kind, queue, priority, payload, max_attempts, run_after, idempotency_key, event_seq, concurrency_key,
     trace_context, state, waiting_on, failed_parents, on_parent_failure, cancelled_by_parent, finished_at, last_error)
SELECT id, kind, queue, priority, payload, max_attempts,
       coalesce(run_at, %(now)s::timestamptz + coalesce(delay, 0) * interval '1 second'), idempotency_key, 1,
       concurrency_key, trace_context, state, waiting_on, failed_parents, on_parent_failure, state = 'cancelled',
       CASE WHEN state = 'cancelled' THEN %(now)s::timestamptz END, last_error
FROM {{_task_insert_dependent_arrays}}
ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id, queue, run_after, state;

-- name: routed_task_queues
-- the queue of each task of `ids` that exists (a read of every shard: an id names no queue; a
-- task's queue never changes, so what this reads routes the statements that follow)
SELECT id, queue FROM skiplock.tasks WHERE id = ANY (%(ids)s::uuid[]);

-- name: routed_task_parents_watch
-- task_parents_watch for the parents in one queue: locked in id order, marked watched (from now on
-- a change of their state is walked to their dependents by the store: store/routed_graph.py),
-- their states as locked
WITH locked AS MATERIALIZED (
    SELECT id, state, watched FROM skiplock.tasks
    WHERE queue = %(queue)s AND id = ANY (%(ids)s::uuid[])
    ORDER BY id
    FOR UPDATE
), marked AS (
    UPDATE skiplock.tasks AS t
    SET watched = true
    FROM locked AS p
    WHERE t.queue = %(queue)s AND t.id = p.id AND NOT p.watched
)
SELECT id, state FROM locked;

-- name: routed_task_dependencies_insert
-- the edges, each on its parent's shard (placement.sql distributes them by the parent's queue)
INSERT INTO skiplock.task_dependencies (parent_queue, parent_id, queue, task_id)
SELECT * FROM unnest(%(parent_queues)s::text[], %(parent_ids)s::uuid[], %(queues)s::text[], %(task_ids)s::uuid[])
ON CONFLICT DO NOTHING;

-- name: routed_task_dependents
-- the dependents of one task, from its own shard, in id order
SELECT queue, task_id FROM skiplock.task_dependencies
WHERE parent_queue = %(queue)s AND parent_id = %(id)s
ORDER BY task_id;

-- name: routed_dependents_update
-- What a parent's change of finality does to its dependents in one queue (the dependency walk of
-- migration 0019, a queue's dependents at a time): the counters move by the deltas under the
-- dependents' row locks, taken in id order; a waiting dependent is queued when none is left, or
-- cancelled by a failed parent; one cancelled by a parent comes back when its parent is resumed.
-- Each row with the state it left, so the store writes the events of those that changed.
WITH locked AS MATERIALIZED (
    SELECT t.id, t.state, t.waiting_on + %(waiting_delta)s AS waiting_on,
           t.failed_parents + %(failed_delta)s AS failed_parents, t.on_parent_failure, t.cancelled_by_parent
    FROM skiplock.tasks AS t
    WHERE t.queue = %(queue)s AND t.id = ANY (%(ids)s::uuid[])
    ORDER BY t.id
    FOR UPDATE
), decided AS (
    SELECT l.*,
           CASE
               WHEN l.state = 'waiting' AND l.failed_parents > 0 AND l.on_parent_failure = 'cancel' THEN 'cancelled'
               WHEN l.state = 'waiting' AND l.waiting_on = 0 THEN 'queued'
               WHEN l.state = 'cancelled' AND l.cancelled_by_parent AND l.failed_parents = 0
                   THEN CASE WHEN l.waiting_on = 0 THEN 'queued' ELSE 'waiting' END
               ELSE l.state
           END AS new_state
    FROM locked AS l
)
UPDATE skiplock.tasks AS t
SET waiting_on = d.waiting_on,
    failed_parents = d.failed_parents,
    state = d.new_state,
    cancelled_by_parent = (d.new_state = 'cancelled' AND d.state = 'waiting')
                          OR (d.cancelled_by_parent AND d.new_state = 'cancelled'),
    run_after = CASE WHEN d.new_state = 'queued' AND d.state <> 'queued' THEN %(now)s::timestamptz
                     ELSE t.run_after END,
    finished_at = CASE WHEN d.new_state = 'cancelled' AND t.finished_at IS NULL THEN %(now)s::timestamptz
                       WHEN d.new_state IN ('waiting', 'queued') THEN NULL ELSE t.finished_at END,
    last_error = CASE WHEN d.new_state = 'cancelled' AND d.state = 'waiting' THEN %(error)s ELSE t.last_error END,
    updated_at = CASE WHEN d.new_state <> d.state THEN %(now)s::timestamptz ELSE t.updated_at END,
    event_seq = t.event_seq + (d.new_state <> d.state)::integer
FROM decided AS d
WHERE t.queue = %(queue)s AND t.id = d.id
RETURNING t.id, d.state, t.state, t.event_seq, t.watched;

-- name: routed_task_parents
-- task_parents: the edges joined to their parents on the parents' shards
SELECT t.id, t.kind, t.state, t.result, t.last_error
FROM skiplock.task_dependencies AS d
JOIN skiplock.tasks AS t ON t.queue = d.parent_queue AND t.id = d.parent_id
WHERE d.task_id = %(id)s
ORDER BY d.parent_id
LIMIT %(limit)s;

-- name: routed_task_watch
-- task_watch on the task's shard: its changes of state are walked from now on (skiplock.wait)
UPDATE skiplock.tasks SET watched = true WHERE queue = %(queue)s AND id = %(id)s RETURNING state;

-- name: routed_finished_notify
-- what skiplock.wait() listens for (the tasks_watched trigger's notification on one Postgres): a
-- watched task's id when it ends, sent from the coordinator at commit
SELECT pg_notify(%(channel)s, id::text) FROM unnest(%(ids)s::uuid[]) AS id;

-- name: routed_task_cancel
-- _task_cancel_ctes for tasks of one queue: a queued or waiting task cancelled at once, a running
-- one asked to stop. Each with the state it left (its event is written by routed_task_events).
WITH targets AS MATERIALIZED (
    SELECT id, state FROM skiplock.tasks
    WHERE queue = %(queue)s AND id = ANY (%(ids)s::uuid[]) AND state IN ('waiting', 'queued', 'running')
    ORDER BY id
    FOR UPDATE
)
UPDATE skiplock.tasks AS t
SET state = CASE WHEN t.state IN ('queued', 'waiting') THEN 'cancelled' ELSE 'cancelling' END,
    finished_at = CASE WHEN t.state IN ('queued', 'waiting') THEN %(now)s::timestamptz END,
    cancelled_by_parent = false,
    updated_at = %(now)s::timestamptz,
    event_seq = t.event_seq + 1
FROM targets
WHERE t.queue = %(queue)s AND t.id = targets.id
RETURNING t.id, targets.state, t.state, t.event_seq, t.watched, t.lease_token, t.attempts;

-- name: routed_task_resume
-- _task_resume_ctes for tasks of one queue (a unique key's other holder is looked for in the queue:
-- keys are unique within their queue here)
WITH targets AS MATERIALIZED (
    SELECT id, state FROM skiplock.tasks
    WHERE queue = %(queue)s AND id = ANY (%(ids)s::uuid[]) AND state IN ('failed', 'cancelled')
    ORDER BY id
    FOR UPDATE
)
UPDATE skiplock.tasks AS t
SET state = CASE WHEN t.waiting_on > 0 THEN 'waiting' ELSE 'queued' END, cancelled_by_parent = false,
    limited = false, attempts = 0, reclaims = 0, run_after = %(now)s::timestamptz, finished_at = NULL,
    updated_at = %(now)s::timestamptz, event_seq = t.event_seq + 1
FROM targets
WHERE t.queue = %(queue)s AND t.id = targets.id
  AND (t.unique_key IS NULL OR t.state = ANY (t.unique_states) OR NOT EXISTS (
      SELECT FROM skiplock.tasks AS h
      WHERE h.queue = %(queue)s AND h.unique_key = t.unique_key AND h.state = ANY (h.unique_states)
        AND h.id <> t.id))
RETURNING t.id, targets.state, t.state, t.event_seq, t.watched;

-- name: routed_task_targets
-- a bulk action's batch: up to `limit` tasks of the filter in `states`, oldest first, with their
-- queues, after the previous batch's last id (a read of every shard; the routed action locks
-- them and checks their state again)
SELECT queue, id FROM skiplock.tasks
WHERE state = ANY (%(states)s::text[]) AND {{_task_filter}}
  AND (%(after)s::uuid IS NULL OR id > %(after)s::uuid)
ORDER BY id
LIMIT %(limit)s;

-- name: routed_queue_kinds
-- the queues and kinds tasks are enqueued with, for the filters and the console (what the
-- tasks_inserted trigger records on one Postgres); a reference table, so only the pairs it does
-- not hold yet are written (a write there commits on every node). Returns the pairs written: the
-- others were there, committed (store/routed.py remembers them)
INSERT INTO skiplock.queue_kinds (queue, kind)
SELECT n.queue, n.kind FROM unnest(%(queues)s::text[], %(kinds)s::text[]) AS n(queue, kind)
WHERE NOT EXISTS (SELECT FROM skiplock.queue_kinds AS x WHERE x.queue = n.queue AND x.kind = n.kind)
ON CONFLICT DO NOTHING
RETURNING queue, kind;

-- name: routed_task_insert_one
-- routed_task_insert for one task: an INSERT ... VALUES, which Citus sends to the queue's node as
-- it is (an INSERT ... SELECT of the arrays runs through the coordinator); run_after worked out by
-- the store from the transaction's time
INSERT INTO skiplock.tasks
    (id, kind, queue, priority, payload, max_attempts, run_after, idempotency_key, event_seq, concurrency_key,
     trace_context)
VALUES (%(id)s::uuid, %(kind)s::text, %(queue)s::text, %(priority)s::smallint, %(payload)s::jsonb,
        %(max_attempts)s::integer, %(run_after)s::timestamptz, %(idempotency_key)s::text, 1,
        %(concurrency_key)s::text, %(trace_context)s::jsonb)
ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id, queue, run_after;

-- name: routed_task_inserted_event
-- routed_task_inserted_events for the one task routed_task_insert_one wrote
INSERT INTO skiplock.task_events (queue, task_id, seq, type, attempt)
VALUES (%(queue)s::text, %(id)s::uuid, 1, 'queued', 0);

-- name: routed_task_ids_by_idempotency_key
SELECT queue, idempotency_key, id
FROM skiplock.tasks
WHERE queue = ANY (%(queues)s::text[]) AND idempotency_key = ANY (%(keys)s::text[]);

-- name: routed_wake
-- the roles' wake-up, on the coordinator: one notification per queue, at commit
SELECT pg_notify(%(channel)s, q) FROM unnest(%(queues)s::text[]) AS q;

-- name: routed_now
-- The transaction's time, and whether any webhook endpoint is enabled (an outbox to write: the
-- endpoints are a reference table, read on the coordinator). A transaction that reads this
-- sees an endpoint enabled before it began; one enabled meanwhile gets the events after.
SELECT now(), EXISTS (SELECT FROM skiplock.webhook_endpoints WHERE enabled);

-- name: routed_task_claim
-- task_claim for one queue. Tasks of a kind with a limit are left where they are: limits do not
-- run on this placement yet (docs/SCALING.md).
WITH picked AS (
    SELECT t.id
    FROM skiplock.tasks AS t
    WHERE t.queue = %(queue)s AND t.state = 'queued' AND NOT t.limited
      AND t.run_after <= now()
      AND t.kind NOT IN (SELECT name FROM skiplock.pauses WHERE scope = 'kind')
      AND t.kind NOT IN (SELECT l.kind FROM skiplock.limits AS l)
      AND NOT EXISTS (SELECT FROM skiplock.pauses WHERE scope = 'queue' AND name = %(queue)s)
    ORDER BY t.priority DESC, t.run_after, t.id
    LIMIT %(limit)s
    FOR UPDATE OF t SKIP LOCKED
)
UPDATE skiplock.tasks AS t
SET state = 'running',
    attempts = t.attempts + 1,
    max_attempts = coalesce(t.max_attempts, (%(kind_max_attempts)s::jsonb ->> t.kind)::integer),
    lease_token = coalesce(t.lease_token, 0) + 1,
    lease_owner = %(owner)s,
    lease_until = now() + %(lease_seconds)s * interval '1 second',
    started_at = least(t.started_at, now()),  -- least() skips NULLs: the first claim's time
    updated_at = now(),
    event_seq = t.event_seq + 1
FROM picked AS p
WHERE t.queue = %(queue)s AND t.id = p.id AND t.state = 'queued'
-- the wait from the time written (Citus refuses now() in RETURNING), and whether a webhook
-- endpoint is enabled (routed_now's second column: the claim's events then go to the outbox)
RETURNING t.id, t.kind, t.queue, t.payload, t.attempts AS attempt, t.lease_token, t.cursor,
          extract(epoch FROM t.updated_at - t.run_after)::float8 AS waited_seconds, t.limited, t.trace_context,
          (SELECT EXISTS (SELECT FROM skiplock.webhook_endpoints WHERE enabled)) AS outbox;

-- name: routed_task_claim_events
INSERT INTO skiplock.task_events AS written (queue, task_id, seq, type, lease_token, attempt, data)
SELECT t.queue, t.id, t.event_seq, 'running', t.lease_token, t.attempts,
       jsonb_build_object('owner', %(owner)s::text)
FROM skiplock.tasks AS t
WHERE t.queue = %(queue)s AND t.id = ANY (%(ids)s::uuid[])
RETURNING written.task_id, written.seq;

-- name: routed_task_heartbeat
-- task_heartbeat for one queue's claims. It waits for a row another transaction holds (a moment:
-- the holder is a settle or a reclaim) instead of reporting it busy.
UPDATE skiplock.tasks AS t
SET lease_until = now() + %(lease_seconds)s * interval '1 second'
FROM unnest(%(ids)s::uuid[], %(tokens)s::bigint[]) AS i(id, token)
WHERE t.queue = %(queue)s AND t.id = i.id AND t.lease_token = i.token AND t.state IN ('running', 'cancelling')
RETURNING t.id, t.state;

-- name: routed_task_settle
-- task_settle for one queue's outcomes: completed | failed | retry | step | released | suspend. A
-- claim whose fence fails is left out of the result, as in task_settle. Each row with the state it
-- left and whether it is watched, for the dependency walk (store/routed_graph.py).
WITH settle_input AS (
    SELECT *
    FROM jsonb_to_recordset(%(settlements)s::jsonb)
        AS i(id uuid, token bigint, outcome text, result jsonb, error text, delay float8, cursor jsonb,
             progress real, message text, deadline_seconds float8, kind_max_attempts integer,
             traceback text, suspended text, wake_at timestamptz, awaited_signal text,
             waiting_on_add integer, ready boolean)
), decided AS (
    SELECT i.id, i.outcome, i.result, i.cursor, i.progress, i.message, i.delay, i.traceback, i.error,
           i.suspended, i.wake_at, i.awaited_signal, i.waiting_on_add, t.state AS old_state,
           t.attempts AS attempt,
           CASE
               WHEN i.outcome = 'completed' THEN 'completed'
               WHEN t.state = 'cancelling' THEN 'cancelled'
               WHEN i.outcome = 'failed' THEN 'failed'
               WHEN i.outcome = 'retry' AND (
                        t.attempts >= coalesce(t.max_attempts, i.kind_max_attempts, 3)
                     OR skiplock.seconds_after(%(now)s::timestamptz, i.delay)
                            > least(t.deadline, skiplock.seconds_after(t.created_at, i.deadline_seconds)))
                   THEN 'failed'
               WHEN i.outcome = 'suspend' AND NOT i.ready
                    AND NOT EXISTS (SELECT FROM skiplock.signals AS s WHERE s.name = i.awaited_signal)
                   THEN 'waiting'
               ELSE 'queued'
           END AS new_state
    FROM settle_input AS i
    JOIN skiplock.tasks AS t ON t.queue = %(queue)s AND t.id = i.id
    WHERE t.lease_token = i.token AND t.state IN ('running', 'cancelling')
    FOR UPDATE OF t
)
UPDATE skiplock.tasks AS t
SET state = d.new_state,
    attempts = CASE WHEN d.outcome = 'suspend' AND d.new_state IN ('queued', 'waiting')
                        THEN greatest(t.attempts - 1, 0)
                    WHEN d.new_state <> 'queued' THEN t.attempts
                    WHEN d.outcome = 'step' THEN 0
                    WHEN d.outcome = 'released' THEN greatest(t.attempts - 1, 0)
                    ELSE t.attempts END,
    run_after = CASE WHEN d.new_state = 'queued'
                     THEN skiplock.seconds_after(%(now)s::timestamptz, coalesce(d.delay, 0))
                     ELSE t.run_after END,
    {{_settle_written_fields}},
    suspended = CASE WHEN d.new_state = 'waiting' THEN d.suspended END,
    wake_at = CASE WHEN d.new_state = 'waiting' THEN d.wake_at END,
    awaited_signal = CASE WHEN d.new_state = 'waiting' THEN d.awaited_signal END,
    -- a wait for tasks counts them as parents (the walk queues it after the last), and never
    -- cancels for a failed one: the handler reads their outcomes
    waiting_on = t.waiting_on + coalesce(d.waiting_on_add, 0),
    on_parent_failure = CASE WHEN d.waiting_on_add IS NOT NULL THEN 'run' ELSE t.on_parent_failure END,
    lease_owner = NULL,
    lease_until = NULL,
    finished_at = CASE WHEN d.new_state IN ('completed', 'failed', 'cancelled') THEN %(now)s::timestamptz END,
    updated_at = %(now)s::timestamptz,
    event_seq = t.event_seq + 1
FROM decided AS d
WHERE t.queue = %(queue)s AND t.id = d.id
RETURNING t.id, t.state, t.event_seq, t.lease_token, d.attempt, d.outcome, d.error, d.delay, d.traceback,
          d.old_state, t.watched;

-- name: routed_task_events
-- the events of the transitions just written (settle, reclaim), given as one JSON array
INSERT INTO skiplock.task_events (queue, task_id, seq, type, lease_token, attempt, data)
SELECT %(queue)s, e.id, e.seq, e.type, e.lease_token, e.attempt, e.data
FROM jsonb_to_recordset(%(events)s::jsonb)
    AS e(id uuid, seq integer, type text, lease_token bigint, attempt integer, data jsonb);

-- name: routed_queues
-- every queue tasks were enqueued into (a reference table; store/routed.py, _queues_with)
SELECT DISTINCT queue FROM skiplock.queue_kinds;

-- name: routed_queue_groups
-- the node group (pg_dist_placement.groupid) holding each queue's shard of the tasks, from the
-- coordinator's catalog
SELECT q, (SELECT p.groupid FROM pg_catalog.pg_dist_placement AS p
           WHERE p.shardid = get_shard_id_for_distribution_column('skiplock.tasks', q)
           ORDER BY p.groupid LIMIT 1)
FROM unnest(%(queues)s::text[]) AS q;

-- name: routed_expired_queues
-- of `queues` (one node's), those with a claim whose lease ran out
SELECT DISTINCT queue FROM skiplock.tasks
WHERE queue = ANY (%(queues)s::text[]) AND state IN ('running', 'cancelling') AND lease_until < now();

-- name: routed_task_reclaim_expired
-- task_reclaim_expired for one queue
WITH expired AS (
    SELECT id, state
    FROM skiplock.tasks
    WHERE queue = %(queue)s AND state IN ('running', 'cancelling') AND lease_until < %(now)s::timestamptz
    ORDER BY lease_until
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE skiplock.tasks AS t
SET state = CASE
                WHEN t.state = 'cancelling' THEN 'cancelled'
                WHEN t.reclaims >= %(max_reclaims)s OR t.deadline < %(now)s::timestamptz THEN 'failed'
                ELSE 'queued'
            END,
    reclaims = t.reclaims + (t.state = 'running')::integer,
    attempts = CASE WHEN t.state = 'running' AND t.reclaims < %(max_reclaims)s
                         AND (t.deadline IS NULL OR t.deadline >= %(now)s::timestamptz)
                    THEN greatest(t.attempts - 1, 0) ELSE t.attempts END,
    last_error = CASE
                     WHEN t.state = 'cancelling' THEN t.last_error
                     ELSE 'lease of ' || t.lease_owner || ' expired (reclaim ' || (t.reclaims + 1)::text || ')'
                 END,
    run_after = %(now)s::timestamptz,
    lease_owner = NULL,
    lease_until = NULL,
    finished_at = CASE WHEN t.state = 'cancelling' OR t.reclaims >= %(max_reclaims)s
                            OR t.deadline < %(now)s::timestamptz THEN %(now)s::timestamptz END,
    updated_at = %(now)s::timestamptz,
    event_seq = t.event_seq + 1
FROM expired
WHERE t.queue = %(queue)s AND t.id = expired.id
RETURNING t.id, t.queue, t.state, t.kind, t.event_seq, t.lease_token, t.attempts, t.reclaims, t.last_error,
          expired.state, t.watched;

-- name: routed_task_get
-- task_get by id alone (a read of every shard: an id names no queue), then the traceback from the
-- task's own shard (a join of the colocated tables on their distribution column)
SELECT {{_task_get_columns}},
       (SELECT e.data ->> 'traceback' FROM skiplock.task_events AS e
        WHERE e.queue = t.queue AND e.task_id = t.id AND e.data ? 'error' AND t.last_error IS NOT NULL
        ORDER BY e.seq DESC LIMIT 1) AS last_error_traceback
FROM skiplock.tasks AS t
WHERE t.id = %(id)s;

-- name: routed_task_event_throughput
-- task_event_throughput: an event carries its task's queue here, and a task deleted since takes
-- its events out of the count (a join of the colocated tables on their distribution column)
SELECT e.queue, date_trunc('minute', e.at) AS minute, count(*) FILTER (WHERE e.type = 'completed'),
       count(*) FILTER (WHERE e.type = 'failed')
FROM skiplock.task_events AS e
WHERE e.type IN ('completed', 'failed') AND e.at >= %(since)s
  AND EXISTS (SELECT FROM skiplock.tasks AS t WHERE t.queue = e.queue AND t.id = e.task_id)
GROUP BY e.queue, date_trunc('minute', e.at)
ORDER BY 1, 2;

-- name: routed_finished_queues
-- of `queues` (one node's), those with tasks finished in `state` before `before`
SELECT DISTINCT queue FROM skiplock.tasks
WHERE queue = ANY (%(queues)s::text[]) AND state = %(state)s AND finished_at IS NOT NULL
  AND finished_at < %(before)s::timestamptz;

-- name: routed_task_delete_finished
-- task_delete_finished for one queue: its tasks, their events and steps, on its shard
WITH doomed AS MATERIALIZED (
    SELECT id
    FROM skiplock.tasks AS t
    WHERE t.queue = %(queue)s AND t.state = %(state)s
      AND t.finished_at IS NOT NULL AND t.finished_at < %(before)s::timestamptz
      AND (t.unique_until IS NULL OR t.unique_until <= %(now)s::timestamptz OR NOT t.state = ANY (t.unique_states))
    ORDER BY t.finished_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), events AS (
    DELETE FROM skiplock.task_events AS e USING doomed WHERE e.queue = %(queue)s AND e.task_id = doomed.id
), steps AS (
    DELETE FROM skiplock.task_steps AS s USING doomed WHERE s.queue = %(queue)s AND s.task_id = doomed.id
)
DELETE FROM skiplock.tasks AS t USING doomed WHERE t.queue = %(queue)s AND t.id = doomed.id
RETURNING t.id;

-- name: routed_outbox
-- The webhook outbox of events just written (what the task_events_outbox trigger does on one
-- Postgres): a delivery per event and subscribed endpoint, into the coordinator's deliveries
-- table, with the payload the trigger builds. Run only while an endpoint is enabled (routed_now).
INSERT INTO skiplock.webhook_deliveries (event_id, endpoint_id, event_type, payload)
SELECT md5(e.task_id::text || ':' || e.seq::text)::uuid,
       ep.id,
       'task.' || e.type,
       jsonb_build_object(
           'type', 'task.' || e.type,
           'timestamp', e.at,
           'data', jsonb_strip_nulls(jsonb_build_object(
               'task_id', t.id, 'kind', t.kind, 'queue', t.queue, 'state', t.state,
               'attempt', e.attempt, 'seq', e.seq,
               'result', CASE WHEN e.type = 'completed' THEN t.result END,
               'error', CASE WHEN e.type IN ('failed', 'retrying', 'reclaimed')
                             THEN coalesce(e.data ->> 'error', t.last_error) END)))
FROM unnest(%(ids)s::uuid[], %(seqs)s::integer[]) AS w(task_id, seq)
JOIN skiplock.task_events AS e ON e.task_id = w.task_id AND e.seq = w.seq
JOIN skiplock.tasks AS t ON t.queue = e.queue AND t.id = e.task_id
JOIN skiplock.webhook_endpoints AS ep
  ON ep.enabled AND ('task.' || e.type = ANY (ep.event_types) OR 'task.*' = ANY (ep.event_types))
WHERE e.queue = ANY (%(queues)s::text[]);

-- name: routed_lease_tokens
-- lease tokens for a claim of deliveries, taken on the coordinator: nextval() in an UPDATE of a
-- table Citus holds is refused
SELECT nextval('skiplock.lease_tokens') FROM generate_series(1, %(limit)s);

-- name: routed_delivery_pick
-- webhook_delivery_claim's pick on its own (the rows stay locked to the transaction's end); the
-- lease is written by routed_delivery_lease with tokens taken before (routed_lease_tokens)
WITH {{_delivery_claim_picked}}
SELECT id FROM picked ORDER BY id;

-- name: routed_trace_contexts
-- the trace contexts of tasks whose deliveries were just leased, read on their queues' shards
SELECT id, trace_context FROM skiplock.tasks
WHERE queue = ANY (%(queues)s::text[]) AND id = ANY (%(ids)s::uuid[]) AND trace_context IS NOT NULL;

-- name: routed_delivery_lease
-- without the task's trace context (routed_trace_contexts reads it next): a join of the
-- coordinator's deliveries to the distributed tasks by an id that names no queue is not one Citus
-- runs
WITH leased AS (
    UPDATE skiplock.webhook_deliveries AS d
    SET state = 'delivering',
        lease_token = u.token,
        lease_owner = %(owner)s,
        lease_until = now() + %(lease_seconds)s * interval '1 second',
        updated_at = now()
    FROM unnest(%(ids)s::uuid[], %(tokens)s::bigint[]) AS u(id, token)
    WHERE d.id = u.id
    RETURNING d.id, d.event_id, d.endpoint_id, d.event_type, d.payload, d.attempts, d.lease_token, d.created_at
)
SELECT l.id, l.event_id, l.endpoint_id, e.url, e.secret, l.event_type, l.payload, l.attempts,
       l.lease_token, l.created_at, NULL::jsonb AS trace_context
FROM leased AS l
JOIN skiplock.webhook_endpoints AS e ON e.id = l.endpoint_id;

-- Durable execution (engine/store/steps.py): a run's records on its task's shard, fenced by the
-- run's lease token as in steps.sql. The fence is its own statement (a row locked FOR SHARE on
-- the shard), followed in the same transaction by the write when the fence holds: an INSERT fed
-- by a locking CTE is not one Citus routes.

-- name: routed_task_steps_read
SELECT position, name, occurrence, type, result, lease_token, attempt, recorded_at, now() AS db_now
FROM skiplock.task_steps
WHERE queue = %(queue)s AND task_id = %(task_id)s
ORDER BY position;

-- name: routed_step_fence
SELECT id FROM skiplock.tasks
WHERE queue = %(queue)s AND id = %(task_id)s AND lease_token = %(token)s AND state IN ('running', 'cancelling')
FOR SHARE;

-- name: routed_task_step_record
INSERT INTO skiplock.task_steps (queue, task_id, position, name, occurrence, type, result, lease_token, attempt)
VALUES (%(queue)s, %(task_id)s, %(position)s, %(name)s, %(occurrence)s, %(type)s, %(result)s::jsonb, %(token)s,
        %(attempt)s)
ON CONFLICT (queue, task_id, position) DO NOTHING
RETURNING position;

-- name: routed_task_step_resolve
UPDATE skiplock.task_steps
SET result = %(result)s::jsonb
WHERE queue = %(queue)s AND task_id = %(task_id)s AND position = %(position)s
RETURNING position;

-- name: routed_awaited_insert
-- task_awaited_insert: the edges of ctx.wait_for_tasks on the awaited tasks' shards, with the
-- waiting task's queue; the awaited tasks that were not awaited already
INSERT INTO skiplock.task_dependencies (parent_queue, parent_id, queue, task_id)
SELECT * FROM unnest(%(parent_queues)s::text[], %(parent_ids)s::uuid[], %(queues)s::text[], %(task_ids)s::uuid[])
ON CONFLICT DO NOTHING
RETURNING parent_id;

-- name: routed_wake_due_queues
-- of `queues` (one node's), those with a suspended task whose time came
SELECT DISTINCT queue FROM skiplock.tasks
WHERE queue = ANY (%(queues)s::text[]) AND state = 'waiting' AND wake_at <= now();

-- name: routed_task_wake_due
-- task_wake_due for one queue; the events are written by routed_task_events
WITH due AS MATERIALIZED (
    SELECT id FROM skiplock.tasks
    WHERE queue = %(queue)s AND state = 'waiting' AND wake_at <= %(now)s::timestamptz
    ORDER BY wake_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE skiplock.tasks AS t
SET state = 'queued', run_after = %(now)s::timestamptz, updated_at = %(now)s::timestamptz,
    event_seq = t.event_seq + 1
FROM due
WHERE t.queue = %(queue)s AND t.id = due.id AND t.state = 'waiting'
RETURNING t.id, t.event_seq, t.attempts, t.suspended;

-- name: routed_signal_waiters
-- the tasks waiting for a signal (a read of every shard), for routed_signal_wake
SELECT queue, id FROM skiplock.tasks WHERE state = 'waiting' AND awaited_signal = %(name)s;

-- name: routed_signal_wake
-- signal_send's wake-up of one queue's tasks waiting for the signal
UPDATE skiplock.tasks AS t
SET state = 'queued', run_after = %(now)s::timestamptz, updated_at = %(now)s::timestamptz,
    event_seq = t.event_seq + 1
WHERE t.queue = %(queue)s AND t.id = ANY (%(ids)s::uuid[]) AND t.state = 'waiting' AND t.awaited_signal = %(name)s
RETURNING t.id, t.event_seq, t.attempts;

-- name: routed_signal_insert
-- the signal, unless one of that name exists (a reference table: a copy on every node)
INSERT INTO skiplock.signals (name, payload) VALUES (%(name)s, %(payload)s::jsonb)
ON CONFLICT (name) DO NOTHING
RETURNING name;
