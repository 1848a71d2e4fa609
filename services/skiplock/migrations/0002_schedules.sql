-- Schedules: durable cron and interval definitions, fired by `skiplock scheduler` replicas.
--
-- A tick locks due rows with FOR UPDATE SKIP LOCKED, enqueues their tasks and advances
-- next_fire_at in one transaction, so each nominal fire time is decided once however many
-- replicas run. The task's idempotency key is derived from (name, nominal time) as a second guard.

CREATE TABLE skiplock.schedules (
    name             text        PRIMARY KEY,
    kind             text        NOT NULL,
    queue            text        NOT NULL DEFAULT 'default',
    payload          jsonb       NOT NULL DEFAULT '{}',
    priority         smallint    NOT NULL DEFAULT 0,
    max_attempts     integer     CHECK (max_attempts > 0),
    -- exactly one of cron (5 fields or an @alias, in `timezone`) and interval_seconds
    cron             text,
    timezone         text        NOT NULL DEFAULT 'UTC',
    interval_seconds double precision CHECK (interval_seconds > 0),
    overlap          text        NOT NULL DEFAULT 'skip'
                     CHECK (overlap IN ('skip', 'allow', 'buffer_one', 'cancel_previous')),
    catchup          text        NOT NULL DEFAULT 'one' CHECK (catchup IN ('one', 'all', 'none')),
    -- catch-up 'all' fires missed times no older than this; older ones are dropped
    catchup_window_seconds double precision NOT NULL DEFAULT 3600 CHECK (catchup_window_seconds > 0),
    -- each fire's task becomes claimable up to this many seconds after the fire (spreads load)
    jitter_seconds   double precision NOT NULL DEFAULT 0 CHECK (jitter_seconds >= 0),
    enabled          boolean     NOT NULL DEFAULT true,
    -- the nominal time of the next fire
    next_fire_at     timestamptz NOT NULL,
    -- overlap 'buffer_one': a nominal time waiting for the previous fire's task to finish
    buffered_fire_at timestamptz,
    last_fire_at     timestamptz,
    last_task_id     uuid,
    fires            bigint      NOT NULL DEFAULT 0,
    skips            bigint      NOT NULL DEFAULT 0,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    CHECK ((cron IS NULL) <> (interval_seconds IS NULL))
);

-- The tick reads only enabled rows, soonest first.
CREATE INDEX schedules_due ON skiplock.schedules (next_fire_at) WHERE enabled;

-- One row per decision about a nominal fire time: fired, skipped (overlap), buffered, missed
-- (catch-up dropped it). The primary key makes a second decision about one time impossible.
CREATE TABLE skiplock.schedule_fires (
    schedule   text        NOT NULL,
    nominal_at timestamptz NOT NULL,
    at         timestamptz NOT NULL DEFAULT now(),
    outcome    text        NOT NULL CHECK (outcome IN ('fired', 'skipped', 'buffered', 'missed')),
    task_id    uuid,
    detail     text,
    PRIMARY KEY (schedule, nominal_at)
);

-- Retention deletes old decisions in batches.
CREATE INDEX schedule_fires_at ON skiplock.schedule_fires (at);
