-- Dependencies between tasks (issue 21): a task enqueued with `depends_on` waits (state
-- 'waiting') until its parents are final, and becomes 'queued' in the transaction of its last
-- parent's outcome; a failed or cancelled parent cancels it, or not, per its on_parent_failure.
--
-- How it holds together (docs/ARCHITECTURE.md, "Dependencies"):
-- - task_dependencies holds the edges. A dependent counts its parents that are not final
--   (waiting_on) and those that ended failed or cancelled (failed_parents); the counters change
--   only under the dependent's row lock, in the transaction of the parent's transition, so the
--   last parent's outcome releases the dependent exactly once, whichever commits last.
-- - A parent with dependents (or a waiter, skiplock.wait) has `watched` set. The trigger
--   tasks_watched runs only for a watched task whose state changes: tasks without dependents pay
--   the WHEN test of a row trigger, nothing else.
-- - Enqueue locks the parents (FOR SHARE) while it counts them, so a parent cannot end unseen
--   between the count and the commit: its outcome waits (a worker's outcome write skips the
--   locked row and writes it again), and then sees the new dependent.
LOCK TABLE skiplock.tasks IN ACCESS EXCLUSIVE MODE;

ALTER TABLE skiplock.tasks DROP CONSTRAINT IF EXISTS tasks_state_check;
ALTER TABLE skiplock.tasks ADD CONSTRAINT tasks_state_check
    CHECK (state IN ('waiting', 'queued', 'running', 'cancelling', 'completed', 'failed', 'cancelled'));

ALTER TABLE skiplock.tasks
    -- parents not final yet; failed or cancelled parents (a dependent's counters)
    ADD COLUMN waiting_on integer NOT NULL DEFAULT 0,
    ADD COLUMN failed_parents integer NOT NULL DEFAULT 0,
    -- what a failed or cancelled parent does to this task: 'cancel' it, or let it 'run'
    ADD COLUMN on_parent_failure text NOT NULL DEFAULT 'cancel' CHECK (on_parent_failure IN ('cancel', 'run')),
    -- cancelled because a parent failed: a resume of that parent re-arms it
    ADD COLUMN cancelled_by_parent boolean NOT NULL DEFAULT false,
    -- has dependents or a waiter: its state changes run tasks_watched
    ADD COLUMN watched boolean NOT NULL DEFAULT false;

CREATE TABLE skiplock.task_dependencies (
    task_id   uuid NOT NULL REFERENCES skiplock.tasks (id) ON DELETE CASCADE,
    parent_id uuid NOT NULL REFERENCES skiplock.tasks (id) ON DELETE CASCADE,
    PRIMARY KEY (task_id, parent_id)
);
CREATE INDEX task_dependencies_parent ON skiplock.task_dependencies (parent_id, task_id);

-- the gauges count waiting tasks per queue without reading other rows
CREATE INDEX tasks_waiting ON skiplock.tasks (queue) WHERE state = 'waiting';

-- A watched task changed state: its dependents' counters follow, in id order (two parents'
-- outcomes lock shared dependents in one order), and so do their states; then its waiters are
-- told. A dependent's own change of state fires this trigger for its dependents in turn.
CREATE OR REPLACE FUNCTION skiplock.task_watched() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    was_final boolean := OLD.state IN ('completed', 'failed', 'cancelled');
    is_final boolean := NEW.state IN ('completed', 'failed', 'cancelled');
    bad boolean := NEW.state IN ('failed', 'cancelled');
    was_bad boolean := OLD.state IN ('failed', 'cancelled');
    dep_id uuid;
    dep record;
    next_state text;
BEGIN
    IF is_final <> was_final THEN
        FOR dep_id IN
            SELECT d.task_id FROM skiplock.task_dependencies AS d WHERE d.parent_id = NEW.id ORDER BY d.task_id
        LOOP
            -- read (and lock) each dependent as it is now, not as the loop's query saw it: an
            -- earlier dependent's own transition may have changed it (a dependent shared down
            -- two paths of the graph)
            SELECT t.id, t.state, t.queue, t.waiting_on, t.failed_parents, t.on_parent_failure,
                   t.cancelled_by_parent, t.event_seq
            INTO dep
            FROM skiplock.tasks AS t
            WHERE t.id = dep_id
            FOR UPDATE;
            IF is_final THEN
                dep.waiting_on := dep.waiting_on - 1;
                dep.failed_parents := dep.failed_parents + bad::integer;
            ELSE  -- a resumed parent: not final again
                dep.waiting_on := dep.waiting_on + 1;
                dep.failed_parents := dep.failed_parents - was_bad::integer;
            END IF;
            next_state := dep.state;
            IF dep.state = 'waiting' AND dep.failed_parents > 0 AND dep.on_parent_failure = 'cancel' THEN
                next_state := 'cancelled';
            ELSIF dep.state = 'waiting' AND dep.waiting_on = 0 THEN
                next_state := 'queued';
            ELSIF dep.state = 'cancelled' AND dep.cancelled_by_parent AND dep.failed_parents = 0 THEN
                next_state := CASE WHEN dep.waiting_on = 0 THEN 'queued' ELSE 'waiting' END;
            END IF;
            UPDATE skiplock.tasks
            SET waiting_on = dep.waiting_on, failed_parents = dep.failed_parents,
                state = next_state,
                cancelled_by_parent = (next_state = 'cancelled' AND dep.state = 'waiting')
                                      OR (dep.cancelled_by_parent AND next_state = 'cancelled'),
                run_after = CASE WHEN next_state = 'queued' AND dep.state <> 'queued' THEN now() ELSE run_after END,
                finished_at = CASE WHEN next_state = 'cancelled' THEN coalesce(finished_at, now())
                                   WHEN next_state IN ('waiting', 'queued') THEN NULL ELSE finished_at END,
                last_error = CASE WHEN next_state = 'cancelled' AND dep.state = 'waiting'
                                  THEN format('parent %s ended %s', NEW.id, NEW.state) ELSE last_error END,
                updated_at = CASE WHEN next_state <> dep.state THEN now() ELSE updated_at END,
                event_seq = event_seq + (next_state <> dep.state)::integer
            WHERE id = dep.id;
            IF next_state <> dep.state THEN
                INSERT INTO skiplock.task_events (task_id, seq, type, data)
                VALUES (dep.id, dep.event_seq + 1, next_state,
                        jsonb_build_object('reason', CASE WHEN is_final THEN 'parent ended' ELSE 'parent resumed' END,
                                           'parent', NEW.id, 'parent_state', NEW.state));
                IF next_state = 'queued' THEN
                    PERFORM pg_notify('skiplock_' || TG_TABLE_SCHEMA, dep.queue);
                END IF;
            END IF;
        END LOOP;
    END IF;
    IF is_final THEN
        -- skiplock.wait() listens here; the payload is the task's id
        PERFORM pg_notify('skiplock_' || TG_TABLE_SCHEMA || '_finished', NEW.id::text);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER tasks_watched
    AFTER UPDATE OF state ON skiplock.tasks
    FOR EACH ROW
    WHEN (NEW.watched AND OLD.state IS DISTINCT FROM NEW.state)
    EXECUTE FUNCTION skiplock.task_watched();

-- A new task's first event: 'waiting' for a dependent, 'queued' for the rest; only queued ones
-- wake the workers.
CREATE OR REPLACE FUNCTION skiplock.task_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO skiplock.task_events (task_id, seq, type, attempt)
    SELECT id, 1, state, 0 FROM new_tasks;
    INSERT INTO skiplock.queue_kinds (queue, kind)
    SELECT DISTINCT queue, kind FROM new_tasks
    ON CONFLICT DO NOTHING;
    -- the channel the roles LISTEN on: skiplock_<schema>
    PERFORM pg_notify('skiplock_' || TG_TABLE_SCHEMA, q.queue)
    FROM (SELECT DISTINCT queue FROM new_tasks WHERE state = 'queued' AND run_after <= now()) AS q;
    RETURN NULL;
END
$$;
