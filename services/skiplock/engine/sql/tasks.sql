-- Named statements for the task lifecycle. engine/store/tasks.py runs them, one method per statement.
--
-- Every transition bumps tasks.event_seq and inserts the matching task_events row in the same
-- statement, so a task's events are gap-free and commit or roll back with the transition.
-- Every write that extends or ends a claim names the lease token and the states it expects;
-- a row it did not touch is a stale write, counted by the caller.
-- A SELECT-only CTE runs only when referenced: the wake-up CTEs are pulled in by a scalar subquery.

-- name: task_insert
-- Tasks come as parallel arrays (one or many). A taken idempotency key inserts nothing;
-- the caller looks the existing id up in a second statement (a new snapshot sees the winner).
-- The tasks_inserted trigger (migration 0007) writes each new task's 'queued' event and wakes
-- the workers (on commit, one notification per queue however many rows).
INSERT INTO skiplock.tasks
    (id, kind, queue, priority, payload, max_attempts, run_after, idempotency_key, event_seq, concurrency_key,
     trace_context)
SELECT id, kind, queue, priority, payload, max_attempts,
       coalesce(run_at, now() + coalesce(delay, 0) * interval '1 second'), idempotency_key, 1, concurrency_key,
       trace_context
FROM {{_task_insert_arrays}}
ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id;

-- name: _task_insert_arrays
-- the tasks to insert as rows of the parallel arrays (task_insert, routed_task_insert)
unnest(
    %(ids)s::uuid[], %(kinds)s::text[], %(queues)s::text[], %(priorities)s::smallint[],
    %(payloads)s::jsonb[], %(max_attempts)s::integer[], %(delays)s::float8[],
    %(run_ats)s::timestamptz[], %(idempotency_keys)s::text[], %(concurrency_keys)s::text[],
    %(trace_contexts)s::jsonb[]
) AS i(id, kind, queue, priority, payload, max_attempts, delay, run_at, idempotency_key, concurrency_key,
       trace_context)

-- name: task_insert_one
-- task_insert for one task, with plain parameters.
INSERT INTO skiplock.tasks
    (id, kind, queue, priority, payload, max_attempts, run_after, idempotency_key, event_seq, concurrency_key,
     trace_context)
VALUES (%(id)s::uuid, %(kind)s::text, %(queue)s::text, %(priority)s::smallint, %(payload)s::jsonb,
        %(max_attempts)s::integer,
        coalesce(%(run_at)s::timestamptz, now() + coalesce(%(delay)s::float8, 0) * interval '1 second'),
        %(idempotency_key)s::text, 1, %(concurrency_key)s::text, %(trace_context)s::jsonb)
ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id;

-- name: task_copy_in
-- Bulk enqueue of plain tasks (store.copy_many); run_after takes its now() default, created_at
-- and updated_at their clock_timestamp() one, which makes Postgres insert row by row, the faster
-- way for this table (migration 0009); the tasks_inserted trigger writes their events and wakes
-- the workers.
COPY skiplock.tasks (id, kind, queue, priority, payload, max_attempts, event_seq, concurrency_key, trace_context)
FROM STDIN;

-- name: task_parents_watch
-- The parents of tasks enqueued with depends_on, locked in id order (two enqueues of shared
-- parents lock them in one order) and marked watched: from now on a change of their state runs
-- tasks_watched (migration 0017), and until this transaction commits their outcomes wait (a
-- worker's outcome write skips the locked row and writes it again), so none ends unseen. Their
-- states as locked, the newest.
-- Claims that skipped a queued parent while it was locked here are woken again at the commit.
-- A parent already watched is only locked, not written again: a fan-out of n children enqueued
-- in one transaction (ctx.enqueue) would otherwise leave n versions of the parent's row, each
-- read by the next lookup of it. Each with its state as locked and its queue.
WITH locked AS MATERIALIZED (
    SELECT id, state, queue, watched FROM skiplock.tasks WHERE id = ANY(%(ids)s::uuid[]) ORDER BY id FOR UPDATE
), marked AS (
    UPDATE skiplock.tasks AS t
    SET watched = true
    FROM locked AS p
    WHERE t.id = p.id AND NOT p.watched
)
SELECT id, state, queue FROM locked
WHERE (SELECT count(pg_notify(%(channel)s, queue))
       FROM (SELECT DISTINCT queue FROM locked WHERE state = 'queued') AS q) >= 0;

-- name: task_insert_dependent
-- task_insert for tasks with parents: each with its first state and its counters, decided by the
-- caller from task_parents_watch's states.
INSERT INTO skiplock.tasks
    (id, kind, queue, priority, payload, max_attempts, run_after, idempotency_key, event_seq, concurrency_key,
     trace_context, state, waiting_on, failed_parents, on_parent_failure, cancelled_by_parent, finished_at, last_error)
SELECT id, kind, queue, priority, payload, max_attempts,
       coalesce(run_at, now() + coalesce(delay, 0) * interval '1 second'), idempotency_key, 1, concurrency_key,
       trace_context, state, waiting_on, failed_parents, on_parent_failure, state = 'cancelled',
       CASE WHEN state = 'cancelled' THEN now() END, last_error
FROM {{_task_insert_dependent_arrays}}
ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id;

-- name: _task_insert_dependent_arrays
-- the tasks with parents to insert as rows of the parallel arrays (task_insert_dependent,
-- routed_task_insert_dependent)
unnest(
    %(ids)s::uuid[], %(kinds)s::text[], %(queues)s::text[], %(priorities)s::smallint[],
    %(payloads)s::jsonb[], %(max_attempts)s::integer[], %(delays)s::float8[],
    %(run_ats)s::timestamptz[], %(idempotency_keys)s::text[], %(concurrency_keys)s::text[],
    %(trace_contexts)s::jsonb[], %(states)s::text[], %(waiting_on)s::integer[], %(failed_parents)s::integer[],
    %(on_parent_failures)s::text[], %(last_errors)s::text[]
) AS i(id, kind, queue, priority, payload, max_attempts, delay, run_at, idempotency_key, concurrency_key,
       trace_context, state, waiting_on, failed_parents, on_parent_failure, last_error)

-- name: task_dependencies_insert
INSERT INTO skiplock.task_dependencies (task_id, parent_id)
SELECT * FROM unnest(%(task_ids)s::uuid[], %(parent_ids)s::uuid[])
ON CONFLICT DO NOTHING;

-- name: task_parents
-- A task's parents as its handler reads them (ctx.parents()): a bounded read, in id order.
SELECT t.id, t.kind, t.state, t.result, t.last_error
FROM skiplock.task_dependencies AS d
JOIN skiplock.tasks AS t ON t.id = d.parent_id
WHERE d.task_id = %(id)s
ORDER BY d.parent_id
LIMIT %(limit)s;

-- name: task_outcomes
-- The tasks of `ids` as ctx.parents() shows a parent (ctx.wait_for_tasks), in id order.
SELECT id, kind, state, result, last_error FROM skiplock.tasks WHERE id = ANY(%(ids)s::uuid[]) ORDER BY id;

-- name: task_children
-- The tasks that depend on a task, in id order, bounded.
SELECT d.task_id
FROM skiplock.task_dependencies AS d
WHERE d.parent_id = %(id)s
ORDER BY d.task_id
LIMIT %(limit)s;

-- name: task_parent_ids
SELECT d.parent_id
FROM skiplock.task_dependencies AS d
WHERE d.task_id = %(id)s
ORDER BY d.parent_id
LIMIT %(limit)s;

-- name: task_watch
-- skiplock.wait: the task's state changes notify its waiters from now on; its state now. A claim
-- meeting the row while this holds it skips it (SKIP LOCKED) and may find the queue empty: a
-- queued task's queue is woken again, at this commit.
WITH watched AS (
    UPDATE skiplock.tasks SET watched = true WHERE id = %(id)s RETURNING state, queue
)
SELECT state, (SELECT count(pg_notify(%(channel)s, queue)) FROM watched WHERE state = 'queued') AS woken
FROM watched;

-- name: task_state
SELECT state FROM skiplock.tasks WHERE id = %(id)s;

-- name: queue_kind_register
-- A (queue, kind) pair for queue_kinds (0015), committed on its own before a handler's
-- transaction inserts such a task: the insert trigger's registration of a new pair holds the
-- pair until its transaction ends, and other enqueuers of that pair wait for it; a run's
-- transaction can last long (a zombie's, until its connection dies).
INSERT INTO skiplock.queue_kinds (queue, kind) VALUES (%(queue)s, %(kind)s) ON CONFLICT DO NOTHING;

-- name: task_ids_by_idempotency_key
SELECT idempotency_key, id FROM skiplock.tasks WHERE idempotency_key = ANY(%(keys)s::text[]);

-- name: _claim_ctes
-- One statement: pick up to `limit` claimable rows, skipping rows other claimers hold, and lease
-- them. MATERIALIZED keeps the LIMIT honest (an IN (subquery) can be re-run and exceed it).
-- One index-ordered scan per queue (queue = ANY(...) would read and sort every queued row); a
-- multi-queue claim may lock up to `limit` rows per queue for the statement and lease the best.
-- The UPDATE fetches the locked rows by their ctids (one TID scan over the array, no join for
-- the planner to choose: the worker runs this statement with a generic plan, in which the
-- LIMIT is unknown and a join by ctid turns into a hash join over every queued row). A row
-- whose ctid is not visible (updated between the snapshot and the lock) is simply not claimed
-- this time: SKIP LOCKED never waits, and the state check stays in the UPDATE. It is written as a
-- CASE so that it implies no partial index's predicate: `state = 'queued' AND limited` would let
-- the planner read all of tasks_parked instead of the TID scan whenever the statistics predate
-- the parked tasks (an index it believes empty costs less than ten TIDs), and the same holds for
-- tasks_claimable after a burst. The same form in task_claim_limited.
-- A picked task of a kind with a limit is not claimed but parked (migration 0016): it leaves
-- tasks_claimable for tasks_parked, where task_claim_limited takes it under its group's limit.
-- `park_limit` more rows may be picked for that: after a claim that parked some, the next parks
-- a backlog of limited tasks in a few statements, not `limit` at a time (the tasks of other
-- groups behind it wait for their turn in the rotation until they are parked).
-- `lanes` (SKIPLOCK_CLAIM_LANES; 0: no bound) bounds the claims of one queue that run at once,
-- across every worker: a claim takes a free lane of each queue with pg_try_advisory_xact_lock
-- (which never waits) and holds it to its commit; a queue whose lanes are all taken is left out of
-- this claim, and counted in the summary row so that the worker looks again in a moment. Claims
-- of one queue made at the same moment overlap at its head: each steps over the rows the others
-- hold, and the rows it follows to their newer version stay locked, away from their owner's
-- outcome, until it commits. The CASE takes no lane of a paused queue.
claimed_queues AS MATERIALIZED (
    SELECT q.name,
           CASE WHEN q.name IN (SELECT name FROM skiplock.pauses WHERE scope = 'queue') THEN 'paused'
                WHEN %(lanes)s::integer = 0
                  OR EXISTS (SELECT FROM generate_series(1, %(lanes)s::integer) AS lane
                             WHERE pg_try_advisory_xact_lock(hashtext('skiplock.claim_lanes ' || q.name), lane))
                THEN 'open'
                ELSE 'crowded'
           END AS lane
    FROM unnest(%(queues)s::text[]) AS q(name)
), picked AS MATERIALIZED (
    SELECT c.row_ctid, c.kind IN (SELECT l.kind FROM skiplock.limits AS l) AS park, c.priority, c.run_after, c.id
    FROM claimed_queues AS q
    CROSS JOIN LATERAL (
        SELECT t.ctid AS row_ctid, t.id, t.priority, t.run_after, t.kind
        FROM skiplock.tasks AS t
        WHERE t.state = 'queued' AND NOT t.limited
          AND t.queue = q.name
          AND t.run_after <= now()
          AND t.kind NOT IN (SELECT name FROM skiplock.pauses WHERE scope = 'kind')
        ORDER BY t.priority DESC, t.run_after, t.id
        LIMIT %(limit)s::integer + %(park_limit)s::integer
        FOR UPDATE SKIP LOCKED
    ) AS c
    WHERE q.lane = 'open'
    ORDER BY c.priority DESC, c.run_after, c.id
    LIMIT %(limit)s::integer + %(park_limit)s::integer
), taken AS MATERIALIZED (
    SELECT row_ctid FROM picked WHERE NOT park ORDER BY priority DESC, run_after, id LIMIT %(limit)s
), claimed AS (
    UPDATE skiplock.tasks AS t
    SET {{_claim_set}}
    WHERE t.ctid = ANY (ARRAY(SELECT row_ctid FROM taken))
      AND CASE WHEN t.state = 'queued' THEN NOT t.limited END
    RETURNING {{_claim_returning}}
), claim_events AS (
    {{_claim_events}}
), parked AS (
    UPDATE skiplock.tasks AS t
    SET limited = true
    WHERE t.ctid = ANY (ARRAY(SELECT row_ctid FROM picked WHERE park))
      AND CASE WHEN t.state = 'queued' THEN NOT t.limited END
    RETURNING t.kind, t.concurrency_key
), parked_groups AS (
    -- in key order, so that two claims parking into the same groups lock their rows in one
    -- order; a drained group is awake again. The row lock waits only for a task_claim_limited
    -- that holds the group, and that never waits for anything.
    INSERT INTO skiplock.limit_groups AS g (kind, concurrency_key)
    SELECT DISTINCT kind, concurrency_key FROM parked ORDER BY kind, concurrency_key
    ON CONFLICT (kind, concurrency_key) DO UPDATE SET drained = false WHERE g.drained
)

-- name: _claim_set
-- the lease a claim writes (task_claim and task_claim_limited)
state = 'running',
        attempts = t.attempts + 1,
        -- the budget in force, fixed at the first claim: the task's own, else its kind's as the
        -- claiming worker declares it (workers know the kinds; the API shows the row)
        max_attempts = coalesce(t.max_attempts, (%(kind_max_attempts)s::jsonb ->> t.kind)::integer),
        lease_token = nextval('skiplock.lease_tokens'),
        lease_owner = %(owner)s,
        lease_until = now() + %(lease_seconds)s * interval '1 second',
        started_at = coalesce(t.started_at, now()),
        updated_at = now(),
        event_seq = t.event_seq + 1

-- name: _claim_returning
t.id, t.kind, t.queue, t.payload, t.attempts, t.lease_token, t.cursor, t.event_seq,
              extract(epoch FROM now() - t.run_after)::float8 AS waited_seconds, t.concurrency_key, t.limited,
              t.trace_context, t.priority, t.run_after

-- name: _claim_events
INSERT INTO skiplock.task_events (task_id, seq, type, lease_token, attempt, data)
    SELECT id, event_seq, 'running', lease_token, attempts, jsonb_build_object('owner', %(owner)s::text)
    FROM claimed

-- name: task_claim
-- The claimed tasks, then one summary row. Each row has the columns of model.ClaimedTask in its
-- order (NULL in the summary row), then those of store/tasks.py's ClaimSummary (NULL in a task's row):
-- `parked`, the tasks parked; `limited_work`, whether a group of limited tasks may have work
-- (task_claim_limited has something to look at); `crowded_queues`, the queues left out because
-- every lane was taken. One result, not two statements: the summary reads this statement's CTEs.
WITH {{_claim_ctes}}
-- in claim order (the UPDATE returns them in the order of their ctids); the summary row last
(SELECT id, kind, queue, payload, attempts AS attempt, lease_token, cursor, waited_seconds, limited,
        trace_context, NULL::integer AS parked, NULL::boolean AS limited_work, NULL::integer AS crowded_queues
 FROM claimed
 ORDER BY priority DESC, run_after, id)
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       (SELECT count(*) FROM parked)::integer,
       EXISTS (SELECT FROM skiplock.limit_groups WHERE NOT drained),
       (SELECT count(*) FROM claimed_queues WHERE lane = 'crowded')::integer;

-- name: limit_group_lock
-- The first statement of a claim of limited tasks, in its transaction: lock the groups to look at,
-- least recently visited first; a group another claim holds is skipped. Held to the commit, the
-- locks make task_claim_limited, run next in a snapshot taken after them, see every run of these
-- groups that another claim started (in one statement, the snapshot would predate the lock).
SELECT g.kind, g.concurrency_key
FROM skiplock.limit_groups AS g
WHERE NOT g.drained
  AND g.kind NOT IN (SELECT name FROM skiplock.pauses WHERE scope = 'kind')
ORDER BY g.served_at
LIMIT %(groups)s
FOR UPDATE SKIP LOCKED;

-- name: task_claim_limited
-- The second statement: into the groups limit_group_lock locked (in its order), up to `limit`
-- tasks, round robin: each group's best first, then each group's second, and so on. A group's
-- room is the least of its concurrency limit less its live runs (a run whose lease expired no
-- longer counts), the whole tokens of its bucket (refilled on the database's clock), and
-- `limit`. A group without a limit row (deleted since its tasks were parked) is not held back.
-- Each group visited moves to the back of the rotation, unless it had room and the round robin
-- left its tasks for the next claim; one that had room and no parked task is marked drained.
-- Returns the tasks, then a summary row, as task_claim does (the summary's column is that of
-- store/tasks.py's LimitedClaimSummary): `token_wait_seconds`, the seconds until the first
-- throttled bucket has a token again (NULL: none is waiting for tokens).
WITH visit AS MATERIALIZED (
    SELECT v.turn, g.kind, g.concurrency_key, g.tokens, g.tokens_at, l.concurrency,
           l.rate_count / l.rate_seconds AS rate,
           l.burst::float8 AS burst
    FROM unnest(%(kinds)s::text[], %(keys)s::text[]) WITH ORDINALITY AS v(kind, concurrency_key, turn)
    JOIN skiplock.limit_groups AS g ON g.kind = v.kind AND g.concurrency_key = v.concurrency_key
    LEFT JOIN skiplock.limits AS l ON l.kind = g.kind
), room AS MATERIALIZED (
    SELECT v.turn, v.kind, v.concurrency_key, v.rate, b.tokens_now,
           least(%(limit)s::integer,
                 CASE WHEN v.concurrency IS NULL THEN %(limit)s::integer
                      ELSE v.concurrency - (
                          SELECT count(*) FROM skiplock.tasks AS r
                          WHERE r.kind = v.kind AND r.concurrency_key = v.concurrency_key
                            AND r.limited AND r.state IN ('running', 'cancelling')
                            AND r.lease_until > now())
                 END,
                 CASE WHEN b.tokens_now IS NULL THEN %(limit)s::integer ELSE floor(b.tokens_now) END
           )::integer AS room
    FROM visit AS v
    CROSS JOIN LATERAL (
        SELECT CASE WHEN v.rate IS NOT NULL
                    THEN least(v.burst, coalesce(v.tokens + extract(epoch FROM now() - v.tokens_at) * v.rate,
                                                 v.burst)) END AS tokens_now
    ) AS b
), offered AS MATERIALIZED (
    SELECT c.row_ctid, g.turn, g.kind, g.concurrency_key, c.rank
    FROM room AS g
    CROSS JOIN LATERAL (
        SELECT p.row_ctid, row_number() OVER (ORDER BY p.priority DESC, p.run_after, p.id) AS rank
        FROM (
            SELECT t.row_ctid, t.priority, t.run_after, t.id
            FROM unnest(%(queues)s::text[]) AS q(name)
            CROSS JOIN LATERAL (
                SELECT t.ctid AS row_ctid, t.priority, t.run_after, t.id
                FROM skiplock.tasks AS t
                WHERE t.state = 'queued' AND t.limited
                  AND t.kind = g.kind AND t.concurrency_key = g.concurrency_key AND t.queue = q.name
                  AND t.run_after <= now()
                ORDER BY t.priority DESC, t.run_after, t.id
                LIMIT g.room
                FOR UPDATE SKIP LOCKED
            ) AS t
            WHERE q.name NOT IN (SELECT name FROM skiplock.pauses WHERE scope = 'queue')
            ORDER BY t.priority DESC, t.run_after, t.id
            LIMIT g.room
        ) AS p
    ) AS c
    WHERE g.room > 0
), chosen AS MATERIALIZED (
    SELECT row_ctid FROM offered ORDER BY rank, turn LIMIT %(limit)s::integer
), claimed AS (
    UPDATE skiplock.tasks AS t
    SET {{_claim_set}}
    -- a CASE: the TID scan whatever the statistics say (see _claim_ctes)
    WHERE t.ctid = ANY (ARRAY(SELECT row_ctid FROM chosen)) AND CASE WHEN t.state = 'queued' THEN t.limited END
    RETURNING {{_claim_returning}}
), claim_events AS (
    {{_claim_events}}
), tally AS MATERIALIZED (
    -- per group visited: its room and tokens, the tasks it offered and those started. One
    -- aggregate, not joins of these CTEs: with a generic plan each is estimated at a row, and the
    -- nested loops then read one CTE once per row of the other (groups x tasks per claim).
    SELECT kind, concurrency_key, max(room) AS room, max(tokens_now) AS tokens_now,
           sum(offered)::integer AS offered, sum(started)::integer AS started
    FROM (
        SELECT kind, concurrency_key, room, tokens_now, 0 AS offered, 0 AS started FROM room
        UNION ALL
        SELECT kind, concurrency_key, NULL, NULL, 1, 0 FROM offered
        UNION ALL
        SELECT kind, concurrency_key, NULL, NULL, 0, 1 FROM claimed
    ) AS parts
    GROUP BY kind, concurrency_key
), visited AS (
    UPDATE skiplock.limit_groups AS g
    SET tokens = r.tokens_now - r.started,
        tokens_at = CASE WHEN r.tokens_now IS NOT NULL THEN now() END,
        served_at = CASE WHEN r.room <= 0 OR r.started > 0 OR r.offered = 0 THEN now() ELSE g.served_at END,
        -- had room, and no parked task at all (in any queue): asleep until a claim parks one
        drained = r.room > 0 AND r.offered = 0
                  AND NOT EXISTS (SELECT FROM skiplock.tasks AS t
                                  WHERE t.state = 'queued' AND t.limited
                                    AND t.kind = r.kind AND t.concurrency_key = r.concurrency_key)
    FROM tally AS r
    WHERE g.kind = r.kind AND g.concurrency_key = r.concurrency_key
)
SELECT id, kind, queue, payload, attempts AS attempt, lease_token, cursor, waited_seconds, limited,
       trace_context, NULL::float8 AS token_wait_seconds
FROM claimed
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       (SELECT min((1 - r.tokens_now) / r.rate) FROM room AS r WHERE r.tokens_now < 1);

-- name: task_heartbeat
-- Renews every claim this worker still holds in one statement. A claim missing from the result
-- was lost (reclaimed, or cancelled and reclaimed); a row in 'cancelling' tells the handler to stop;
-- 'busy': another transaction held the row (see _settle_ctes), so it was not renewed this time.
WITH input AS (
    SELECT * FROM unnest(%(ids)s::uuid[], %(tokens)s::bigint[]) AS i(id, token)
), probed AS MATERIALIZED (
    -- One primary-key probe per claim (the lateral subquery runs per input row, in input order),
    -- never a scan of every claim in flight. SKIP LOCKED, as the settle: a row held by another
    -- transaction is not waited for.
    SELECT i.token, h.id, h.lease_token, h.state, h.limited, h.lease_until
    FROM (SELECT * FROM input ORDER BY id) AS i
    CROSS JOIN LATERAL (
        SELECT t.id, t.lease_token, t.state, t.limited, t.lease_until
        FROM skiplock.tasks AS t
        WHERE t.id = i.id
        OFFSET 0
        FOR UPDATE SKIP LOCKED
    ) AS h
), renewed AS (
    UPDATE skiplock.tasks AS t
    SET lease_until = now() + %(lease_seconds)s * interval '1 second'
    FROM probed AS p
    -- by id, not ctid: a row locked after a concurrent update committed is a newer version than
    -- the one the snapshot saw. The fence, checked on the row as locked (outside the probe, so
    -- that the only index the probe can use is the primary key).
    WHERE t.id = p.id AND p.lease_token = p.token AND p.state IN ('running', 'cancelling')
      -- a limited run whose lease ran out has given its group's slot to another run: it is lost
      -- (its outcome still stands until the reclaim), and never counts again
      AND (NOT p.limited OR p.lease_until > now())
    RETURNING t.id, t.state
), busy AS (
    -- held by another transaction when probed, and still this worker's claim as the snapshot saw
    -- it (a primary-key probe per claim not renewed, as in the settle's busy)
    SELECT i.id
    FROM input AS i
    WHERE NOT EXISTS (SELECT 1 FROM probed AS p WHERE p.id = i.id)
      AND (SELECT t.lease_token = i.token AND t.state IN ('running', 'cancelling')
           FROM skiplock.tasks AS t WHERE t.id = i.id)
)
SELECT id, state FROM renewed
UNION ALL
SELECT id, 'busy' FROM busy;

-- name: _settle_ctes
-- Ends (or checkpoints, or gives back, or suspends) claims, many per round trip. outcome is one of
-- completed | failed | retry | step | released | suspend. The new state is decided under the row lock:
--   a completion stands (its work is done); otherwise a cancel request wins ('cancelled');
--   a failure stands; a retry past
--   max_attempts (the task's, else its kind's) or the total deadline fails; a suspension (durable
--   execution, migration 0020) waits ('waiting'), or is queued at once when what it waits for is
--   there already (`ready`, or its signal was sent); the rest go back to 'queued' after `delay`.
--   A suspension gives its attempt back, as a release does: waiting is not failing.
settle_input AS (
    -- one JSON array of {id, token, outcome, ...}: one parameter, encoded in C, instead of
    -- eleven arrays adapted element by element
    SELECT *
    FROM jsonb_to_recordset(%(settlements)s::jsonb)
        AS i(id uuid, token bigint, outcome text, result jsonb, error text, delay float8, cursor jsonb,
             progress real, message text, deadline_seconds float8, kind_max_attempts integer,
             traceback text, suspended text, wake_at timestamptz, awaited_signal text,
             waiting_on_add integer, ready boolean)
), decided AS MATERIALIZED (
    -- each claim found by one primary-key probe and locked, in id order. SKIP LOCKED: a row that
    -- another transaction holds is not waited for, but reported busy (below) and written again by
    -- the caller. Another worker's claim statement may hold it for a moment: a claim that read the
    -- row as queued before this claim committed follows it to its new version, locks that,
    -- finds it no longer queued and passes on, and keeps the lock until it commits. A LEFT JOIN,
    -- so that the claims the probe skipped stay in this one materialized set (held is false)
    -- for busy, instead of a second set and an anti-join on every settle.
    SELECT i.id, i.token, i.outcome, i.result, i.error, i.delay, i.cursor, i.progress, i.message, i.traceback,
           i.suspended, i.wake_at, i.awaited_signal, i.waiting_on_add,
           t.state IS NOT NULL AS held, t.state, t.lease_token, t.attempts AS attempt,
           CASE
               WHEN i.outcome = 'completed' THEN 'completed'
               WHEN t.state = 'cancelling' THEN 'cancelled'
               WHEN i.outcome = 'failed' THEN 'failed'
               WHEN i.outcome = 'retry' AND (
                        t.attempts >= coalesce(t.max_attempts, i.kind_max_attempts, 3)
                        -- least() skips NULLs: the earlier of the task's and the kind's deadline
                     OR now() + i.delay * interval '1 second'
                            > least(t.deadline, t.created_at + i.deadline_seconds * interval '1 second'))
                   THEN 'failed'
               WHEN i.outcome = 'suspend' AND NOT i.ready
                    AND NOT EXISTS (SELECT FROM skiplock.signals AS s WHERE s.name = i.awaited_signal)
                   THEN 'waiting'
               ELSE 'queued'
           END AS new_state
    FROM (SELECT * FROM settle_input ORDER BY id) AS i
    LEFT JOIN LATERAL (
        SELECT t.state, t.lease_token, t.attempts, t.max_attempts, t.deadline, t.created_at
        FROM skiplock.tasks AS t
        WHERE t.id = i.id
        OFFSET 0  -- keeps the subquery per input row: a probe by id, not a join over all claims
        FOR UPDATE SKIP LOCKED
    ) AS t ON true
), busy AS (
    -- held by another transaction when probed, and still this claim as the snapshot saw it: to be
    -- written again (its fence is checked then); a claim lost before this statement is refused now
    -- (a scalar subquery: a primary-key probe per claim not held, run only for those. As an
    -- EXISTS with the state in its WHERE, the generic plan read every leased task by
    -- tasks_leased on every settle, against the whole set or per busy claim.)
    SELECT d.id
    FROM decided AS d
    WHERE NOT d.held
      AND (SELECT t.lease_token = d.token AND t.state IN ('running', 'cancelling')
           FROM skiplock.tasks AS t WHERE t.id = d.id)
), settled AS (
    UPDATE skiplock.tasks AS t
    SET state = d.new_state,
        attempts = CASE
                       WHEN d.outcome = 'suspend' AND d.new_state IN ('queued', 'waiting')
                           THEN greatest(t.attempts - 1, 0)
                       WHEN d.new_state <> 'queued' THEN t.attempts
                       WHEN d.outcome = 'step' THEN 0          -- a saved step is progress, not failure
                       WHEN d.outcome = 'released' THEN greatest(t.attempts - 1, 0)
                       ELSE t.attempts
                   END,
        run_after = CASE WHEN d.new_state = 'queued'
                         THEN now() + coalesce(d.delay, 0) * interval '1 second'
                         ELSE t.run_after END,
        {{_settle_written_fields}},
        suspended = CASE WHEN d.new_state = 'waiting' THEN d.suspended END,
        wake_at = CASE WHEN d.new_state = 'waiting' THEN d.wake_at END,
        awaited_signal = CASE WHEN d.new_state = 'waiting' THEN d.awaited_signal END,
        -- a wait for tasks counts them as parents (the dependency trigger queues it after the
        -- last), and never cancels for a failed one: the handler reads their outcomes
        waiting_on = t.waiting_on + coalesce(d.waiting_on_add, 0),
        on_parent_failure = CASE WHEN d.waiting_on_add IS NOT NULL THEN 'run' ELSE t.on_parent_failure END,
        lease_owner = NULL,
        lease_until = NULL,
        -- back in tasks_claimable if queued again: the next claim parks it under the limit then
        limited = false,
        finished_at = CASE WHEN d.new_state IN ('completed', 'failed', 'cancelled') THEN now() END,
        updated_at = now(),
        event_seq = t.event_seq + 1
    FROM decided AS d
    -- by id, not ctid: a row locked after a concurrent update committed (a heartbeat, a cancel)
    -- is a newer version than the one the snapshot saw. The fence, checked on the row as locked
    -- (outside the probe, so that the only index the probe can use is the primary key).
    WHERE t.id = d.id AND d.lease_token = d.token AND d.state IN ('running', 'cancelling')
    RETURNING t.id, t.state, t.event_seq, t.lease_token, d.attempt, d.outcome, d.error, d.delay,
              d.traceback, d.suspended, d.wake_at, d.awaited_signal
), settle_events AS (
    INSERT INTO skiplock.task_events (task_id, seq, type, lease_token, attempt, data)
    SELECT id, event_seq,
           CASE WHEN outcome = 'suspend' AND state IN ('queued', 'waiting') THEN 'suspended'
                WHEN state <> 'queued' THEN state
                WHEN outcome = 'retry' THEN 'retrying'
                WHEN outcome = 'step' THEN 'checkpoint'
                ELSE 'released' END,
           lease_token, attempt,
           CASE WHEN error IS NULL AND outcome = 'completed' THEN NULL
                ELSE jsonb_strip_nulls(jsonb_build_object(
                         'outcome', outcome, 'error', error, 'traceback', traceback,
                         'delay', CASE WHEN state = 'queued' THEN delay END,
                         'suspended', suspended, 'wake_at', wake_at, 'signal', awaited_signal,
                         'waiting', CASE WHEN outcome = 'suspend' THEN state = 'waiting' END)) END
    FROM settled
)

-- name: _settle_written_fields
-- what an outcome writes besides its state, attempts and times (task_settle, routed_task_settle)
result = CASE WHEN d.new_state = 'completed' THEN d.result ELSE t.result END,
        last_error = coalesce(d.error, t.last_error),
        cursor = CASE WHEN d.outcome = 'step' THEN d.cursor ELSE t.cursor END,
        progress = CASE WHEN d.outcome = 'step' THEN d.progress
                        WHEN d.new_state = 'completed' THEN 1
                        ELSE t.progress END,
        message = coalesce(d.message, t.message)

-- name: task_settle
-- {id: new state} of each outcome written; 'busy': another transaction held the row, write it again
WITH {{_settle_ctes}}
SELECT id, state FROM settled
UNION ALL
SELECT id, 'busy' FROM busy;

-- name: task_outcome_stands
-- After an outcome write whose answer was lost (the connection broke after the statement was
-- sent), which of these claims (id, lease token) already have an outcome written: an event of
-- that lease written by task_settle, which is a completion, or records its outcome in
-- data.outcome (a reclaim's, a cancel request's and the claim's own event do neither). Returns
-- each such task's state now.
SELECT t.id, t.state
FROM unnest(%(ids)s::uuid[], %(tokens)s::bigint[]) AS i(id, token)
JOIN skiplock.tasks AS t ON t.id = i.id
WHERE EXISTS (SELECT 1 FROM skiplock.task_events AS e
              WHERE e.task_id = i.id AND e.lease_token = i.token
                AND (e.type = 'completed' OR e.data ? 'outcome'));

-- name: task_reclaim_expired
-- The reclaim. Claims whose lease ran out go back to 'queued' (the attempt is given back: a lost
-- lease is not the handler's failure) or to 'failed' once the reclaim budget or the deadline is
-- spent; an expired 'cancelling' claim becomes 'cancelled'. SKIP LOCKED: reclaims in several replicas never collide.
WITH expired AS MATERIALIZED (
    SELECT id
    FROM skiplock.tasks
    WHERE state IN ('running', 'cancelling') AND lease_until < now()
    ORDER BY lease_until
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), reclaimed AS (
    UPDATE skiplock.tasks AS t
    SET state = CASE
                    WHEN t.state = 'cancelling' THEN 'cancelled'
                    WHEN t.reclaims >= %(max_reclaims)s OR t.deadline < now() THEN 'failed'
                    ELSE 'queued'
                END,
        reclaims = t.reclaims + (t.state = 'running')::integer,
        attempts = CASE WHEN t.state = 'running' AND t.reclaims < %(max_reclaims)s
                             AND (t.deadline IS NULL OR t.deadline >= now())
                        THEN greatest(t.attempts - 1, 0) ELSE t.attempts END,
        last_error = CASE
                         WHEN t.state = 'cancelling' THEN t.last_error
                         ELSE format('lease of %%s expired (reclaim %%s)', t.lease_owner, t.reclaims + 1)
                     END,
        run_after = now(),
        lease_owner = NULL,
        lease_until = NULL,
        limited = false,
        finished_at = CASE WHEN t.state = 'cancelling' OR t.reclaims >= %(max_reclaims)s
                                OR t.deadline < now() THEN now() END,
        updated_at = now(),
        event_seq = t.event_seq + 1
    FROM expired
    WHERE t.id = expired.id
    RETURNING t.id, t.queue, t.state, t.kind, t.event_seq, t.lease_token, t.attempts, t.reclaims,
              t.last_error
), events AS (
    INSERT INTO skiplock.task_events (task_id, seq, type, lease_token, attempt, data)
    SELECT id, event_seq, CASE state WHEN 'queued' THEN 'reclaimed' ELSE state END,
           lease_token, attempts,
           jsonb_build_object('reason', 'lease expired', 'reclaims', reclaims, 'error', last_error)
    FROM reclaimed
), wake AS (
    SELECT pg_notify(%(channel)s, queue)
    FROM (SELECT DISTINCT queue FROM reclaimed WHERE state = 'queued') AS q
)
-- the condition is always true: it makes Postgres run the wake-up, which nothing else reads
SELECT id, queue, state, kind, attempts, last_error AS error
FROM reclaimed
WHERE (SELECT count(*) FROM wake) >= 0;

-- name: _task_filter
-- The operator's filter: a NULL parameter matches every task. Shared by the list and the bulk
-- actions, so `tasks list` with a filter shows what a bulk action with that filter would touch.
-- A queue or kind that never had a task is known from queue_kinds (0015) before tasks is read:
-- the EXISTS refers to no column of tasks, so Postgres checks it once (a one-time filter) and
-- reads nothing when it is false, where the walk along tasks_pkey would read the whole table.
(%(ids)s::uuid[] IS NULL OR id = ANY(%(ids)s::uuid[]))
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(queue)s::text IS NULL OR EXISTS (SELECT FROM skiplock.queue_kinds AS n WHERE n.queue = %(queue)s::text))
  AND (%(state)s::text IS NULL OR state = %(state)s::text)
  AND (%(kind)s::text IS NULL OR kind = %(kind)s::text)
  AND (%(kind)s::text IS NULL OR EXISTS (SELECT FROM skiplock.queue_kinds AS n WHERE n.kind = %(kind)s::text))
  AND (%(idempotency_key)s::text IS NULL OR idempotency_key = %(idempotency_key)s::text)
  AND (%(created_after)s::timestamptz IS NULL OR created_at >= %(created_after)s::timestamptz)
  AND (%(created_before)s::timestamptz IS NULL OR created_at < %(created_before)s::timestamptz)

-- name: _task_cancel_ctes
-- Cancels the tasks of `targets` (ids): a queued or waiting task at once; a running one is asked to stop
-- ('cancelling'): its worker learns it at the next heartbeat, and the reclaim finishes the job if
-- that worker is gone. Other states are left alone. One event per changed task, as the worker's
-- transitions write them, so fencing (event_seq) and the outbox see it.
cancelled AS (
    UPDATE skiplock.tasks AS t
    SET state = CASE WHEN t.state IN ('queued', 'waiting') THEN 'cancelled' ELSE 'cancelling' END,
        finished_at = CASE WHEN t.state IN ('queued', 'waiting') THEN now() END,
        cancelled_by_parent = false,
        updated_at = now(),
        event_seq = t.event_seq + 1
    FROM targets
    WHERE t.id = targets.id AND t.state IN ('waiting', 'queued', 'running')
    RETURNING t.id, t.state, t.event_seq, t.lease_token, t.attempts
), cancel_events AS (
    INSERT INTO skiplock.task_events (task_id, seq, type, lease_token, attempt, data)
    SELECT id, event_seq, state, lease_token, attempts, %(data)s::jsonb FROM cancelled
)

-- name: task_cancel
WITH targets AS (SELECT %(id)s::uuid AS id), {{_task_cancel_ctes}}
SELECT id, state FROM cancelled;

-- name: task_cancel_many
-- One batch of a bulk cancel: up to `limit` queued or running tasks of the filter, oldest first.
-- SKIP LOCKED: a row a worker is settling now is left for a repeat (if it is still running then).
WITH targets AS MATERIALIZED (
    SELECT id FROM skiplock.tasks
    WHERE state IN ('waiting', 'queued', 'running') AND {{_task_filter}}
    ORDER BY id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), {{_task_cancel_ctes}}
SELECT id, state FROM cancelled;

-- name: _task_unique_free
-- A failed or cancelled task of a unique key may be queued again unless it left tasks_unique (its
-- state is not among its unique_states) and another task holds the key now: the index would refuse
-- the second holder. The check is a read, so an enqueue of the key that commits in between still
-- makes the resume fail (unique_violation); what it spares is that error in the common case.
(t.unique_key IS NULL OR t.state = ANY (t.unique_states) OR NOT EXISTS (
    SELECT FROM skiplock.tasks AS h
    WHERE h.unique_key = t.unique_key AND h.state = ANY (h.unique_states) AND h.id <> t.id))

-- name: _task_resume_ctes
-- Puts the failed or cancelled tasks of `targets` back in the queue with a fresh attempt and
-- reclaim budget; one 'resumed' event each; one notification per queue woken.
resumed AS (
    UPDATE skiplock.tasks AS t
    -- a dependent whose parents are not all final waits for them again
    SET state = CASE WHEN t.waiting_on > 0 THEN 'waiting' ELSE 'queued' END, cancelled_by_parent = false,
        limited = false, attempts = 0, reclaims = 0, run_after = now(), finished_at = NULL,
        updated_at = now(), event_seq = t.event_seq + 1
    FROM targets
    WHERE t.id = targets.id AND t.state IN ('failed', 'cancelled') AND {{_task_unique_free}}
    RETURNING t.id, t.queue, t.state, t.event_seq
), resume_events AS (
    INSERT INTO skiplock.task_events (task_id, seq, type, attempt, data)
    SELECT id, event_seq, 'resumed', 0, %(data)s::jsonb FROM resumed
), wake AS (
    SELECT pg_notify(%(channel)s, queue) FROM (SELECT DISTINCT queue FROM resumed) AS queues
)

-- name: task_resume
WITH targets AS (SELECT %(id)s::uuid AS id), {{_task_resume_ctes}}
SELECT id, state, (SELECT count(*) FROM wake) AS woken FROM resumed;

-- name: task_retry_many
-- One batch of a bulk retry (the single task's resume): up to `limit` failed or cancelled tasks
-- of the filter, oldest first. SKIP LOCKED: a row retention is deleting now is left alone.
WITH targets AS MATERIALIZED (
    SELECT id FROM skiplock.tasks AS t
    WHERE state IN ('failed', 'cancelled') AND {{_task_filter}} AND {{_task_unique_free}}
    ORDER BY id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), {{_task_resume_ctes}}
SELECT id, state, (SELECT count(*) FROM wake) AS woken FROM resumed;

-- name: task_purge_many
-- One batch of a bulk purge: up to `limit` finished tasks (completed, failed, cancelled) of the
-- filter, with their events, oldest first; what retention does, on the operator's filter.
WITH doomed AS MATERIALIZED (
    SELECT id FROM skiplock.tasks
    WHERE state IN ('completed', 'failed', 'cancelled') AND {{_task_filter}}
    ORDER BY id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), {{_task_delete_doomed}};

-- name: _task_delete_doomed
-- The end of a delete of the tasks of a `doomed` CTE (ids) with their events and step records;
-- returns their ids.
events AS (
    DELETE FROM skiplock.task_events AS e USING doomed WHERE e.task_id = doomed.id
), steps AS (
    DELETE FROM skiplock.task_steps AS s USING doomed WHERE s.task_id = doomed.id
)
DELETE FROM skiplock.tasks AS t USING doomed WHERE t.id = doomed.id
RETURNING t.id

-- name: _task_get_columns
t.id, t.kind, t.queue, t.priority, t.payload, t.state, t.attempts, t.max_attempts, t.reclaims, t.lease_token,
       t.lease_owner, t.lease_until, t.run_after, t.deadline, t.idempotency_key, t.cursor, t.progress, t.message,
       t.result, t.last_error, t.event_seq, t.created_at, t.updated_at, t.started_at, t.finished_at,
       t.concurrency_key, t.waiting_on, t.on_parent_failure, t.suspended, t.wake_at, t.awaited_signal

-- name: task_get
-- With the traceback that goes with last_error: the newest event that recorded an error
-- (retrying, failed, reclaimed) set last_error, and holds the handler's traceback if it had one.
SELECT {{_task_get_columns}}, e.traceback AS last_error_traceback
FROM skiplock.tasks AS t
LEFT JOIN LATERAL (
    SELECT data ->> 'traceback' AS traceback
    FROM skiplock.task_events
    WHERE task_id = t.id AND data ? 'error'
    ORDER BY seq DESC
    LIMIT 1
) AS e ON t.last_error IS NOT NULL
WHERE t.id = %(id)s;

-- name: task_events_list
SELECT task_id, seq, type, at, lease_token, attempt, data
FROM skiplock.task_events
WHERE task_id = %(id)s
ORDER BY seq;

-- name: pause_set
INSERT INTO skiplock.pauses (scope, name) VALUES (%(scope)s, %(name)s)
ON CONFLICT (scope, name) DO NOTHING;

-- name: pause_clear
WITH cleared AS (
    DELETE FROM skiplock.pauses WHERE scope = %(scope)s AND name = %(name)s RETURNING name
)
SELECT name, pg_notify(%(channel)s, '*') FROM cleared;
