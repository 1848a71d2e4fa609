-- The task event feed: every task's events in one order a reader can resume (GET /v1/events,
-- its stream, the console's live pages). Statements run by engine/store/events.py.
--
-- The order is (xid, task_id, seq): the writing transaction's id first (migration 0024 says why
-- not a sequence). A read returns only events of transactions below the horizon: the oldest
-- transaction still in progress when the statement's snapshot was taken, or, with none, the next
-- transaction id to be given out. Every transaction that can still commit an event has an id at
-- or above the horizon, above every event a cursor has passed, so no event commits behind a cursor.
--
-- Transactions of other databases of the server never write these tables: they are left out of
-- the horizon (pg_stat_activity names their database), so a long transaction of another
-- application does not hold this feed back. One of this database, whatever it writes, does, for
-- as long as it lasts; a transaction whose backend pg_stat_activity does not show (a prepared
-- one) counts as this database's.

-- name: event_feed_read
-- Up to %(scan)s events after the cursor (xid, task_id, seq) and below the horizon, in feed order,
-- of which those of the filters, up to %(limit)s, are returned; every row also carries the
-- horizon and the last event scanned (the cursor moves past events the filters leave out). One
-- row with NULL event columns when none matched.
WITH snapshot AS MATERIALIZED (
    SELECT pg_current_snapshot() AS s
), horizon AS MATERIALIZED (
    SELECT coalesce(
        (SELECT min(x) FROM snapshot, pg_snapshot_xip(snapshot.s) AS x
         WHERE NOT EXISTS (SELECT FROM pg_stat_activity AS a
                           WHERE a.backend_xid = xid(x) AND a.datname <> current_database())),
        (SELECT pg_snapshot_xmax(s) FROM snapshot)) AS xid
), scanned AS MATERIALIZED (
    SELECT e.xid, e.task_id, e.seq, e.type, e.at, e.lease_token, e.attempt, e.data
    FROM skiplock.task_events AS e
    WHERE e.xid IS NOT NULL
      AND (e.xid, e.task_id, e.seq) > (%(xid)s::xid8, %(task_id)s::uuid, %(seq)s::integer)
      AND e.xid < (SELECT xid FROM horizon)
    ORDER BY e.xid, e.task_id, e.seq
    LIMIT %(scan)s
), matched AS MATERIALIZED (
    SELECT s.xid, s.task_id, s.seq, s.type, s.at, s.lease_token, s.attempt, s.data, t.queue, t.kind
    FROM scanned AS s
    -- a task deleted since (retention, purge) takes its events out of the feed
    JOIN skiplock.tasks AS t ON t.id = s.task_id
    WHERE (%(queue)s::text IS NULL OR t.queue = %(queue)s::text)
      AND (%(kind)s::text IS NULL OR t.kind = %(kind)s::text)
      AND (%(task)s::uuid IS NULL OR s.task_id = %(task)s::uuid)
    ORDER BY s.xid, s.task_id, s.seq
    LIMIT %(limit)s
), summary AS (
    SELECT (SELECT xid FROM horizon)::text AS horizon, l.xid::text AS last_xid, l.task_id AS last_task_id,
           l.seq AS last_seq, (SELECT count(*) FROM scanned) AS scanned
    FROM (SELECT) AS one
    LEFT JOIN LATERAL (SELECT xid, task_id, seq FROM scanned
                       ORDER BY xid DESC, task_id DESC, seq DESC LIMIT 1) AS l ON true
)
SELECT m.xid::text AS xid, m.task_id, m.seq, m.type, m.at, m.lease_token, m.attempt, m.data, m.queue, m.kind,
       s.horizon, s.last_xid, s.last_task_id, s.last_seq, s.scanned
FROM summary AS s
LEFT JOIN matched AS m ON true
ORDER BY m.xid, m.task_id, m.seq;
