-- The console's sessions ended on the server (migration 0022): sign-out, and sign-out of every
-- session of one token.

-- name: console_session_end
-- one sign-out; also forgets the sign-outs older than any cookie can live (%(max_age)s seconds)
WITH forgotten AS (
    DELETE FROM skiplock.console_sessions_ended
    WHERE ended_at < now() - make_interval(secs => %(max_age)s)
)
INSERT INTO skiplock.console_sessions_ended (session_id) VALUES (%(session_id)s)
ON CONFLICT (session_id) DO NOTHING
RETURNING session_id;

-- name: console_session_ended
-- whether a session (its id, its token's name and the generation it was opened in) was ended
SELECT EXISTS (SELECT 1 FROM skiplock.console_sessions_ended WHERE session_id = %(session_id)s)
    OR COALESCE((SELECT generation FROM skiplock.console_token_sign_outs
                 WHERE token_name = %(token_name)s), 0) > %(generation)s;

-- name: console_token_generation
SELECT COALESCE((SELECT generation FROM skiplock.console_token_sign_outs
                 WHERE token_name = %(token_name)s), 0);

-- name: console_token_sign_out
-- ends every session opened with that token so far; returns the new generation
INSERT INTO skiplock.console_token_sign_outs AS s (token_name, generation, signed_out_at)
VALUES (%(token_name)s, 1, now())
ON CONFLICT (token_name) DO UPDATE SET generation = s.generation + 1, signed_out_at = EXCLUDED.signed_out_at
RETURNING generation;

-- name: auth_failure_record
-- one wrong token from %(client)s: its count in the current window of %(window)s seconds (a new
-- window starts at the first failure after the last one ended), and the seconds left in it
WITH forgotten AS (
    DELETE FROM skiplock.auth_failures
    WHERE window_start < now() - make_interval(secs => %(window)s) - interval '1 hour'
)
INSERT INTO skiplock.auth_failures AS f (client, window_start, failures)
VALUES (%(client)s, now(), 1)
ON CONFLICT (client) DO UPDATE SET
    window_start = CASE WHEN f.window_start <= now() - make_interval(secs => %(window)s)
                        THEN now() ELSE f.window_start END,
    failures = CASE WHEN f.window_start <= now() - make_interval(secs => %(window)s)
                    THEN 1 ELSE f.failures + 1 END
RETURNING failures,
    greatest(0, extract(epoch FROM f.window_start + make_interval(secs => %(window)s) - now()))::float8;
