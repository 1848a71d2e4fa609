-- The webhook outbox trigger exists only while an endpoint is enabled.
--
-- Until now it was kept, disabled, while no endpoint was enabled (0003). But Postgres fills a
-- trigger's transition table whether or not the trigger is enabled: every event row written
-- (three or more per task: queued, running, completed) was copied into a tuplestore that nothing
-- read. A dropped trigger costs nothing. store.py creates it when the first endpoint is enabled
-- and drops it when the last one is disabled or removed, under the same locks as before.
--
-- A disabled trigger is dropped here; an enabled one (endpoints in use) stays as it is.
--
-- During a rolling upgrade, a process from before this migration cannot add or enable an
-- endpoint while none is enabled (it expects to find the trigger: its change is rolled back,
-- the API answers 500), and one that disables the last endpoint leaves the trigger disabled,
-- not dropped, until the next change made by this version. Nothing else is affected.

DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_trigger
               WHERE tgrelid = 'skiplock.task_events'::regclass AND tgname = 'task_events_outbox'
                 AND tgenabled = 'D') THEN
        DROP TRIGGER task_events_outbox ON skiplock.task_events;
    END IF;
END
$$;
