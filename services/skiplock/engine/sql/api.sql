-- Named statements of the HTTP API (services/skiplock/api). engine/store/ runs them, one method per statement.
--
-- Listings are keyset-paginated on a key that only grows: task ids are UUIDv7 (time-ordered),
-- audit ids an identity. A page is `key < cursor ORDER BY key DESC`, so rows inserted while a
-- client pages land before its cursor and never shift or repeat the rows still to come.

-- name: task_list
SELECT id, kind, queue, priority, payload, state, attempts, max_attempts, reclaims, lease_token,
       lease_owner, lease_until, run_after, deadline, idempotency_key, cursor, progress, message,
       result, last_error, event_seq, created_at, updated_at, started_at, finished_at, concurrency_key,
       waiting_on, on_parent_failure, suspended, wake_at, awaited_signal
FROM skiplock.tasks
WHERE {{_task_filter}}
  AND (%(cursor)s::uuid IS NULL OR id < %(cursor)s::uuid)
ORDER BY id DESC
LIMIT %(limit)s;

-- name: task_submitted
-- After an API insert, in the same transaction: for each keyed task, whether this transaction
-- inserted it (`mine`: the row's xmin is our transaction id; the insert ran outside any
-- savepoint) and, for one another request inserted, what it was submitted with.
SELECT id, request_hash, xmin = pg_current_xact_id()::xid AS mine, kind, queue, priority, payload,
       max_attempts
FROM skiplock.tasks
WHERE id = ANY(%(ids)s::uuid[]);

-- name: task_annotate
-- What the shared insert does not write: the submission's fingerprint and its deadline. Same
-- transaction as the insert, so no worker or replaying request ever sees the row without them.
UPDATE skiplock.tasks AS t
SET request_hash = coalesce(i.request_hash, t.request_hash),
    deadline = coalesce(i.deadline, t.deadline)
FROM unnest(%(ids)s::uuid[], %(hashes)s::text[], %(deadlines)s::timestamptz[])
     AS i(id, request_hash, deadline)
WHERE t.id = i.id;

-- name: schedule_lock
-- PATCH reads, merges and writes a schedule under this lock: a concurrent DELETE waits, and
-- a PATCH racing a DELETE that won finds no row instead of recreating it.
SELECT name FROM skiplock.schedules WHERE name = %(name)s FOR UPDATE;

-- name: audit_insert
INSERT INTO skiplock.audit_log (actor, action, target, request_id, outcome, detail)
VALUES (%(actor)s, %(action)s, %(target)s, %(request_id)s, %(outcome)s, %(detail)s)
RETURNING id;

-- name: audit_list
SELECT id, at, actor, action, target, request_id, outcome, detail
FROM skiplock.audit_log
WHERE (%(action)s::text IS NULL OR action = %(action)s::text)
  AND (%(actor)s::text IS NULL OR actor = %(actor)s::text)
  AND (%(target)s::text IS NULL OR target = %(target)s::text)
  AND (%(cursor)s::bigint IS NULL OR id < %(cursor)s::bigint)
ORDER BY id DESC
LIMIT %(limit)s;

-- name: queue_kind_new
-- Of a submission's queues and kinds, those queue_kinds (0015) does not hold: names no task has had.
SELECT 'queue' AS scope, q.name FROM unnest(%(queues)s::text[]) AS q(name)
WHERE NOT EXISTS (SELECT FROM skiplock.queue_kinds AS n WHERE n.queue = q.name)
UNION ALL
SELECT 'kind', k.name FROM unnest(%(kinds)s::text[]) AS k(name)
WHERE NOT EXISTS (SELECT FROM skiplock.queue_kinds AS n WHERE n.kind = k.name);

-- name: queue_kind_list
-- Every (queue, kind) pair a task has had: the names `skiplock queues|kinds` know.
SELECT queue, kind FROM skiplock.queue_kinds ORDER BY kind, queue;

-- name: queue_kind_lock
-- Held by a submission that brings new names until it commits (its tasks' insert trigger
-- registers them): the next one counts after that, so two cannot both take the last place. The
-- count is a statement of its own: a statement's snapshot is taken before it waits for the lock.
SELECT pg_advisory_xact_lock(hashtext('skiplock.queue_kinds'));

-- name: queue_kind_count
SELECT count(DISTINCT queue) AS queues, count(DISTINCT kind) AS kinds FROM skiplock.queue_kinds;
