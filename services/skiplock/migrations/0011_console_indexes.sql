-- Counting finished tasks by queue and state (the console's overview, GET /v1/queues and the
-- skiplock_queue_tasks gauge: queue_task_counts) from an index-only scan of this index, in
-- queue, state order, instead of reading every finished row of the table and hashing it.
-- With a million finished tasks that count went from reading the whole heap to reading this
-- index, about a quarter of the heap's size (docs/console-performance.md has the plans).
--
-- What it costs the hot paths: nothing on enqueue or claim (a queued or running task has no
-- finished_at, so it is not in the index); one more index entry when a task finishes, next to
-- the one tasks_state_finished already gets (the finishing UPDATE changes state, so it is never
-- HOT and writes every index of the row anyway). The scan needs the visibility map: pages that
-- changed since autovacuum last ran are read from the heap.
--
-- Built in the migration's transaction: writes to skiplock.tasks wait while it reads the table
-- once (about 1.5 s per million rows on the development machine). On a much bigger table, build
-- it first with CREATE INDEX CONCURRENTLY under this name, then run the migration: IF NOT EXISTS
-- makes it a no-op.
CREATE INDEX IF NOT EXISTS tasks_finished_by_queue ON skiplock.tasks (queue, state)
    WHERE finished_at IS NOT NULL;
