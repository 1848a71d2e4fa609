-- Named statements of durable execution (migration 0020): a run's step records, the wake-up of
-- suspended tasks whose time came, and the signals. engine/store/steps.py runs them.
--
-- Every write of a step names the run's lease token: the task row is locked FOR SHARE while the
-- record is written, so a reclaim (or a cancel, or another run's claim) either waits for the
-- record's commit or, committed first, makes the lock's re-check of the row find another token
-- and write nothing. A record the fence refused is a stale write, counted by the caller.

-- name: task_steps_read
-- A task's step records in the order its handler made them, and the database's clock (a
-- recorded sleep compares its end with it).
SELECT position, name, occurrence, type, result, lease_token, attempt, recorded_at, now() AS db_now
FROM skiplock.task_steps
WHERE task_id = %(task_id)s
ORDER BY position;

-- name: _step_fence
fence AS MATERIALIZED (
    SELECT id FROM skiplock.tasks
    WHERE id = %(task_id)s AND lease_token = %(token)s AND state IN ('running', 'cancelling')
    FOR SHARE
)

-- name: task_step_record
-- One step record, fenced. Nothing returned: refused (the claim was lost) or, written again after
-- a lost answer, already there (the caller reads which).
WITH {{_step_fence}}
INSERT INTO skiplock.task_steps (task_id, position, name, occurrence, type, result, lease_token, attempt)
SELECT id, %(position)s, %(name)s, %(occurrence)s, %(type)s, %(result)s::jsonb, %(token)s, %(attempt)s
FROM fence
ON CONFLICT (task_id, position) DO NOTHING
RETURNING position;

-- name: task_step_lock_timeout
-- A record written while the run's own transaction (ctx.transaction()) is open, on another
-- connection: that transaction may hold the task's row (it enqueued a child that depends on the
-- running task), which the record would then wait for until the run ends, which waits for the
-- record. A reclaim, a cancel or a claim holds the row for milliseconds.
SET LOCAL lock_timeout = '5s';

-- name: task_step_resolve
-- A wait recorded when it began (a signal's), now resolved by the run that found it over: its
-- result becomes what the wait returned, fenced as a record.
WITH {{_step_fence}}
UPDATE skiplock.task_steps AS s
SET result = %(result)s::jsonb
FROM fence
WHERE s.task_id = fence.id AND s.position = %(position)s
RETURNING s.position;

-- name: task_step_time
-- The end of a sleep of `seconds` from now on the database's clock (in a suspension's
-- transaction, the same now() as the outcome written with it).
SELECT now() + %(seconds)s::float8 * interval '1 second';

-- name: task_awaited_insert
-- The edges of ctx.wait_for_tasks: the task depends on the tasks it awaits, as a dependent of
-- depends_on does (migration 0017); returns the awaited tasks that were not awaited already.
INSERT INTO skiplock.task_dependencies (task_id, parent_id)
SELECT %(task_id)s, parent_id FROM unnest(%(parent_ids)s::uuid[]) AS p(parent_id)
ON CONFLICT DO NOTHING
RETURNING parent_id;

-- name: task_steps_list
-- The step log as the API, the CLI and the console show it, bounded, in call order.
SELECT position, name, occurrence, type, result, lease_token, attempt, recorded_at
FROM skiplock.task_steps
WHERE task_id = %(task_id)s AND position > %(after)s
ORDER BY position
LIMIT %(limit)s;

-- name: task_wake_due
-- Suspended tasks whose time came (a sleep's end, a signal wait's timeout) go back to 'queued',
-- up to `limit` per statement, earliest first. SKIP LOCKED: every worker and scheduler runs it.
WITH due AS MATERIALIZED (
    SELECT id FROM skiplock.tasks
    WHERE state = 'waiting' AND wake_at <= now()
    ORDER BY wake_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), woken AS (
    UPDATE skiplock.tasks AS t
    SET state = 'queued', run_after = now(), updated_at = now(), event_seq = t.event_seq + 1
    FROM due
    WHERE t.id = due.id AND t.state = 'waiting'
    RETURNING t.id, t.queue, t.event_seq, t.attempts, t.suspended
), events AS (
    INSERT INTO skiplock.task_events (task_id, seq, type, attempt, data)
    SELECT id, event_seq, 'queued', attempts,
           jsonb_build_object('reason', CASE suspended WHEN 'signal' THEN 'signal wait timed out'
                                                        ELSE 'sleep ended' END)
    FROM woken
), wake AS (
    SELECT pg_notify(%(channel)s, queue) FROM (SELECT DISTINCT queue FROM woken) AS q
)
SELECT count(*) FROM woken WHERE (SELECT count(*) FROM wake) >= 0;

-- name: signal_lock
-- The first statement of a send, in the sender's transaction: its isolation (a send needs READ
-- COMMITTED: the wake-up below must see suspensions committed while it waited for this lock),
-- and the signal's lock, held to the commit. A suspension for the same signal takes the lock
-- shared, without waiting (signal_try_lock): it then knows no send is in flight, and any send
-- that comes later waits for the suspension's commit and wakes it.
SELECT current_setting('transaction_isolation'),
       pg_advisory_xact_lock(hashtext(%(namespace)s), hashtext(%(name)s)) IS NULL;

-- name: signal_try_lock
SELECT pg_try_advisory_xact_lock_shared(hashtext(%(namespace)s), hashtext(%(name)s));

-- name: signal_send
-- The signal, unless one of that name exists (the first send wins: a second one changes
-- nothing), and the tasks waiting for it queued now, in the sender's transaction.
WITH sent AS (
    INSERT INTO skiplock.signals (name, payload) VALUES (%(name)s, %(payload)s::jsonb)
    ON CONFLICT (name) DO NOTHING
    RETURNING name
), woken AS (
    UPDATE skiplock.tasks AS t
    SET state = 'queued', run_after = now(), updated_at = now(), event_seq = t.event_seq + 1
    WHERE t.state = 'waiting' AND t.awaited_signal = %(name)s
    RETURNING t.id, t.queue, t.event_seq, t.attempts
), events AS (
    INSERT INTO skiplock.task_events (task_id, seq, type, attempt, data)
    SELECT id, event_seq, 'queued', attempts, jsonb_build_object('reason', 'signal', 'signal', %(name)s::text)
    FROM woken
), wake AS (
    SELECT pg_notify(%(channel)s, queue) FROM (SELECT DISTINCT queue FROM woken) AS q
)
SELECT (SELECT count(*) FROM sent) AS created, (SELECT count(*) FROM woken) AS woken
WHERE (SELECT count(*) FROM wake) >= 0;

-- name: signal_get
SELECT name, payload, sent_at FROM skiplock.signals WHERE name = %(name)s;

-- name: signal_list
-- Signals newest first, optionally those whose name starts with `prefix`; keyset by (sent_at, name).
SELECT name, payload, sent_at FROM skiplock.signals
WHERE (%(prefix)s::text IS NULL OR starts_with(name, %(prefix)s::text))
  AND (%(before_at)s::timestamptz IS NULL OR (sent_at, name) < (%(before_at)s::timestamptz, %(before_name)s::text))
ORDER BY sent_at DESC, name DESC
LIMIT %(limit)s;

-- name: signal_delete_old
-- Retention: one batch of signals sent longer ago than `older_than` seconds, oldest first.
WITH doomed AS MATERIALIZED (
    SELECT name FROM skiplock.signals
    WHERE sent_at < now() - %(older_than)s * interval '1 second'
    ORDER BY sent_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM skiplock.signals AS s USING doomed WHERE s.name = doomed.name
RETURNING s.name;
