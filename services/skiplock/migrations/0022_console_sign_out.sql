-- Sign-out that ends a console session on the server (issue 35). A session is a signed cookie;
-- without state kept here, a copy of it kept after sign-out still worked until it expired (8 h).
--
-- console_sessions_ended: the sessions signed out, by the random id each cookie carries. A row
-- matters only while such a cookie could still be valid (its 8 hours); each sign-out deletes
-- the rows older than that, so the table holds at most the sign-outs of the last 8 hours.
-- console_token_sign_outs: "sign out every session of token N": a generation per token name,
-- carried by each session opened with it; a session of an older generation is ended.
CREATE TABLE skiplock.console_sessions_ended (
    session_id text PRIMARY KEY,
    ended_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX console_sessions_ended_at ON skiplock.console_sessions_ended (ended_at);

CREATE TABLE skiplock.console_token_sign_outs (
    token_name text PRIMARY KEY,
    generation bigint NOT NULL,
    signed_out_at timestamptz NOT NULL DEFAULT now()
);
