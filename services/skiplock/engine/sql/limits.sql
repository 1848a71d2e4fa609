-- Named statements for flow control (migration 0016): the limits per kind, and the groups the
-- claim keeps. engine/store/limits.py runs them; the claim's own are in tasks.sql.

-- name: limit_list
SELECT kind, concurrency, rate_count, rate_seconds, burst, updated_at
FROM skiplock.limits
ORDER BY kind;

-- name: limit_get
SELECT kind, concurrency, rate_count, rate_seconds, burst, updated_at
FROM skiplock.limits
WHERE kind = %(kind)s;

-- name: limit_upsert
-- true: created, false: changed; no row: unchanged. The next claim reads it: a kind that gets its
-- first limit has its queued tasks parked as claims meet them.
INSERT INTO skiplock.limits AS l (kind, concurrency, rate_count, rate_seconds, burst, updated_at)
VALUES (%(kind)s, %(concurrency)s, %(rate_count)s, %(rate_seconds)s, %(burst)s, now())
ON CONFLICT (kind) DO UPDATE
SET concurrency = excluded.concurrency, rate_count = excluded.rate_count,
    rate_seconds = excluded.rate_seconds, burst = excluded.burst, updated_at = excluded.updated_at
WHERE (l.concurrency, l.rate_count, l.rate_seconds, l.burst)
      IS DISTINCT FROM (excluded.concurrency, excluded.rate_count, excluded.rate_seconds, excluded.burst)
RETURNING (xmax = 0) AS created;

-- name: limit_delete
-- Deletes the limits of `kinds` and lets their parked tasks go: back into tasks_claimable, as if
-- never limited (their runs in flight finish as they are). A claim that parks one of their tasks
-- meanwhile, from a snapshot that still had the limit, leaves it in a group without a limit row,
-- which task_claim_limited does not hold back.
WITH deleted AS (
    DELETE FROM skiplock.limits WHERE kind = ANY(%(kinds)s::text[]) RETURNING kind
), released AS (
    UPDATE skiplock.tasks AS t
    SET limited = false
    WHERE t.state = 'queued' AND t.limited AND t.kind IN (SELECT kind FROM deleted)
    RETURNING t.queue
), groups AS (
    DELETE FROM skiplock.limit_groups AS g WHERE g.kind IN (SELECT kind FROM deleted)
), wake AS (
    SELECT pg_notify(%(channel)s, queue) FROM (SELECT DISTINCT queue FROM released) AS q
)
-- the condition is always true: it makes Postgres run the wake-up, which nothing else reads
SELECT kind FROM deleted WHERE (SELECT count(*) FROM wake) >= 0 ORDER BY kind;

-- name: limit_kinds
SELECT kind FROM skiplock.limits ORDER BY kind;

-- name: limit_group_wake
-- The backstop of the rotation, run by the scheduler: a group with parked tasks whose row is
-- missing, or marked drained, is put back. Both happen only when a claim parked a task and
-- committed between another claim's snapshot and its lock of the group (which then found no
-- parked task, and marked it drained or deleted it). The distinct groups of tasks_parked are
-- found by skipping along the index: one probe per group, not a read of every parked task.
WITH RECURSIVE parked AS (
    (SELECT kind, concurrency_key FROM skiplock.tasks
     WHERE state = 'queued' AND limited
     ORDER BY kind, concurrency_key LIMIT 1)
    UNION ALL
    SELECT n.kind, n.concurrency_key
    FROM parked AS p
    CROSS JOIN LATERAL (
        SELECT t.kind, t.concurrency_key FROM skiplock.tasks AS t
        WHERE t.state = 'queued' AND t.limited AND (t.kind, t.concurrency_key) > (p.kind, p.concurrency_key)
        ORDER BY t.kind, t.concurrency_key LIMIT 1
    ) AS n
)
INSERT INTO skiplock.limit_groups AS g (kind, concurrency_key)
SELECT p.kind, p.concurrency_key FROM parked AS p
WHERE NOT EXISTS (SELECT FROM skiplock.limit_groups AS a
                  WHERE a.kind = p.kind AND a.concurrency_key = p.concurrency_key AND NOT a.drained)
ORDER BY p.kind, p.concurrency_key
ON CONFLICT (kind, concurrency_key) DO UPDATE SET drained = false WHERE g.drained
RETURNING g.kind;

-- name: limit_group_delete_idle
-- Groups drained and unvisited for `idle_seconds`, whose bucket has refilled (so that a new row
-- for the key, which starts full, gives no extra burst) and with no run in flight: deleted, so
-- that keys seen once do not pile up. SKIP LOCKED: a claim holding the row is using it.
WITH idle AS MATERIALIZED (
    SELECT g.kind, g.concurrency_key
    FROM skiplock.limit_groups AS g
    LEFT JOIN skiplock.limits AS l ON l.kind = g.kind
    WHERE g.drained
      AND g.served_at < now() - %(idle_seconds)s * interval '1 second'
      AND (l.rate_count IS NULL
           OR g.served_at < now() - l.burst * l.rate_seconds / l.rate_count * interval '1 second')
      AND NOT EXISTS (SELECT FROM skiplock.tasks AS r
                      WHERE r.kind = g.kind AND r.concurrency_key = g.concurrency_key
                        AND r.limited AND r.state IN ('running', 'cancelling'))
    LIMIT %(limit)s
    FOR UPDATE OF g SKIP LOCKED
)
DELETE FROM skiplock.limit_groups AS g
USING idle
WHERE g.kind = idle.kind AND g.concurrency_key = idle.concurrency_key
RETURNING g.kind;

-- name: limit_stats
-- Per limited kind: tasks held back (parked), live runs, groups with work (runs or parked
-- tasks), and the tokens in the emptiest bucket among groups with parked tasks. For the gauges
-- and `limits list`; reads the partial indexes only.
SELECT l.kind, l.concurrency,
       (SELECT count(*) FROM skiplock.tasks AS t
        WHERE t.state = 'queued' AND t.limited AND t.kind = l.kind) AS throttled,
       (SELECT count(*) FROM skiplock.tasks AS t
        WHERE t.limited AND t.state IN ('running', 'cancelling') AND t.kind = l.kind
          AND t.lease_until > now()) AS running,
       (SELECT count(*) FROM (
            SELECT t.concurrency_key FROM skiplock.tasks AS t
            WHERE t.limited AND t.state IN ('running', 'cancelling') AND t.kind = l.kind
              AND t.lease_until > now()
            UNION
            SELECT t.concurrency_key FROM skiplock.tasks AS t
            WHERE t.state = 'queued' AND t.limited AND t.kind = l.kind) AS k) AS busy_groups,
       (SELECT min(least(l.burst,
                         coalesce(g.tokens + extract(epoch FROM now() - g.tokens_at) * l.rate_count / l.rate_seconds,
                                  l.burst)))
        FROM skiplock.limit_groups AS g
        WHERE g.kind = l.kind AND NOT g.drained AND l.rate_count IS NOT NULL)::float8 AS tokens
FROM skiplock.limits AS l
ORDER BY l.kind;
