-- Named statements for webhook endpoints and the outbox of deliveries. engine/store/webhooks.py
-- runs them, one method per statement. Every write that ends or extends a delivery attempt
-- names the delivery, its lease token and the state it expects ('delivering'); a row it did not
-- touch was reclaimed.

-- name: webhook_endpoints_lock
-- Endpoint changes serialize here, so the outbox trigger's on/off switch follows the last one.
LOCK TABLE skiplock.webhook_endpoints IN SHARE ROW EXCLUSIVE MODE;

-- name: webhook_endpoints_any_enabled
SELECT EXISTS (SELECT 1 FROM skiplock.webhook_endpoints WHERE enabled);

-- name: outbox_trigger_enabled
SELECT EXISTS (SELECT FROM pg_trigger
               WHERE tgrelid = 'skiplock.task_events'::regclass AND tgname = 'task_events_outbox'
                 AND tgenabled <> 'D');

-- name: outbox_trigger_lock_timeout
-- Switching the trigger locks task_events against writers: never queue behind a long
-- transaction (and make every transition queue behind us) for more than this.
SET LOCAL lock_timeout = '5s';

-- name: outbox_trigger_drop
-- Not DISABLE TRIGGER: Postgres fills a disabled trigger's transition table all the same, a copy
-- of every event row written (migration 0008).
DROP TRIGGER IF EXISTS task_events_outbox ON skiplock.task_events;

-- name: outbox_trigger_create
CREATE TRIGGER task_events_outbox
    AFTER INSERT ON skiplock.task_events
    REFERENCING NEW TABLE AS new_events
    FOR EACH STATEMENT EXECUTE FUNCTION skiplock.outbox_fan_out();

-- name: webhook_endpoint_insert
INSERT INTO skiplock.webhook_endpoints (id, url, secret, event_types, description)
VALUES (%(id)s, %(url)s, %(secret)s, %(event_types)s, %(description)s)
RETURNING id, url, event_types, description, enabled, disabled_reason, created_at;

-- name: _webhook_endpoint_columns
SELECT e.id, e.url, e.event_types, e.description, e.enabled, e.disabled_reason, e.created_at,
       count(*) FILTER (WHERE d.state = 'pending' OR d.state = 'delivering') AS pending,
       count(*) FILTER (WHERE d.state = 'dead') AS dead
FROM skiplock.webhook_endpoints AS e
LEFT JOIN skiplock.webhook_deliveries AS d ON d.endpoint_id = e.id

-- name: webhook_endpoint_list
{{_webhook_endpoint_columns}}
GROUP BY e.id
ORDER BY e.created_at, e.id;

-- name: webhook_endpoint_get
{{_webhook_endpoint_columns}}
WHERE e.id = %(id)s
GROUP BY e.id;

-- name: webhook_endpoint_delete
DELETE FROM skiplock.webhook_endpoints WHERE id = %(id)s RETURNING id;

-- name: webhook_endpoint_set_secret
UPDATE skiplock.webhook_endpoints SET secret = %(secret)s, updated_at = now()
WHERE id = %(id)s RETURNING id;

-- name: webhook_endpoint_set_enabled
UPDATE skiplock.webhook_endpoints
SET enabled = %(enabled)s, disabled_reason = %(reason)s, updated_at = now()
WHERE id = %(id)s
RETURNING id;

-- name: _delivery_claim_picked
-- the deliveries a claim leases (webhook_delivery_claim, routed_delivery_claim)
due AS MATERIALIZED (
    SELECT d.id FROM skiplock.webhook_deliveries AS d
    JOIN skiplock.webhook_endpoints AS e ON e.id = d.endpoint_id AND e.enabled
    WHERE d.state = 'pending' AND d.next_attempt_at <= now()
    ORDER BY d.next_attempt_at
    LIMIT %(limit)s
    FOR UPDATE OF d SKIP LOCKED
), expired AS MATERIALIZED (
    SELECT d.id FROM skiplock.webhook_deliveries AS d
    JOIN skiplock.webhook_endpoints AS e ON e.id = d.endpoint_id AND e.enabled
    WHERE d.state = 'delivering' AND d.lease_until < now()
    ORDER BY d.lease_until
    LIMIT %(limit)s
    FOR UPDATE OF d SKIP LOCKED
), parked AS (
    -- an expired attempt of an endpoint disabled meanwhile goes back to waiting, unsent, until
    -- the endpoint is enabled again
    UPDATE skiplock.webhook_deliveries AS d
    SET state = 'pending', lease_token = NULL, lease_owner = NULL, lease_until = NULL, updated_at = now()
    FROM skiplock.webhook_endpoints AS e
    WHERE e.id = d.endpoint_id AND NOT e.enabled AND d.state = 'delivering' AND d.lease_until < now()
), picked AS MATERIALIZED (
    -- rows locked here but not picked stay locked only until this statement commits
    SELECT id FROM (SELECT id FROM expired UNION ALL SELECT id FROM due) AS c LIMIT %(limit)s
)

-- name: webhook_delivery_claim
-- Due deliveries of enabled endpoints, and attempts whose lease expired (their dispatcher died),
-- leased with a fresh token, with their task's trace context. MATERIALIZED keeps the LIMIT honest.
WITH {{_delivery_claim_picked}}, leased AS (
    UPDATE skiplock.webhook_deliveries AS d
    SET state = 'delivering',
        lease_token = nextval('skiplock.lease_tokens'),
        lease_owner = %(owner)s,
        lease_until = now() + %(lease_seconds)s * interval '1 second',
        updated_at = now()
    FROM picked
    WHERE d.id = picked.id
    RETURNING d.id, d.event_id, d.endpoint_id, d.event_type, d.payload, d.attempts, d.lease_token, d.created_at
)
SELECT l.id, l.event_id, l.endpoint_id, e.url, e.secret, l.event_type, l.payload, l.attempts,
       l.lease_token, l.created_at, t.trace_context
FROM leased AS l
JOIN skiplock.webhook_endpoints AS e ON e.id = l.endpoint_id
-- the task's trace context, sent on as `traceparent` (engine/tracing.py); retention may have
-- deleted the task by now
LEFT JOIN skiplock.tasks AS t ON t.id = (l.payload #>> '{data,task_id}')::uuid;

-- name: webhook_delivery_settle
-- Outcomes of attempts, many per round trip: delivered | retry | dead | released.
-- A released attempt (shutdown) gives its attempt back.
-- The times are worked out in `input`, not in the CASEs: Citus refuses a function that is not
-- IMMUTABLE inside a CASE (now(), timestamptz + interval) on a table it holds.
WITH input AS (
    SELECT i.*, now() AS at, now() + coalesce(i.delay, 0) * interval '1 second' AS retry_at
    FROM jsonb_to_recordset(%(outcomes)s::jsonb)
        AS i(id uuid, token bigint, outcome text, status integer, error text, delay float8)
)
UPDATE skiplock.webhook_deliveries AS d
SET state = CASE WHEN i.outcome IN ('delivered', 'dead') THEN i.outcome ELSE 'pending' END,
    attempts = CASE WHEN i.outcome = 'released' THEN d.attempts ELSE d.attempts + 1 END,
    next_attempt_at = CASE WHEN i.outcome IN ('retry', 'released') THEN i.retry_at ELSE d.next_attempt_at END,
    last_status = CASE WHEN i.outcome = 'released' THEN d.last_status ELSE i.status END,
    last_error = CASE WHEN i.outcome = 'released' THEN d.last_error ELSE i.error END,
    delivered_at = CASE WHEN i.outcome = 'delivered' THEN i.at END,
    lease_token = NULL, lease_owner = NULL, lease_until = NULL,
    updated_at = now()
FROM input AS i
WHERE d.id = i.id AND d.lease_token = i.token AND d.state = 'delivering'
RETURNING d.id, d.state;

-- name: webhook_delivery_heartbeat
UPDATE skiplock.webhook_deliveries AS d
SET lease_until = now() + %(lease_seconds)s * interval '1 second'
FROM unnest(%(ids)s::uuid[], %(tokens)s::bigint[]) AS i(id, token)
WHERE d.id = i.id AND d.lease_token = i.token AND d.state = 'delivering'
RETURNING d.id;

-- name: webhook_delivery_list
SELECT d.id, d.event_id, d.endpoint_id, d.event_type, d.payload, d.state, d.attempts,
       d.next_attempt_at, d.last_status, d.last_error, d.created_at, d.updated_at, d.delivered_at
FROM skiplock.webhook_deliveries AS d
WHERE (%(state)s::text IS NULL OR d.state = %(state)s)
  AND (%(endpoint_id)s::uuid IS NULL OR d.endpoint_id = %(endpoint_id)s)
  AND (%(after)s::uuid IS NULL OR d.id > %(after)s)
ORDER BY d.id
LIMIT %(limit)s;

-- name: webhook_delivery_list_newest
-- The latest deliveries (`skiplock deliveries list`): a top-N sort, as no index holds created_at;
-- the table holds what the retention keeps.
SELECT d.id, d.event_id, d.endpoint_id, d.event_type, d.payload, d.state, d.attempts,
       d.next_attempt_at, d.last_status, d.last_error, d.created_at, d.updated_at, d.delivered_at
FROM skiplock.webhook_deliveries AS d
WHERE (%(state)s::text IS NULL OR d.state = %(state)s)
  AND (%(endpoint_id)s::uuid IS NULL OR d.endpoint_id = %(endpoint_id)s)
ORDER BY d.created_at DESC, d.id DESC
LIMIT %(limit)s;

-- name: webhook_delivery_get
SELECT d.id, d.event_id, d.endpoint_id, d.event_type, d.payload, d.state, d.attempts,
       d.next_attempt_at, d.last_status, d.last_error, d.created_at, d.updated_at, d.delivered_at
FROM skiplock.webhook_deliveries AS d
WHERE d.id = %(id)s;

-- name: webhook_delivery_redeliver
-- Dead deliveries back to pending with a fresh attempt budget: one by id, or all of an endpoint.
UPDATE skiplock.webhook_deliveries
SET state = 'pending', attempts = 0, next_attempt_at = now(), last_error = NULL, updated_at = now()
WHERE state = 'dead'
  AND ((%(id)s::uuid IS NOT NULL AND id = %(id)s)
       OR (%(endpoint_id)s::uuid IS NOT NULL AND endpoint_id = %(endpoint_id)s))
RETURNING id;

-- name: outbox_stats
-- skiplock_outbox_pending and skiplock_outbox_oldest_pending_age_seconds.
SELECT count(*),
       coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8
FROM skiplock.webhook_deliveries
WHERE state IN ('pending', 'delivering');

-- name: webhook_delivery_delete_old
-- Retention of delivered or dead deliveries (dead ones are kept as long as failed tasks).
WITH doomed AS MATERIALIZED (
    SELECT id FROM skiplock.webhook_deliveries
    WHERE state = %(state)s AND state IN ('delivered', 'dead')
      AND updated_at < now() - %(older_than)s * interval '1 second'
    ORDER BY updated_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM skiplock.webhook_deliveries AS d USING doomed WHERE d.id = doomed.id
RETURNING d.id;

-- name: webhook_endpoint_disable_dying
-- Of the endpoints whose deliveries just died: disable those none of whose deliveries succeeded
-- for %(window)s seconds while they kept dying (a delivery died that long ago, after the last
-- success); an endpoint younger than that is left alone. Runs only when a delivery dies.
UPDATE skiplock.webhook_endpoints AS e
SET enabled = false, updated_at = now(),
    disabled_reason = 'every delivery died for ' || round((%(window)s / 3600.0)::numeric, 1) || ' hours (none delivered since '
                      || coalesce(to_char(last.at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI "UTC"'), 'it was added')
                      || '): disabled; enable it again by hand once the receiver answers'
FROM (SELECT id, (SELECT max(d.delivered_at) FROM skiplock.webhook_deliveries AS d
                  WHERE d.endpoint_id = ep.id AND d.state = 'delivered') AS at
      FROM skiplock.webhook_endpoints AS ep
      WHERE ep.id = ANY(%(endpoint_ids)s::uuid[])) AS last
WHERE e.id = last.id AND e.enabled
  AND e.created_at <= now() - make_interval(secs => %(window)s)
  AND coalesce(last.at, '-infinity') < now() - make_interval(secs => %(window)s)
  AND EXISTS (SELECT 1 FROM skiplock.webhook_deliveries AS d
              WHERE d.endpoint_id = e.id AND d.state = 'dead'
                AND d.updated_at <= now() - make_interval(secs => %(window)s)
                AND d.updated_at > coalesce(last.at, '-infinity'))
RETURNING e.id, e.url, e.disabled_reason;
