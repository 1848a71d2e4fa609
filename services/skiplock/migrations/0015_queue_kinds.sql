-- The kinds each queue has had tasks of, written by the insert trigger, in place of 0014's two
-- indexes on tasks.
--
-- 0014 made a task filter by a queue or kind without tasks an index probe instead of a walk of
-- the whole table, with tasks_queue_id (queue, id) and tasks_kind_id (kind, id). Every claim and
-- every outcome changes `state`, so those updates are never HOT and each added an entry to both
-- indexes, as did every enqueue: six index entries per task over its life, which measured about
-- a quarter more Postgres CPU per task in a drain (tests/benchmarks/RESULTS.md, 2026-12-02).
--
-- A filter's value is now first looked up here (task_list's _task_filter): a queue or kind that
-- never had a task stops the list before it reads tasks at all (a one-time filter). The trigger
-- adds one row per new (queue, kind) pair and only probes the primary key for a known one: one
-- statement per enqueue call, nothing per task. A value whose tasks were all deleted by
-- retention stays listed: its filter walks the table as before 0014.
--
-- Tasks inserted while this migration runs must be registered too: the lock keeps inserts out
-- between the backfill and the commit of the new trigger function (it is taken anyway: DROP
-- INDEX needs it). The backfill reads the table once.
LOCK TABLE skiplock.tasks IN ACCESS EXCLUSIVE MODE;

CREATE TABLE skiplock.queue_kinds (
    queue text NOT NULL,
    kind text NOT NULL,
    PRIMARY KEY (queue, kind)
);

-- a filter by kind alone reads the table whole: it holds one row per pair, not per task
INSERT INTO skiplock.queue_kinds (queue, kind)
SELECT DISTINCT queue, kind FROM skiplock.tasks;

CREATE OR REPLACE FUNCTION skiplock.task_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO skiplock.task_events (task_id, seq, type, attempt)
    SELECT id, 1, 'queued', 0 FROM new_tasks;
    INSERT INTO skiplock.queue_kinds (queue, kind)
    SELECT DISTINCT queue, kind FROM new_tasks
    ON CONFLICT DO NOTHING;
    -- the channel the roles LISTEN on: skiplock_<schema>
    PERFORM pg_notify('skiplock_' || TG_TABLE_SCHEMA, q.queue)
    FROM (SELECT DISTINCT queue FROM new_tasks WHERE run_after <= now()) AS q;
    RETURN NULL;
END
$$;

DROP INDEX IF EXISTS skiplock.tasks_queue_id;
DROP INDEX IF EXISTS skiplock.tasks_kind_id;
