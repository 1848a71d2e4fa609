-- Named statements of the enqueue options that may turn an enqueue into an existing task: unique
-- windows and debounce (migration 0021). engine/store/unique_inserts.py runs them; a plain
-- enqueue never does.

-- name: task_insert_unique
-- task_insert for tasks of which some have a unique key: each key given gets its window's number
-- on the database's clock (a period's fixed windows, counted from the Unix epoch), and the row its
-- window's end. ON CONFLICT without a target covers both tasks_idempotency_key and tasks_unique:
-- a task whose key is taken is not inserted, and the caller looks the holder up by the key this
-- returns (a new statement's snapshot sees a holder that committed while this one waited for it).
-- Every input row comes back: (id, unique_key as stored, inserted). A transaction that enqueues
-- several batches of shared keys can still deadlock with another (Postgres then aborts one).
WITH input AS MATERIALIZED (
    SELECT i.*,
           CASE WHEN i.unique_period IS NULL THEN i.unique_digest
                ELSE i.unique_digest || '/' || floor(extract(epoch FROM now()) / i.unique_period)::bigint END
               AS unique_key,
           to_timestamp((floor(extract(epoch FROM now()) / i.unique_period) + 1) * i.unique_period)
               AS unique_until
    FROM unnest(
        %(ids)s::uuid[], %(kinds)s::text[], %(queues)s::text[], %(priorities)s::smallint[],
        %(payloads)s::jsonb[], %(max_attempts)s::integer[], %(delays)s::float8[],
        %(run_ats)s::timestamptz[], %(idempotency_keys)s::text[], %(concurrency_keys)s::text[],
        %(trace_contexts)s::jsonb[], %(unique_digests)s::text[], %(unique_periods)s::float8[],
        %(unique_states)s::text[]
    ) AS i(id, kind, queue, priority, payload, max_attempts, delay, run_at, idempotency_key, concurrency_key,
           trace_context, unique_digest, unique_period, unique_state_list)
), inserted AS (
    INSERT INTO skiplock.tasks
        (id, kind, queue, priority, payload, max_attempts, run_after, idempotency_key, event_seq, concurrency_key,
         trace_context, unique_key, unique_states, unique_until)
    SELECT id, kind, queue, priority, payload, max_attempts,
           coalesce(run_at, now() + coalesce(delay, 0) * interval '1 second'), idempotency_key, 1, concurrency_key,
           trace_context, unique_key, string_to_array(unique_state_list, ','), unique_until
    FROM input
    -- in key order, the first of a batch's duplicates first: two batches that share keys take
    -- them in one order, so one waits for the other instead of each holding what the other needs
    ORDER BY unique_key, id
    ON CONFLICT DO NOTHING
    RETURNING id
)
SELECT i.id, i.unique_key, n.id IS NOT NULL
FROM input AS i LEFT JOIN inserted AS n ON n.id = i.id;

-- name: task_ids_by_unique_key
-- The tasks that hold unique keys now (through tasks_unique: the same predicate).
SELECT unique_key, id FROM skiplock.tasks
WHERE unique_key = ANY(%(keys)s::text[]) AND unique_key IS NOT NULL AND state = ANY (unique_states);

-- name: task_insert_debounced
-- One debounced enqueue: a new task that starts after `delay` (or at first + max_wait), or, while
-- a task of the same kind, queue and key is queued and has never started (tasks_debounce), that
-- task takes this enqueue's payload, priority and max_attempts, and its start moves to now + delay,
-- never past its debounce_until (it keeps its concurrency key: a parked task's group is counted). A claim holding the row makes this wait; once it commits the row
-- has started, is out of the index, and this inserts a new task instead. Returns the task's id
-- (another than the one given: the enqueue was merged).
INSERT INTO skiplock.tasks AS t
    (id, kind, queue, priority, payload, max_attempts, run_after, event_seq, concurrency_key, trace_context,
     debounce_key, debounce_until)
VALUES (%(id)s::uuid, %(kind)s::text, %(queue)s::text, %(priority)s::smallint, %(payload)s::jsonb,
        %(max_attempts)s::integer,
        -- least() passes over a NULL: no max_wait, no bound
        least(now() + %(delay)s::float8 * interval '1 second', now() + %(max_wait)s::float8 * interval '1 second'), 1,
        %(concurrency_key)s::text, %(trace_context)s::jsonb, %(debounce_key)s::text,
        now() + %(max_wait)s::float8 * interval '1 second')
ON CONFLICT (kind, queue, debounce_key) WHERE debounce_key IS NOT NULL AND state = 'queued' AND started_at IS NULL
-- EXCLUDED's times, not now() (the same values: max_wait >= delay): Citus runs no function but
-- an IMMUTABLE one in DO UPDATE SET, and this statement serves both placements.
DO UPDATE SET payload = EXCLUDED.payload, priority = EXCLUDED.priority, max_attempts = EXCLUDED.max_attempts,
              run_after = least(EXCLUDED.run_after, t.debounce_until),
              updated_at = EXCLUDED.updated_at
RETURNING id;
