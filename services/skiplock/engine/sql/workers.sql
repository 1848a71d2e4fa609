-- Named statements of the worker registry (the skiplock.workers table). A worker writes its own
-- row on its heartbeat's period, never on the claim or settle path; the scheduler deletes stale
-- rows and reads the per-queue counts; the API and the CLI list the rows.

-- name: worker_register
-- Insert this worker's row, or renew it: heartbeat_at and in_flight. After the maintenance
-- deleted the row (the worker was paused or cut off for three leases), the next beat inserts it
-- again, with a new started_at.
-- heartbeat_at from VALUES: Citus takes no function that is not IMMUTABLE in DO UPDATE SET
INSERT INTO skiplock.workers (id, host, pid, queues, concurrency, in_flight, version, lease_seconds, heartbeat_at)
VALUES (%(id)s, %(host)s, %(pid)s, %(queues)s::text[], %(concurrency)s, %(in_flight)s, %(version)s,
        %(lease_seconds)s, now())
ON CONFLICT (id) DO UPDATE SET in_flight = EXCLUDED.in_flight, heartbeat_at = EXCLUDED.heartbeat_at
-- xmax is 0 in a row version an INSERT wrote, not in one an ON CONFLICT UPDATE wrote
RETURNING xmax = 0 AS inserted;

-- name: worker_delete
-- A clean exit. Zero rows: the maintenance deleted it first (the worker outlived three leases
-- without a heartbeat), or it never got in.
DELETE FROM skiplock.workers WHERE id = %(id)s RETURNING id;

-- name: worker_delete_stale
-- Rows whose heartbeat is older than `leases` of their own leases: workers that died without
-- exiting. Every scheduler replica may run it at once; a row goes once.
-- (The age as now() - heartbeat_at, an interval: Citus refuses a STABLE function, as
-- timestamptz - interval is, called with a column in a statement that writes a table it holds.)
DELETE FROM skiplock.workers
WHERE now() - heartbeat_at > %(leases)s * lease_seconds * interval '1 second'
RETURNING id, host, pid;

-- name: worker_list
SELECT id, host, pid, queues, concurrency, in_flight, version, lease_seconds, started_at, heartbeat_at,
       extract(epoch FROM now() - heartbeat_at)::float8 AS heartbeat_age_seconds
FROM skiplock.workers
ORDER BY host, started_at, id;

-- name: worker_queue_counts
-- skiplock_workers{queue} and skiplock_workers_concurrency{queue}: a worker claiming from
-- several queues counts in each.
SELECT q.queue, count(*)::int AS workers, sum(w.concurrency)::int AS concurrency
FROM skiplock.workers AS w, unnest(w.queues) AS q(queue)
GROUP BY q.queue;
