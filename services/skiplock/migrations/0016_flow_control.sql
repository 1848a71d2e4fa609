-- Flow control (issue 20): concurrency and rate limits per (kind, concurrency_key) group, and fair
-- share between the groups of a kind, all enforced by the claim.
--
-- How it holds together (docs/ARCHITECTURE.md, "Flow control"):
-- - A limit is a row of skiplock.limits, per kind. Every worker reads it in its claim, so every
--   worker enforces the same limits whatever version of the code it runs.
-- - Enqueue does not look at limits. A queued task is in tasks_claimable until a claim meets it
--   there and finds its kind limited: that claim *parks* it (limited = true), which moves it into
--   tasks_parked, and records its group in limit_groups. Tasks of kinds without a limit never leave
--   tasks_claimable, and the claim's scan of it never steps over a throttled task again.
-- - The claim's second part walks limit_groups (least recently served first, each group row locked
--   FOR UPDATE SKIP LOCKED, so two claims never count the same group's room at once and never wait
--   for each other) and takes from each group what its limit leaves room for, round robin.
-- - A parked task stays limited while it runs: tasks_limited_running counts a group's live runs
--   (lease not expired: a killed worker's slot frees when its lease does). Every write that makes a
--   task queued again (retry, step, release, reclaim, resume) clears limited, so the next claim
--   parks it again, under the limit in force then.
LOCK TABLE skiplock.tasks IN ACCESS EXCLUSIVE MODE;

ALTER TABLE skiplock.tasks
    -- '' for none: the tasks of a kind without a key form one group
    ADD COLUMN concurrency_key text NOT NULL DEFAULT '',
    ADD COLUMN limited boolean NOT NULL DEFAULT false;

-- tasks_claimable without the parked tasks (the claim's scan must not step over throttled ones)
DROP INDEX skiplock.tasks_claimable;
CREATE INDEX tasks_claimable ON skiplock.tasks (queue, priority DESC, run_after, id)
    WHERE state = 'queued' AND NOT limited;

-- a group's parked tasks, in claim order
CREATE INDEX tasks_parked ON skiplock.tasks (kind, concurrency_key, queue, priority DESC, run_after, id)
    WHERE state = 'queued' AND limited;

-- a group's runs; the claim counts those whose lease has not expired
CREATE INDEX tasks_limited_running ON skiplock.tasks (kind, concurrency_key, lease_until)
    WHERE limited AND state IN ('running', 'cancelling');

CREATE TABLE skiplock.limits (
    kind          text        PRIMARY KEY,
    -- at most this many runs of one group at once
    concurrency   integer     CHECK (concurrency > 0),
    -- at most rate_count starts per rate_seconds per group, up to burst at once (a token bucket)
    rate_count    integer     CHECK (rate_count > 0),
    rate_seconds  float8      CHECK (rate_seconds > 0),
    -- set with the rate (the definition fills in its default)
    burst         integer     CHECK (burst > 0),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    CHECK ((rate_count IS NULL) = (rate_seconds IS NULL)),
    CHECK ((burst IS NULL) = (rate_count IS NULL)),
    CHECK (concurrency IS NOT NULL OR rate_count IS NOT NULL)
);

-- One row per group that has had parked tasks: the lock two claims of one group take in turn,
-- the group's token bucket and its place in the rotation.
CREATE TABLE skiplock.limit_groups (
    kind            text        NOT NULL,
    concurrency_key text        NOT NULL,
    -- the bucket as of tokens_at (NULL: full); the claim refills it on the database's clock
    tokens          float8,
    tokens_at       timestamptz,
    -- the last claim that started one of its tasks: the least recently served goes first
    served_at       timestamptz NOT NULL DEFAULT '-infinity',
    -- a claim found no parked task of the group; parking one clears it
    drained         boolean     NOT NULL DEFAULT false,
    PRIMARY KEY (kind, concurrency_key)
);

CREATE INDEX limit_groups_rotation ON skiplock.limit_groups (served_at) WHERE NOT drained;
