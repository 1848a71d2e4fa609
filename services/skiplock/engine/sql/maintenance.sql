-- Named statements of the maintenance services the scheduler runs: retention and queue gauges.
-- (The reclaimer's statement, task_reclaim_expired, lives with the task lifecycle in tasks.sql.)
-- Each is safe to run from every replica at once.

-- name: task_delete_finished
-- Retention: one small batch of tasks finished in `state` longer ago than `older_than` seconds,
-- with their events. SKIP LOCKED: replicas delete different rows, and a row an operator is
-- resuming right now is left for the next run (its state no longer matches after the lock).
-- A parent whose dependents are not all final is kept: they read its result when they run
-- (only a watched task is probed). So is a unique task that still blocks its duplicates (its
-- state among its unique_states) until its window ends (migration 0021).
WITH doomed AS MATERIALIZED (
    SELECT id
    FROM skiplock.tasks AS t
    WHERE state = %(state)s
      AND finished_at IS NOT NULL
      AND finished_at < now() - %(older_than)s * interval '1 second'
      AND (t.unique_until IS NULL OR t.unique_until <= now() OR NOT t.state = ANY (t.unique_states))
      AND NOT (t.watched AND EXISTS (
              SELECT FROM skiplock.task_dependencies AS d
              JOIN skiplock.tasks AS c ON c.id = d.task_id
              WHERE d.parent_id = t.id AND c.state NOT IN ('completed', 'failed', 'cancelled')))
    ORDER BY finished_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), {{_task_delete_doomed}}

-- name: audit_delete_old
-- Retention: one batch of audit rows written longer ago than `older_than` seconds, oldest first
-- (through audit_log_at). SKIP LOCKED: replicas delete different rows.
WITH doomed AS MATERIALIZED (
    SELECT id
    FROM skiplock.audit_log
    WHERE at < now() - %(older_than)s * interval '1 second'
    ORDER BY at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM skiplock.audit_log AS a USING doomed
WHERE a.id = doomed.id
RETURNING a.id;

-- name: schedule_fire_delete_old
WITH doomed AS MATERIALIZED (
    SELECT schedule, nominal_at
    FROM skiplock.schedule_fires
    WHERE at < now() - %(older_than)s * interval '1 second'
    ORDER BY at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM skiplock.schedule_fires AS f USING doomed
WHERE f.schedule = doomed.schedule AND f.nominal_at = doomed.nominal_at
RETURNING f.schedule;

-- name: queue_task_counts
-- skiplock_queue_tasks{queue, state}: tasks in flight from the partial indexes that hold them,
-- finished ones from tasks_state_finished.
SELECT queue, state, count(*) FROM skiplock.tasks WHERE state = 'queued' AND NOT limited GROUP BY queue, state
UNION ALL
SELECT queue, state, count(*) FROM skiplock.tasks WHERE state = 'queued' AND limited GROUP BY queue, state
UNION ALL
SELECT queue, state, count(*) FROM skiplock.tasks WHERE state = 'waiting' GROUP BY queue, state
UNION ALL
SELECT queue, state, count(*) FROM skiplock.tasks WHERE state IN ('running', 'cancelling')
GROUP BY queue, state
UNION ALL
SELECT queue, state, count(*) FROM skiplock.tasks WHERE finished_at IS NOT NULL
GROUP BY queue, state;

-- name: queue_suspended_counts
-- skiplock_queue_suspended_tasks{queue, reason}: the waiting tasks that are suspended (durable
-- execution), by why; read through tasks_waiting, the partial index of every waiting task (a
-- dependent of depends_on has no reason and is left out).
SELECT queue, suspended, count(*) FROM skiplock.tasks
WHERE state = 'waiting' AND suspended IS NOT NULL
GROUP BY queue, suspended;

-- name: _queued
-- The queued tasks, from the two partial indexes that hold them: tasks_claimable, and
-- tasks_parked for the tasks a limit holds back (migration 0016)
SELECT queue, run_after, kind, false AS throttled FROM skiplock.tasks WHERE state = 'queued' AND NOT limited
UNION ALL
SELECT queue, run_after, kind, true FROM skiplock.tasks WHERE state = 'queued' AND limited

-- name: queue_claimable
-- Per queue: tasks claimable now (queued, run_after reached, not held back by a limit), the age
-- of the oldest task pending (a throttled one counts: it waits to run as much as any), and the
-- tasks a limit holds back (parked). Paused queues are reported as not claimable; paused kinds
-- need queue_claimable_without_kinds.
SELECT t.queue,
       count(*) FILTER (WHERE t.run_after <= now() AND NOT t.throttled) AS claimable,
       extract(epoch FROM now() - min(t.run_after) FILTER (WHERE t.run_after <= now()))::float8 AS oldest_age,
       EXISTS (SELECT 1 FROM skiplock.pauses AS p WHERE p.scope = 'queue' AND p.name = t.queue) AS paused,
       count(*) FILTER (WHERE t.throttled) AS throttled
FROM ({{_queued}}) AS t
GROUP BY t.queue;

-- name: queue_claimable_without_kinds
-- As queue_claimable, when some kinds are paused: their tasks are not claimable either.
SELECT t.queue,
       count(*) FILTER (WHERE t.run_after <= now() AND NOT t.throttled
                          AND NOT t.kind = ANY(%(paused_kinds)s::text[])) AS claimable,
       extract(epoch FROM now() - min(t.run_after)
               FILTER (WHERE t.run_after <= now() AND NOT t.kind = ANY(%(paused_kinds)s::text[])))::float8 AS oldest_age,
       EXISTS (SELECT 1 FROM skiplock.pauses AS p WHERE p.scope = 'queue' AND p.name = t.queue) AS paused,
       count(*) FILTER (WHERE t.throttled) AS throttled
FROM ({{_queued}}) AS t
GROUP BY t.queue;

-- name: pause_list
SELECT scope, name, paused_at FROM skiplock.pauses ORDER BY scope, name;

-- name: task_event_throughput_since
-- The first minute of a throughput window of `minutes` whole minutes, the current one last.
SELECT date_trunc('minute', now()) - (%(minutes)s - 1) * interval '1 minute';

-- name: task_event_throughput
-- Per queue and minute since `since`: tasks completed and failed (their outcome events, read
-- through task_events_outcome_at; a task resumed and failed again counts each failure). The
-- queue comes from a lookup by primary key per event: as a join, the planner hashes every task.
-- MATERIALIZED: the lookup runs once per event, not again for the filter below.
WITH outcomes AS MATERIALIZED (
    SELECT (SELECT t.queue FROM skiplock.tasks AS t WHERE t.id = e.task_id) AS queue,
           date_trunc('minute', e.at) AS minute, e.type
    FROM skiplock.task_events AS e
    WHERE e.type IN ('completed', 'failed') AND e.at >= %(since)s
)
SELECT queue, minute, count(*) FILTER (WHERE type = 'completed'), count(*) FILTER (WHERE type = 'failed')
FROM outcomes
WHERE queue IS NOT NULL  -- events outliving their task count nowhere
GROUP BY queue, minute
ORDER BY queue, minute;
