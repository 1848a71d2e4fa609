-- Durable execution (issue 33): a run records its steps, and may end suspended (state 'waiting')
-- until a time, a signal or other tasks. How it holds together is in docs/ARCHITECTURE.md,
-- "Durable execution":
-- - task_steps holds each run's calls in order (position), each written fenced by the run's lease
--   token: the task row is locked FOR SHARE while the record is inserted, so a reclaim either
--   waits for the record or makes the fence refuse it.
-- - A suspended task is 'waiting' with `suspended` saying why ('sleep', 'signal', 'tasks'):
--   wake_at is when it becomes queued on its own (a sleep's end, a signal wait's timeout),
--   awaited_signal the signal that wakes it sooner; a wait for tasks uses the dependency counters
--   of depends_on (migration 0017), whose trigger queues it when the last one is final.
-- - signals holds each signal name once, first send wins, until retention deletes it.
LOCK TABLE skiplock.tasks IN ACCESS EXCLUSIVE MODE;

ALTER TABLE skiplock.tasks
    -- why a waiting task waits, when it is suspended (NULL: a dependent of depends_on); read only
    -- while the task is waiting (a run of it keeps the value until its outcome clears it)
    ADD COLUMN suspended text CHECK (suspended IN ('sleep', 'signal', 'tasks')),
    -- when a suspended task becomes queued without anything else happening
    ADD COLUMN wake_at timestamptz,
    ADD COLUMN awaited_signal text;

-- the wake-up reads only suspended tasks that have a time
CREATE INDEX tasks_wake_at ON skiplock.tasks (wake_at) WHERE state = 'waiting' AND wake_at IS NOT NULL;
-- a send reads only the tasks waiting for its name
CREATE INDEX tasks_awaited_signal ON skiplock.tasks (awaited_signal)
    WHERE state = 'waiting' AND awaited_signal IS NOT NULL;

CREATE TABLE skiplock.task_steps (
    -- no foreign key, as task_events has none: each record would pay its check and a lock of the
    -- task's row; retention deletes a task's steps with it (tasks.sql, _task_delete_doomed)
    task_id     uuid        NOT NULL,
    -- the call's place in the handler's run, from 1; the same name again is its next occurrence
    position    integer     NOT NULL CHECK (position > 0),
    name        text        NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    occurrence  integer     NOT NULL CHECK (occurrence > 0),
    -- step: ctx.step / step_transaction; sleep, signal, tasks: a wait, recorded when it began
    type        text        NOT NULL CHECK (type IN ('step', 'sleep', 'signal', 'tasks')),
    result      jsonb,
    -- the run that recorded it (its claim's lease token and attempt)
    lease_token bigint      NOT NULL,
    attempt     integer     NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (task_id, position)
);

CREATE TABLE skiplock.signals (
    name    text        PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 200),
    payload jsonb,
    sent_at timestamptz NOT NULL DEFAULT now()
);
-- listing newest first, and retention oldest first
CREATE INDEX signals_sent_at ON skiplock.signals (sent_at);
