-- The worker registry: one row per running worker process, for operators (the console's Workers
-- page, `skiplock workers list`, the skiplock_workers gauges). Nothing decides a claim or an
-- outcome from it: leases fence task writes, this table only describes who is out there.
--
-- A worker inserts its row when it starts, renews it with its heartbeat and deletes it when it
-- exits cleanly. A worker that dies without exiting (kill -9, a lost node) leaves its row behind;
-- the scheduler's maintenance deletes a row whose heartbeat is older than three of its leases.
CREATE TABLE skiplock.workers (
    -- the worker's name, the lease_owner of the tasks it claims
    id            text        PRIMARY KEY,
    -- SKIPLOCK_POD_NAME when set, else the host name
    host          text        NOT NULL,
    pid           integer     NOT NULL,
    queues        text[]      NOT NULL,
    concurrency   integer     NOT NULL,
    -- tasks claimed and not yet settled, as of the last heartbeat
    in_flight     integer     NOT NULL DEFAULT 0,
    -- the skiplock package version the worker runs
    version       text        NOT NULL,
    -- the lease the worker grants its claims; its row is stale after three of them
    lease_seconds real        NOT NULL,
    started_at    timestamptz NOT NULL DEFAULT now(),
    heartbeat_at  timestamptz NOT NULL DEFAULT now()
);
