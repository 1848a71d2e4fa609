-- Webhooks: endpoints, and the transactional outbox of deliveries the dispatcher drains.
--
-- Fan-out happens at write time: a statement-level trigger on task_events inserts one delivery
-- per matching enabled endpoint for every event the statement wrote, in the same transaction as
-- the transition (a rolled-back transition leaves no delivery). The trigger is disabled while no
-- endpoint is enabled (store.py switches it when endpoints change), so it costs nothing then.

CREATE TABLE skiplock.webhook_endpoints (
    id              uuid        PRIMARY KEY,
    url             text        NOT NULL,
    -- Standard Webhooks secret: 'whsec_' + base64 of the key bytes
    secret          text        NOT NULL CHECK (secret LIKE 'whsec\_%'),
    -- exact event types ('task.completed') or 'task.*'
    event_types     text[]      NOT NULL CHECK (cardinality(event_types) > 0),
    description     text,
    enabled         boolean     NOT NULL DEFAULT true,
    disabled_reason text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE skiplock.webhook_deliveries (
    id              uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    -- stable per task event (the `webhook-id` of every attempt): derived from (task id, seq)
    event_id        uuid        NOT NULL,
    endpoint_id     uuid        NOT NULL REFERENCES skiplock.webhook_endpoints (id) ON DELETE CASCADE,
    event_type      text        NOT NULL,
    payload         jsonb       NOT NULL,
    state           text        NOT NULL DEFAULT 'pending'
                    CHECK (state IN ('pending', 'delivering', 'delivered', 'dead')),
    attempts        integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    lease_token     bigint,
    lease_owner     text,
    lease_until     timestamptz,
    last_status     integer,
    last_error      text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    delivered_at    timestamptz
);

-- The dispatcher's claim reads only these two partial indexes.
CREATE INDEX webhook_deliveries_due ON skiplock.webhook_deliveries (next_attempt_at)
    WHERE state = 'pending';
CREATE INDEX webhook_deliveries_leased ON skiplock.webhook_deliveries (lease_until)
    WHERE state = 'delivering';
CREATE INDEX webhook_deliveries_endpoint ON skiplock.webhook_deliveries (endpoint_id, state);
CREATE INDEX webhook_deliveries_finished ON skiplock.webhook_deliveries (updated_at)
    WHERE state IN ('delivered', 'dead');

CREATE FUNCTION skiplock.outbox_fan_out() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO skiplock.webhook_deliveries (event_id, endpoint_id, event_type, payload)
    SELECT md5(e.task_id::text || ':' || e.seq::text)::uuid,
           ep.id,
           'task.' || e.type,
           jsonb_build_object(
               'type', 'task.' || e.type,
               'timestamp', e.at,
               'data', jsonb_strip_nulls(jsonb_build_object(
                   'task_id', t.id, 'kind', t.kind, 'queue', t.queue, 'state', t.state,
                   'attempt', e.attempt, 'seq', e.seq,
                   'result', CASE WHEN e.type = 'completed' THEN t.result END,
                   'error', CASE WHEN e.type IN ('failed', 'retrying', 'reclaimed')
                                 THEN coalesce(e.data ->> 'error', t.last_error) END)))
    FROM new_events AS e
    JOIN skiplock.tasks AS t ON t.id = e.task_id
    JOIN skiplock.webhook_endpoints AS ep
      ON ep.enabled AND ('task.' || e.type = ANY (ep.event_types) OR 'task.*' = ANY (ep.event_types));
    RETURN NULL;
END
$$;

CREATE TRIGGER task_events_outbox
    AFTER INSERT ON skiplock.task_events
    REFERENCING NEW TABLE AS new_events
    FOR EACH STATEMENT EXECUTE FUNCTION skiplock.outbox_fan_out();

-- no endpoint yet: no fan-out cost
ALTER TABLE skiplock.task_events DISABLE TRIGGER task_events_outbox;
