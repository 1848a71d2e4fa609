-- A task's created_at and updated_at, as it is inserted, are the moment its row is written
-- (clock_timestamp()), no longer the start of the inserting transaction (now()).
--
-- The reason is bulk enqueue's speed. Postgres's COPY buffers rows and writes them a thousand at
-- a time (heap_multi_insert) unless a column it fills by default has a volatile default; then
-- it inserts row by row. For this table (three indexes written per row and the tasks_inserted
-- trigger's transition table), row by row is the faster of the two: on the development machine
-- a COPY of 1,000 tasks took about 12 % less backend time, one of 10,000 about 28 % less, and
-- bulk enqueue_many gained 13-22 %. The buffered path builds a tuple slot for each of the first
-- thousand rows of every COPY and then indexes the rows of each buffer in a second pass.
--
-- What changes for a reader: within one bulk call created_at now rises row by row, and in a
-- long transaction it is later than the transaction's start. run_after (when a task is due)
-- and the events' `at` still default to now(). Updates still set updated_at = now().

ALTER TABLE skiplock.tasks
    ALTER COLUMN created_at SET DEFAULT clock_timestamp(),
    ALTER COLUMN updated_at SET DEFAULT clock_timestamp();
