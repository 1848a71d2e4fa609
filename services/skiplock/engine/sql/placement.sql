-- The distributed placement on Citus (`skiplock migrate --distributed`, engine/migrate.py's distribute runs
-- these in order, each in its own transaction, after every migration applied the tables as local
-- ones). What grows with the work (tasks, their events, their steps) is distributed by `queue` and
-- colocated, so that one queue's rows live on one worker node and a statement naming the queue is
-- routed there whole; the small tables become reference tables (a copy on every node), which a
-- routed statement may read. Citus requires a unique index on a distributed table to contain the
-- distribution column: keys and ids become unique within their queue. docs/SCALING.md says what
-- this changes for users; the statements that differ are in routed.sql.

-- name: placement_citus_installed
SELECT EXISTS (SELECT FROM pg_extension WHERE extname = 'citus');

-- name: placement_citus_catalog
-- Whether Citus's catalog is there to ask (placement_tasks_distributed names it: on a Postgres
-- without Citus that statement cannot even be planned).
SELECT to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL;

-- name: placement_tasks_distributed
-- Whether the placement is applied: the tasks table is hash-distributed.
SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_partition
               WHERE logicalrelid = to_regclass('skiplock.tasks') AND partmethod = 'h');

-- name: placement_limits_set
-- Whether any kind has a limit: no claim serves a limited kind on the distributed placement yet.
SELECT array_agg(kind ORDER BY kind) FROM skiplock.limits;

-- name: placement_keys_changed
-- Whether the key changes below are made (a placement cut off after them is resumed past them).
SELECT EXISTS (SELECT FROM pg_catalog.pg_attribute
               WHERE attrelid = 'skiplock.task_events'::regclass AND attname = 'queue' AND NOT attisdropped);

-- name: placement_table_distributed
SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_partition WHERE logicalrelid = %(table)s::regclass);

-- name: placement_drop_triggers
-- The triggers' work (a new task's queued event and wake-up, a waiting task's watch) is done by
-- the routed statements: a trigger on a distributed table runs on the shard, where a transition
-- table cannot be read and a pg_notify reaches no one who listens on the coordinator.
DROP TRIGGER IF EXISTS tasks_inserted ON skiplock.tasks;
DROP TRIGGER IF EXISTS tasks_watched ON skiplock.tasks;

-- name: placement_dependency_keys
-- A dependent and its parent may live in different queues, so on different nodes: no foreign
-- keys. An edge lives on its parent's shard (distributed by parent_queue), where the walk from a
-- parent's change of state reads it; it carries its dependent's queue, which routes the
-- dependent's update (store/routed_graph.py).
ALTER TABLE skiplock.task_dependencies
    DROP CONSTRAINT IF EXISTS task_dependencies_task_id_fkey,
    DROP CONSTRAINT IF EXISTS task_dependencies_parent_id_fkey,
    ADD COLUMN parent_queue text,
    ADD COLUMN queue text;
UPDATE skiplock.task_dependencies AS d SET parent_queue = p.queue FROM skiplock.tasks AS p WHERE p.id = d.parent_id;
UPDATE skiplock.task_dependencies AS d SET queue = c.queue FROM skiplock.tasks AS c WHERE c.id = d.task_id;
DELETE FROM skiplock.task_dependencies WHERE parent_queue IS NULL OR queue IS NULL;
ALTER TABLE skiplock.task_dependencies
    ALTER COLUMN parent_queue SET NOT NULL,
    ALTER COLUMN queue SET NOT NULL,
    DROP CONSTRAINT task_dependencies_pkey,
    ADD CONSTRAINT task_dependencies_pkey PRIMARY KEY (parent_queue, parent_id, task_id);
DROP INDEX skiplock.task_dependencies_parent;
-- ctx.parents() reads a dependent's edges by its id, on every shard
CREATE INDEX task_dependencies_task ON skiplock.task_dependencies (task_id);

-- name: placement_task_keys
ALTER TABLE skiplock.tasks DROP CONSTRAINT tasks_pkey;
ALTER TABLE skiplock.tasks ADD CONSTRAINT tasks_pkey PRIMARY KEY (queue, id);
-- a read by id alone (the API's, the console's) probes this on every shard
CREATE INDEX tasks_id ON skiplock.tasks (id);
DROP INDEX skiplock.tasks_idempotency_key;
CREATE UNIQUE INDEX tasks_idempotency_key ON skiplock.tasks (queue, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
DROP INDEX skiplock.tasks_unique;
CREATE UNIQUE INDEX tasks_unique ON skiplock.tasks (queue, unique_key)
    WHERE unique_key IS NOT NULL AND state = ANY (unique_states);

-- name: placement_queue_column
-- a table distributed next to the tasks carries their queue (engine/migrate.py names the table
-- and its key: task_events (task_id, seq), task_steps (task_id, position))
ALTER TABLE skiplock.{table} ADD COLUMN queue text;
UPDATE skiplock.{table} AS x SET queue = t.queue FROM skiplock.tasks AS t WHERE t.id = x.task_id;
DELETE FROM skiplock.{table} WHERE queue IS NULL;
ALTER TABLE skiplock.{table} ALTER COLUMN queue SET NOT NULL;
ALTER TABLE skiplock.{table} DROP CONSTRAINT {table}_pkey;
ALTER TABLE skiplock.{table} ADD CONSTRAINT {table}_pkey PRIMARY KEY (queue, {key});

-- name: placement_functions
-- A time plus seconds, for the routed statements' CASEs: Citus refuses a function that is not
-- IMMUTABLE in a CASE, and timestamptz + interval is STABLE (a day or a month depends on the time
-- zone). Seconds alone do not, so this one is immutable as declared.
CREATE OR REPLACE FUNCTION skiplock.seconds_after(at timestamptz, seconds float8) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT at + seconds * interval '1 second' $$;

-- name: placement_reference_tables
-- one call per statement: Citus refuses to switch local execution within one
SELECT create_reference_table(%(table)s);

-- name: placement_distribute_tasks
SELECT create_distributed_table('skiplock.tasks', 'queue');

-- name: placement_distribute_colocated
SELECT create_distributed_table(%(table)s, 'queue', colocate_with => 'skiplock.tasks');

-- name: placement_distribute_dependencies
SELECT create_distributed_table(%(table)s, 'parent_queue', colocate_with => 'skiplock.tasks');
