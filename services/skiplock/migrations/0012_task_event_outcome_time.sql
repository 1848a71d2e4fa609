-- The console's throughput chart (GET /v1/queues/throughput) counts the completed and failed
-- events of the last hour. Without this index that read scans every event of every task; with
-- it, it reads only the outcome events of the window. Partial: the hot path's other events
-- (claimed, checkpoint, retrying, ...) never enter it.
--
-- Built in the migration's transaction: task transitions (which insert events) wait while it reads
-- task_events once. On a big table, build it first with CREATE INDEX CONCURRENTLY under this name,
-- then run the migration: IF NOT EXISTS keeps it.
CREATE INDEX IF NOT EXISTS task_events_outcome_at ON skiplock.task_events (at)
    WHERE type IN ('completed', 'failed');
