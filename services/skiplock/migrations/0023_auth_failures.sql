-- Wrong tokens per client address (issue 35): the API and the console's sign-in count them here,
-- across every API process, and refuse an address past SKIPLOCK_API_MAX_AUTH_FAILURES a minute
-- (api/auth_throttle.py). One row per address that presented a wrong token lately; each count
-- deletes the rows whose minute ended an hour ago, so the table holds the last hour's addresses.
CREATE TABLE skiplock.auth_failures (
    client text PRIMARY KEY,
    window_start timestamptz NOT NULL,
    failures integer NOT NULL
);
CREATE INDEX auth_failures_window_start ON skiplock.auth_failures (window_start);
