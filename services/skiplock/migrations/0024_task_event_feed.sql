-- The task event feed (GET /v1/events, its Server-Sent Events stream, the console's live pages):
-- each event row records the transaction that wrote it, and the feed reads events in that order.
--
-- Why not a sequence: a number taken from a sequence is taken when the row is written, not when
-- its transaction commits. Transaction A takes 100, B takes 101 and commits first; a reader that
-- returned 101 and moved its cursor past it would never return 100 once A commits. So the feed
-- orders events by (xid, task_id, seq) and returns only events of transactions older than the
-- oldest transaction still in progress (the reading statement's snapshot, engine/sql/events.sql):
-- every transaction that could still commit an event has a larger id than any event already
-- returned, so a cursor never passes an event that commits later. A rolled-back transaction's
-- events never exist to be read. The price: an event appears once every transaction that began
-- writing before its own has ended; a long write transaction delays the feed (never reorders it).
--
-- Adding a column without a default rewrites nothing; the default then fills new rows only.
-- Events written before this migration have no xid: the feed starts with the first event after it.
-- pg_current_xact_id() is the top-level transaction's id, also inside a savepoint.
ALTER TABLE skiplock.task_events ADD COLUMN xid xid8;
ALTER TABLE skiplock.task_events ALTER COLUMN xid SET DEFAULT pg_current_xact_id();

-- The feed's read is one range of this index, in its order. Built in the migration's transaction:
-- event writes wait while it reads task_events once; on a big table, build it first with
-- CREATE INDEX CONCURRENTLY under this name, then run the migration: IF NOT EXISTS keeps it.
CREATE INDEX IF NOT EXISTS task_events_feed ON skiplock.task_events (xid, task_id, seq)
    WHERE xid IS NOT NULL;
