-- Deep dependency chains (issue 37): a transition reaches every task below it in one walk, not in
-- trigger recursion as deep as the graph. Until now each dependent's own change of state fired
-- tasks_watched for its dependents in turn, one trigger level per task of the chain, and Postgres
-- stopped at its stack depth: cancelling the root of a 500-task chain failed, and so did the
-- outcome batch of a worker holding such a root.
--
-- Now the function walks the graph itself, breadth first, with the tasks still to visit in an
-- array. What it does to each dependent is unchanged (migration 0017): the counters move under
-- the dependent's row lock, each dependent of a task in id order, each read afresh as it is locked
-- (a task reached by two paths). The walk's own updates fire the trigger too; a transaction-local
-- setting marks the walk in progress, and those calls return at once (the walk visits their
-- dependents). A setting, not pg_trigger_depth(): a transition made from inside another trigger
-- or function (a user's trigger that cancels a task) still reaches its dependents. The setting is
-- undone with the (sub)transaction that set it, so a walk that raises leaves none behind.
LOCK TABLE skiplock.tasks IN ACCESS EXCLUSIVE MODE;

CREATE OR REPLACE FUNCTION skiplock.task_watched() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    -- the watched tasks whose change of state still has to reach their dependents, with the
    -- state each left and the one it took; visit walks them in order and the walk appends
    todo_ids uuid[] := ARRAY[NEW.id];
    todo_old text[] := ARRAY[OLD.state];
    todo_new text[] := ARRAY[NEW.state];
    visit integer := 0;
    cur_id uuid;
    cur_state text;
    was_final boolean;
    is_final boolean;
    bad boolean;
    was_bad boolean;
    dep_id uuid;
    dep record;
    next_state text;
BEGIN
    IF current_setting('skiplock.dependency_walk', true) = 'on' THEN
        RETURN NULL;  -- an update of the walk in progress, which visits its dependents itself
    END IF;
    PERFORM set_config('skiplock.dependency_walk', 'on', true);
    WHILE visit < cardinality(todo_ids) LOOP
        visit := visit + 1;
        cur_id := todo_ids[visit];
        cur_state := todo_new[visit];
        was_final := todo_old[visit] IN ('completed', 'failed', 'cancelled');
        is_final := cur_state IN ('completed', 'failed', 'cancelled');
        bad := cur_state IN ('failed', 'cancelled');
        was_bad := todo_old[visit] IN ('failed', 'cancelled');
        IF is_final <> was_final THEN
            FOR dep_id IN
                SELECT d.task_id FROM skiplock.task_dependencies AS d WHERE d.parent_id = cur_id ORDER BY d.task_id
            LOOP
                SELECT t.id, t.state, t.queue, t.waiting_on, t.failed_parents, t.on_parent_failure,
                       t.cancelled_by_parent, t.event_seq, t.watched
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
                                      THEN format('parent %s ended %s', cur_id, cur_state) ELSE last_error END,
                    updated_at = CASE WHEN next_state <> dep.state THEN now() ELSE updated_at END,
                    event_seq = event_seq + (next_state <> dep.state)::integer
                WHERE id = dep.id;
                IF next_state <> dep.state THEN
                    INSERT INTO skiplock.task_events (task_id, seq, type, data)
                    VALUES (dep.id, dep.event_seq + 1, next_state,
                            jsonb_build_object('reason', CASE WHEN is_final THEN 'parent ended' ELSE 'parent resumed' END,
                                               'parent', cur_id, 'parent_state', cur_state));
                    IF next_state = 'queued' THEN
                        PERFORM pg_notify('skiplock_' || TG_TABLE_SCHEMA, dep.queue);
                    END IF;
                    -- where the recursion fired the trigger for this dependent, the walk visits it
                    IF dep.watched THEN
                        todo_ids := todo_ids || dep.id;
                        todo_old := todo_old || dep.state;
                        todo_new := todo_new || next_state;
                    END IF;
                END IF;
            END LOOP;
        END IF;
        IF is_final THEN
            -- skiplock.wait() listens here; the payload is the task's id
            PERFORM pg_notify('skiplock_' || TG_TABLE_SCHEMA || '_finished', cur_id::text);
        END IF;
    END LOOP;
    PERFORM set_config('skiplock.dependency_walk', 'off', true);
    RETURN NULL;
END
$$;

DROP TRIGGER tasks_watched ON skiplock.tasks;
CREATE TRIGGER tasks_watched
    AFTER UPDATE OF state ON skiplock.tasks
    FOR EACH ROW
    WHEN (NEW.watched AND OLD.state IS DISTINCT FROM NEW.state)
    EXECUTE FUNCTION skiplock.task_watched();
