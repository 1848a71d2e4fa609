-- The core task lifecycle: tasks, their ordered events, lease tokens and pause flags.
-- Every object lives in the skiplock schema (renamed by SKIPLOCK_DB_SCHEMA at apply time).

CREATE SEQUENCE skiplock.lease_tokens AS bigint;

CREATE TABLE skiplock.tasks (
    id              uuid        PRIMARY KEY,
    kind            text        NOT NULL,
    queue           text        NOT NULL DEFAULT 'default',
    -- higher runs first
    priority        smallint    NOT NULL DEFAULT 0,
    payload         jsonb       NOT NULL DEFAULT '{}',
    state           text        NOT NULL DEFAULT 'queued'
                    CHECK (state IN ('queued', 'running', 'cancelling', 'completed', 'failed', 'cancelled')),
    -- executions that ended in an outcome (a reclaim or a release gives its attempt back)
    attempts        integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    -- NULL: the kind's max_attempts (declared with @task, default 3)
    max_attempts    integer     CHECK (max_attempts > 0),
    reclaims        integer     NOT NULL DEFAULT 0,
    lease_token     bigint,
    lease_owner     text,
    lease_until     timestamptz,
    run_after       timestamptz NOT NULL DEFAULT now(),
    deadline        timestamptz,
    idempotency_key text,
    cursor          jsonb,
    progress        real,
    message         text,
    result          jsonb,
    last_error      text,
    -- sequence number of the task's last event; bumped in the same UPDATE as each transition
    event_seq       integer     NOT NULL DEFAULT 0,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    started_at      timestamptz,
    finished_at     timestamptz
);

-- The claim reads only this index: finished and running rows are not in it.
CREATE INDEX tasks_claimable ON skiplock.tasks (queue, priority DESC, run_after, id)
    WHERE state = 'queued';

-- The reaper reads only claims in flight.
CREATE INDEX tasks_leased ON skiplock.tasks (lease_until)
    WHERE state IN ('running', 'cancelling');

-- An idempotency key is unique among tasks that still exist.
CREATE UNIQUE INDEX tasks_idempotency_key ON skiplock.tasks (idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- Listing and retention by state.
CREATE INDEX tasks_state_finished ON skiplock.tasks (state, finished_at)
    WHERE finished_at IS NOT NULL;

CREATE TABLE skiplock.task_events (
    task_id     uuid        NOT NULL,
    seq         integer     NOT NULL,
    type        text        NOT NULL,
    at          timestamptz NOT NULL DEFAULT now(),
    lease_token bigint,
    attempt     integer,
    data        jsonb,
    PRIMARY KEY (task_id, seq)
);

-- A paused queue or kind keeps its tasks queued; the claim skips them until resumed.
CREATE TABLE skiplock.pauses (
    scope     text        NOT NULL CHECK (scope IN ('queue', 'kind')),
    name      text        NOT NULL,
    paused_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, name)
);
