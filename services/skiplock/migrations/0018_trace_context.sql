-- The W3C trace context of the code that enqueued a task (issue 22): {"traceparent": ...,
-- "tracestate": ...} when OpenTelemetry was recording there, else NULL. The worker runs each
-- attempt in a span whose parent it names, so retries, reclaims and steps of one task stay in
-- the enqueuer's trace. NULL costs a bit in the row's null bitmap; no index reads it.
ALTER TABLE skiplock.tasks ADD COLUMN trace_context jsonb;
