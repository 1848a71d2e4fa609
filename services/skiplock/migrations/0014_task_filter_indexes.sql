-- The task list filtered by queue or by kind (GET /v1/tasks, the console's tasks page, the bulk
-- actions' filters): newest first along these indexes, so a value with few tasks, or none, is a
-- short index range instead of a walk along tasks_pkey or a scan of the whole table. A filter
-- that matches nothing read every row (docs/console-performance.md has the plans at a million
-- tasks); with these it reads one index page.
--
-- What they cost: an entry in each on every enqueue, and on every claim and outcome: those
-- change `state`, which other indexes hold, so their updates are never HOT and every index of
-- the row gets a new entry.
--
-- Built in the migration's transaction: writes to skiplock.tasks wait while each reads the table
-- once. On a big table, build them first with CREATE INDEX CONCURRENTLY under these names, then
-- run the migration: IF NOT EXISTS makes it a no-op.
CREATE INDEX IF NOT EXISTS tasks_queue_id ON skiplock.tasks (queue, id);
CREATE INDEX IF NOT EXISTS tasks_kind_id ON skiplock.tasks (kind, id);
