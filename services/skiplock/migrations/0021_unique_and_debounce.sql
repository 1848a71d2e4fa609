-- Unique windows and debounce (issue 34): two enqueue options that may turn an enqueue into an
-- existing task, each enforced by a unique index, never by a read and then a write.
--
-- unique: unique_key is a digest of the kind, the queue, the period and (optionally) the payload
-- or some of its keys, with the number of the period's fixed window on the database's clock
-- appended ('<digest>/<window>'); unique_states lists the states in which the task blocks its
-- duplicates (always waiting, queued, running and cancelling: a task in flight always blocks).
-- A row leaves tasks_unique when it moves to a state outside its list, and a new task of that key
-- may then be inserted. unique_until is the end of the window: retention keeps a finished task
-- that still blocks until then (task_delete_finished), so the window outlives retention.
--
-- debounce: while a task of (kind, queue, debounce_key) is queued and has never started, an
-- enqueue of that key updates it (payload, priority, start) instead of inserting; claiming it
-- (which sets started_at) takes it out of tasks_debounce, and the next enqueue inserts anew.
-- debounce_until is the first enqueue's time plus max_wait: no update moves the start past it.
--
-- Plain tasks leave every new column NULL: nothing of them enters either index (the predicates
-- fail on the first NULL test), and no statement of the claim or the settle reads them.
ALTER TABLE skiplock.tasks
    ADD COLUMN unique_key text,
    ADD COLUMN unique_states text[],
    ADD COLUMN unique_until timestamptz,
    ADD COLUMN debounce_key text,
    ADD COLUMN debounce_until timestamptz;

CREATE UNIQUE INDEX tasks_unique ON skiplock.tasks (unique_key)
    WHERE unique_key IS NOT NULL AND state = ANY (unique_states);

CREATE UNIQUE INDEX tasks_debounce ON skiplock.tasks (kind, queue, debounce_key)
    WHERE debounce_key IS NOT NULL AND state = 'queued' AND started_at IS NULL;
