-- Named statements about replication: where the primary's WAL stands and how far a replica has
-- replayed it (the API's reads on a replica, services/skiplock/api/replica.py). Positions are
-- byte offsets in the WAL (a pg_lsn minus '0/0'), so that the caller compares plain integers.

-- name: wal_flush_position
-- On the primary: the end of the WAL it has flushed, which is as far as a standby can receive.
SELECT (pg_current_wal_flush_lsn() - '0/0'::pg_lsn)::bigint AS position;

-- name: wal_insert_position
-- On the primary, right after a write committed: a position at or past that commit's record.
SELECT (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint AS position;

-- name: wal_replay_position
-- On a replica: how far it has replayed (every commit before it is visible there). A server that
-- is not in recovery is a primary, behind nothing: standby false.
SELECT pg_is_in_recovery() AS standby,
       (coalesce(pg_last_wal_replay_lsn(), '0/0'::pg_lsn) - '0/0'::pg_lsn)::bigint AS position;
