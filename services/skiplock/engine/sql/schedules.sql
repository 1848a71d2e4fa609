-- Named statements for schedules and their fires. engine/store/schedules.py runs them, one method
-- per statement.
--
-- A tick runs schedule_now, schedule_claim_due, then per claimed row the task insert,
-- schedule_fire_record and schedule_advance, all in one transaction: a scheduler killed mid-tick
-- rolls back and another replica decides the same nominal times again, once.

-- name: schedule_now
-- The database owns time; tests may pin it (a fixed `now`) to walk across a DST change.
SELECT coalesce(%(now)s::timestamptz, now());

-- name: schedule_claim_due
-- Rows with a due fire, plus buffer_one rows whose previous task has finished. Rows another
-- replica is firing are skipped, not waited for.
SELECT s.name, s.kind, s.queue, s.payload, s.priority, s.max_attempts, s.cron, s.timezone,
       s.interval_seconds, s.overlap, s.catchup, s.catchup_window_seconds, s.jitter_seconds,
       s.next_fire_at, s.buffered_fire_at, s.last_task_id, t.state AS previous_state
FROM skiplock.schedules AS s
LEFT JOIN skiplock.tasks AS t ON t.id = s.last_task_id
WHERE s.enabled
  AND (s.next_fire_at <= %(now)s
       OR (s.buffered_fire_at IS NOT NULL
           AND (t.state IS NULL OR t.state NOT IN ('queued', 'running', 'cancelling'))))
ORDER BY s.next_fire_at
LIMIT %(limit)s
FOR UPDATE OF s SKIP LOCKED;

-- name: schedule_advance
-- The caller holds the row lock taken by schedule_claim_due.
UPDATE skiplock.schedules
SET next_fire_at = %(next_fire_at)s,
    buffered_fire_at = %(buffered_fire_at)s,
    last_fire_at = coalesce(%(last_fire_at)s, last_fire_at),
    last_task_id = coalesce(%(last_task_id)s, last_task_id),
    fires = fires + %(fires)s,
    skips = skips + %(skips)s,
    updated_at = now()
WHERE name = %(name)s;

-- name: schedule_postpone
-- A row the scheduler cannot evaluate (edited by hand, a time zone this tzdata lacks) is looked
-- at again later instead of at every tick, so it neither floods the log nor starves other rows.
UPDATE skiplock.schedules SET next_fire_at = %(now)s + interval '1 minute', updated_at = now()
WHERE name = %(name)s;

-- name: schedule_fire_record
-- A buffered time that fires later turns its 'buffered' row into 'fired'; any other decision
-- about a time already decided is refused by the primary key.
-- (The time comes with the new row, as EXCLUDED.at: Citus takes no function that is not
-- IMMUTABLE in DO UPDATE SET, here and in every upsert of a table it may hold.)
INSERT INTO skiplock.schedule_fires (schedule, nominal_at, outcome, task_id, detail, at)
SELECT %(schedule)s, f.nominal_at, f.outcome, f.task_id, f.detail, now()
FROM unnest(%(nominal_ats)s::timestamptz[], %(outcomes)s::text[], %(task_ids)s::uuid[], %(details)s::text[])
     AS f(nominal_at, outcome, task_id, detail)
ON CONFLICT (schedule, nominal_at) DO UPDATE
SET outcome = EXCLUDED.outcome, task_id = EXCLUDED.task_id, detail = EXCLUDED.detail, at = EXCLUDED.at
WHERE schedule_fires.outcome = 'buffered';

-- name: schedule_fire_now_record
-- "Fire now" (POST /v1/schedules/{name}/fire) records its decision under the current tick's
-- nominal time. A time already fired keeps its row and returns none (the key found that fire's
-- task); a time skipped, buffered or missed becomes fired.
INSERT INTO skiplock.schedule_fires (schedule, nominal_at, outcome, task_id, detail, at)
VALUES (%(schedule)s, %(nominal_at)s, 'fired', %(task_id)s, %(detail)s, now())
ON CONFLICT (schedule, nominal_at) DO UPDATE
SET outcome = 'fired', task_id = EXCLUDED.task_id, detail = EXCLUDED.detail, at = EXCLUDED.at
WHERE schedule_fires.outcome <> 'fired'
RETURNING nominal_at;

-- name: schedule_next_due
-- Seconds until the soonest fire (NULL: no enabled schedule); the scheduler sleeps that long.
SELECT extract(epoch FROM min(next_fire_at) - now())::float8
FROM skiplock.schedules
WHERE enabled;

-- name: schedule_upsert
-- Declarative sync. A changed timing (cron, time zone, interval) or a re-enabled schedule takes
-- the freshly computed next_fire_at and drops a buffered fire, so the old definition never fires
-- again; otherwise the schedule keeps its place. Unchanged rows are not written (no row back).
INSERT INTO skiplock.schedules AS s
    (name, kind, queue, payload, priority, max_attempts, cron, timezone, interval_seconds, overlap,
     catchup, catchup_window_seconds, jitter_seconds, enabled, next_fire_at, updated_at)
VALUES (%(name)s, %(kind)s, %(queue)s, %(payload)s, %(priority)s, %(max_attempts)s, %(cron)s,
        %(timezone)s, %(interval_seconds)s, %(overlap)s, %(catchup)s, %(catchup_window_seconds)s,
        %(jitter_seconds)s, %(enabled)s, %(next_fire_at)s, now())
ON CONFLICT (name) DO UPDATE
SET kind = EXCLUDED.kind, queue = EXCLUDED.queue, payload = EXCLUDED.payload,
    priority = EXCLUDED.priority, max_attempts = EXCLUDED.max_attempts, cron = EXCLUDED.cron,
    timezone = EXCLUDED.timezone, interval_seconds = EXCLUDED.interval_seconds,
    overlap = EXCLUDED.overlap, catchup = EXCLUDED.catchup,
    catchup_window_seconds = EXCLUDED.catchup_window_seconds,
    jitter_seconds = EXCLUDED.jitter_seconds, enabled = EXCLUDED.enabled,
    next_fire_at = CASE
        WHEN (s.cron, s.timezone, s.interval_seconds)
             IS DISTINCT FROM (EXCLUDED.cron, EXCLUDED.timezone, EXCLUDED.interval_seconds)
          OR (EXCLUDED.enabled AND NOT s.enabled)
        THEN EXCLUDED.next_fire_at ELSE s.next_fire_at END,
    buffered_fire_at = CASE
        WHEN (s.cron, s.timezone, s.interval_seconds)
             IS DISTINCT FROM (EXCLUDED.cron, EXCLUDED.timezone, EXCLUDED.interval_seconds)
          OR NOT EXCLUDED.enabled
        THEN NULL ELSE s.buffered_fire_at END,
    updated_at = EXCLUDED.updated_at  -- the time from VALUES (see schedule_fire_record)
WHERE (s.kind, s.queue, s.payload, s.priority, s.max_attempts, s.cron, s.timezone,
       s.interval_seconds, s.overlap, s.catchup, s.catchup_window_seconds, s.jitter_seconds, s.enabled)
      IS DISTINCT FROM
      (EXCLUDED.kind, EXCLUDED.queue, EXCLUDED.payload, EXCLUDED.priority, EXCLUDED.max_attempts,
       EXCLUDED.cron, EXCLUDED.timezone, EXCLUDED.interval_seconds, EXCLUDED.overlap,
       EXCLUDED.catchup, EXCLUDED.catchup_window_seconds, EXCLUDED.jitter_seconds, EXCLUDED.enabled)
RETURNING s.name, (s.xmax = 0) AS created;

-- name: schedule_delete_except
-- `apply --prune`: schedules the file no longer names.
DELETE FROM skiplock.schedules WHERE NOT (name = ANY(%(names)s::text[])) RETURNING name;

-- name: schedule_delete
DELETE FROM skiplock.schedules WHERE name = %(name)s RETURNING name;

-- name: schedule_set_enabled
-- Pausing keeps the row; resuming starts from the next fire after now (no catch-up storm).
UPDATE skiplock.schedules
SET enabled = %(enabled)s,
    next_fire_at = CASE WHEN %(enabled)s AND NOT enabled THEN %(next_fire_at)s ELSE next_fire_at END,
    buffered_fire_at = CASE WHEN %(enabled)s THEN buffered_fire_at END,
    updated_at = now()
WHERE name = %(name)s
RETURNING name, enabled;

-- name: _schedule_columns
SELECT name, kind, queue, payload, priority, max_attempts, cron, timezone, interval_seconds, overlap,
       catchup, catchup_window_seconds, jitter_seconds, enabled, next_fire_at, buffered_fire_at,
       last_fire_at, last_task_id, fires, skips, created_at, updated_at
FROM skiplock.schedules

-- name: schedule_list
{{_schedule_columns}}
ORDER BY name;

-- name: schedule_get
{{_schedule_columns}}
WHERE name = %(name)s;

-- name: schedule_fires_list
SELECT schedule, nominal_at, at, outcome, task_id, detail
FROM skiplock.schedule_fires
WHERE schedule = %(schedule)s
ORDER BY nominal_at DESC
LIMIT %(limit)s;
