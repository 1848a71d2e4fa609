"""The ceiling: a plain table drained by a bare FOR UPDATE SKIP LOCKED loop (psycopg 3).

Each worker process loops: claim up to ``$BENCH_RAW_BATCH`` (100) queued rows in one statement,
run the no-op handler on each, then mark the whole batch done in one statement. When the claim
finds nothing it waits on LISTEN (the enqueue side's statement trigger NOTIFYs), with a short
timeout as a fallback poll. SIGTERM/SIGINT stop it after the current batch; it exits 0.
"""

from __future__ import annotations

import signal
import sys

_stopping = False


def _stop(signum: int, frame: object) -> None:
    global _stopping
    _stopping = True


# Installed before the heavier imports, so a SIGTERM during start-up is a clean stop too.
signal.signal(signal.SIGTERM, _stop)
signal.signal(signal.SIGINT, _stop)

import os  # noqa: E402

import psycopg  # noqa: E402

from tests.benchmarks import latency  # noqa: E402

CHANNEL = "bench_raw"

SCHEMA = f"""
CREATE TABLE bench_tasks (
    id          bigserial   PRIMARY KEY,
    kind        text        NOT NULL,
    payload     jsonb       NOT NULL DEFAULT '{{}}',
    state       text        NOT NULL DEFAULT 'queued',
    created_at  timestamptz NOT NULL DEFAULT now(),
    started_at  timestamptz,
    finished_at timestamptz
);
CREATE INDEX bench_tasks_queued ON bench_tasks (id) WHERE state = 'queued';
CREATE FUNCTION bench_tasks_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('{CHANNEL}', '');
    RETURN NULL;
END $$;
CREATE TRIGGER bench_tasks_notify AFTER INSERT ON bench_tasks
    FOR EACH STATEMENT EXECUTE FUNCTION bench_tasks_notify();
"""

CLAIM = """
WITH picked AS MATERIALIZED (
    SELECT id FROM bench_tasks
    WHERE state = 'queued'
    ORDER BY id
    LIMIT %s
    FOR UPDATE SKIP LOCKED
)
UPDATE bench_tasks t
SET state = 'running', started_at = clock_timestamp()
FROM picked
WHERE t.id = picked.id
RETURNING t.id, t.payload
"""

COMPLETE = """
UPDATE bench_tasks SET state = 'done', finished_at = clock_timestamp() WHERE id = ANY(%s)
"""


def noop(payload: object) -> None:
    latency.record(payload)


def main() -> int:
    url = os.environ["BENCH_DB_URL"]
    batch = int(os.environ.get("BENCH_RAW_BATCH", "100"))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"LISTEN {CHANNEL}")
        while not _stopping:
            rows = conn.execute(CLAIM, (batch,)).fetchall()
            if not rows:
                # Wake on the next NOTIFY, or re-poll after a short while (also notices SIGTERM).
                for _ in conn.notifies(timeout=0.5, stop_after=1):
                    pass
                continue
            for _id, payload in rows:
                noop(payload)
            conn.execute(COMPLETE, ([r[0] for r in rows],))
    return 0


if __name__ == "__main__":
    sys.exit(main())
