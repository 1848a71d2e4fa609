-- The HTTP API's records: the audit log of mutating requests, and the fingerprint of the body a
-- task was submitted with, which decides whether a repeated Idempotency-Key is a replay.

-- One row per mutating API request that passed authentication, written in the same transaction
-- as the change it records (a refused action gets its row in a transaction of its own).
CREATE TABLE skiplock.audit_log (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at         timestamptz NOT NULL DEFAULT now(),
    -- the name of the API token (SKIPLOCK_API_TOKENS), 'anonymous' while auth is disabled
    actor      text        NOT NULL,
    -- 'task.cancel', 'queue.pause', 'schedule.update', ...
    action     text        NOT NULL,
    -- what the action was about: a task id, a queue or kind name, a schedule name
    target     text,
    request_id text,
    -- 'ok', or the error code the request was refused with ('task.not_resumable', ...)
    outcome    text        NOT NULL,
    detail     jsonb
);

CREATE INDEX audit_log_action ON skiplock.audit_log (action, id);

-- sha256 of the normalized submission (kind, queue, priority, payload, timing, attempts,
-- deadline). Set only for tasks submitted over the API with an Idempotency-Key; dies with the task.
ALTER TABLE skiplock.tasks ADD COLUMN request_hash text;
