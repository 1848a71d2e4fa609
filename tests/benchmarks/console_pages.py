"""How fast each console page answers with a million tasks in the table (issue 17: p95 <= 300 ms).

    python -m tests.benchmarks.console_pages [--tasks 1000000] [--runs 30] [--existing-server]
                                             [--explain]

Starts a throwaway Postgres cluster (tests/pgcluster.py; default planner and autovacuum settings)
unless --existing-server uses $SKIPLOCK_TEST_DATABASE_URL (or the local server) instead, migrates a
database, seeds it with INSERT ... SELECT generate_series (tasks over 30 days in five queues and
eight kinds, mostly completed; their events; a few schedules, webhooks, deliveries, audit rows and
workers), runs VACUUM ANALYZE (what autovacuum does to a table that size soon after a bulk load),
then serves the real API app (`create_app`) with Werkzeug's threaded WSGI server on 127.0.0.1,
signs in to the console with a token and requests each page --runs times, printing page, p50,
p95 and max in ms (also GET /v1/queues and GET /v1/tasks with a filter that matches nothing).
--explain also prints EXPLAIN (ANALYZE, BUFFERS) of the task listings and of queue_task_counts.

A report: nothing here asserts a timing. Results go to tests/benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import hashlib
import http.cookiejar
import logging
import re
import secrets
import statistics
import threading
import time
import urllib.parse
import urllib.request

import psycopg
from werkzeug.serving import make_server

from skiplock.api.app import create_app
from skiplock.engine import migrate
from skiplock.engine.settings import Settings, parse_api_tokens
from tests import pgcluster

TOKEN = "bench-admin-token"
DAYS = 30

# One statement per table. Shares are cumulative cut points over a uniform r in [0, 1).
SEED_TASKS = """
INSERT INTO skiplock.tasks (id, kind, queue, priority, payload, state, attempts, run_after,
                            idempotency_key, event_seq, created_at, updated_at, started_at,
                            finished_at, last_error, lease_owner, lease_until, lease_token)
SELECT encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid())
                PLACING substring(int8send((extract(epoch FROM s.created_at) * 1000)::bigint) FROM 3)
                FROM 1 FOR 6), 52, 1), 53, 1), 'hex')::uuid,
       s.kind, s.queue, 0, jsonb_build_object('n', s.i), s.state,
       CASE WHEN s.state IN ('completed', 'failed') THEN 1 ELSE 0 END,
       s.created_at,
       CASE WHEN s.i %% 10 = 0 THEN 'key-' || s.i END,
       CASE s.state WHEN 'queued' THEN 1 WHEN 'running' THEN 2 ELSE 3 END,
       s.created_at, s.created_at,
       CASE WHEN s.state <> 'queued' THEN s.created_at + interval '1 second' END,
       CASE WHEN s.state IN ('completed', 'failed', 'cancelled') THEN s.created_at + interval '2 seconds' END,
       CASE WHEN s.state = 'failed' THEN 'ValueError: boom' END,
       CASE WHEN s.state = 'running' THEN 'worker-1' END,
       CASE WHEN s.state = 'running' THEN now() + interval '1 minute' END,
       CASE WHEN s.state = 'running' THEN s.i END
FROM (
    SELECT i,
           -- in-flight tasks are the newest ones, as in a live system
           now() - (%(days)s * interval '1 day') * (1 - i::float8 / %(n)s) AS created_at,
           (ARRAY['default', 'default', 'emails', 'reports', 'billing'])[1 + i %% 5]
               || CASE WHEN i %% 100 = 7 THEN '-rare' ELSE '' END AS queue,
           CASE WHEN i %% 1000 = 3 THEN 'audit.rare' ELSE 'kind.' || (i %% 7) END AS kind,
           CASE WHEN i > %(n)s * 0.97 AND i %% 2 = 0 THEN 'queued'
                WHEN i > %(n)s * 0.99 AND i %% 3 = 0 THEN 'running'
                WHEN i %% 67 = 1 THEN 'failed'
                WHEN i %% 199 = 2 THEN 'cancelled'
                ELSE 'completed' END AS state
    FROM generate_series(1, %(n)s) AS i
) AS s
"""

SEED_EVENTS = """
INSERT INTO skiplock.task_events (task_id, seq, type, at, lease_token, attempt, data)
SELECT t.id, e.seq, e.type, t.created_at + (e.seq - 1) * interval '1 second', NULL, t.attempts,
       CASE WHEN e.type = 'failed' THEN '{"error": "ValueError: boom", "traceback": "Traceback ..."}'::jsonb END
FROM skiplock.tasks AS t
CROSS JOIN LATERAL (
    SELECT seq, (ARRAY['queued', CASE WHEN t.state = 'cancelled' THEN 'cancelled' ELSE 'running' END, t.state])[seq] AS type
    FROM generate_series(1, t.event_seq) AS seq
) AS e
"""

SEED_REST = [
    """INSERT INTO skiplock.schedules (name, kind, queue, interval_seconds, next_fire_at)
       SELECT 'schedule-' || i, 'kind.' || (i % 7), 'default', 60 * i, now() + i * interval '1 minute'
       FROM generate_series(1, 50) AS i""",
    """INSERT INTO skiplock.webhook_endpoints (id, url, secret, event_types)
       SELECT skiplock.uuid7(), 'https://hooks.example.com/' || i, 'whsec_' || md5(i::text), ARRAY['task.failed']
       FROM generate_series(1, 10) AS i""",
    """INSERT INTO skiplock.webhook_deliveries (event_id, endpoint_id, event_type, payload, state, created_at)
       SELECT gen_random_uuid(), e.id, 'task.failed', '{}'::jsonb,
              CASE WHEN i % 50 = 0 THEN 'dead' ELSE 'delivered' END, now() - i * interval '1 second'
       FROM generate_series(1, 20000) AS i
       CROSS JOIN LATERAL (SELECT id FROM skiplock.webhook_endpoints ORDER BY id OFFSET i % 10 LIMIT 1) AS e""",
    """INSERT INTO skiplock.audit_log (actor, action, target, outcome)
       SELECT 'admin-bot', (ARRAY['task.cancel', 'task.resume', 'queue.pause', 'schedule.update'])[1 + i % 4],
              'target-' || i, 'ok'
       FROM generate_series(1, 50000) AS i""",
    """INSERT INTO skiplock.workers (id, host, pid, queues, concurrency, version, lease_seconds)
       SELECT 'worker-' || i, 'host-' || i, 1000 + i, ARRAY['default', 'emails'], 10, 'bench', 30
       FROM generate_series(1, 20) AS i""",
]

EXPLAINED = ("task_list",)


def seed(url: str, n: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        started = time.perf_counter()
        # The insert trigger would write every 'queued' event at now(): a million events in the
        # last minute, which skews the planner's estimates for every read of recent events.
        conn.execute("ALTER TABLE skiplock.tasks DISABLE TRIGGER tasks_inserted")
        conn.execute(SEED_TASKS, {"n": n, "days": DAYS})
        conn.execute("ALTER TABLE skiplock.tasks ENABLE TRIGGER tasks_inserted")
        conn.execute(SEED_EVENTS)
        for statement in SEED_REST:
            conn.execute(statement)
        seeded = time.perf_counter()
        conn.execute("VACUUM ANALYZE")
        print(f"seeded {n} tasks in {seeded - started:.1f} s, VACUUM ANALYZE {time.perf_counter() - seeded:.1f} s",
              flush=True)


def pages(url: str) -> list[tuple[str, str]]:
    """(label, path) of each console page, with filter values taken from the seeded data."""
    with psycopg.connect(url, autocommit=True) as conn:
        one = conn.execute("SELECT id, idempotency_key FROM skiplock.tasks WHERE state = 'failed' "
                           "AND idempotency_key IS NOT NULL LIMIT 1").fetchone()
        deep = conn.execute("SELECT id FROM skiplock.tasks ORDER BY id DESC OFFSET "
                            "(SELECT count(*) * 9 / 10 FROM skiplock.tasks) LIMIT 1").fetchone()[0]
        lo, hi = conn.execute(f"SELECT now() - interval '{DAYS * 2 // 3} days', "
                              f"now() - interval '{DAYS * 2 // 3} days' + interval '1 hour'").fetchone()
    q = urllib.parse.urlencode
    return [
        ("overview", "/ui/"),
        ("tasks", "/ui/tasks"),
        ("tasks queue=emails", "/ui/tasks?" + q({"queue": "emails"})),
        ("tasks queue=emails-rare (1%)", "/ui/tasks?" + q({"queue": "emails-rare"})),
        ("tasks queue= a queue with no tasks", "/ui/tasks?" + q({"queue": "no-such-queue"})),
        ("tasks state=queued", "/ui/tasks?" + q({"state": "queued"})),
        ("tasks state=failed", "/ui/tasks?" + q({"state": "failed"})),
        ("tasks state=running", "/ui/tasks?" + q({"state": "running"})),
        ("tasks kind=kind.3", "/ui/tasks?" + q({"kind": "kind.3"})),
        ("tasks kind=audit.rare (0.1%)", "/ui/tasks?" + q({"kind": "audit.rare"})),
        ("tasks kind= a kind with no tasks", "/ui/tasks?" + q({"kind": "no-such-kind"})),
        ("tasks queue+state=failed", "/ui/tasks?" + q({"queue": "emails", "state": "failed"})),
        ("tasks created 1 h, 20 days ago", "/ui/tasks?" + q({"created_after": lo.isoformat(),
                                                              "created_before": hi.isoformat()})),
        ("tasks created_before 20 days ago", "/ui/tasks?" + q({"created_before": lo.isoformat()})),
        ("tasks id=", "/ui/tasks?" + q({"id": str(one[0])})),
        ("tasks idempotency_key=", "/ui/tasks?" + q({"idempotency_key": one[1]})),
        ("tasks cursor at 90%", "/ui/tasks?" + q({"cursor": str(deep)})),
        ("task (failed, with events)", f"/ui/tasks/{one[0]}"),
        ("audit", "/ui/audit"),
        ("audit action=queue.pause", "/ui/audit?" + q({"action": "queue.pause"})),
        ("schedules", "/ui/schedules"),
        ("webhooks", "/ui/webhooks"),
        ("deliveries", "/ui/deliveries"),
        ("deliveries state=dead", "/ui/deliveries?" + q({"state": "dead"})),
        ("workers", "/ui/workers"),
        ("API GET /v1/queues", "/v1/queues"),
        ("API GET /v1/tasks?queue= a queue with no tasks", "/v1/tasks?" + q({"queue": "no-such-queue"})),
    ]


def sign_in(base: str) -> urllib.request.OpenerDirector:
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
    page = opener.open(base + "/ui/login").read().decode()
    csrf = re.search(r'name="csrf" value="([^"]+)"', page).group(1)
    body = urllib.parse.urlencode({"token": TOKEN, "csrf": csrf}).encode()
    opener.open(base + "/ui/login", data=body).read()
    opener.addheaders.append(("Authorization", f"Bearer {TOKEN}"))  # the API's /v1/ pages
    return opener


def measure(base: str, opener, path: str, runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        with opener.open(base + path) as r:
            r.read()
            if r.status != 200 or "/ui/login" in r.url:
                raise RuntimeError(f"{path}: {r.status} {r.url}")
        times.append((time.perf_counter() - started) * 1000)
    return times


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, round(0.95 * len(ordered)) - 1)]


def explain(url: str, table: list[tuple[str, str]]) -> None:
    """EXPLAIN (ANALYZE, BUFFERS) of the task list statement for each /ui/tasks filter."""
    from skiplock.engine import queries
    statements = queries.load("skiplock")
    statement = statements["task_list"]
    empty = dict.fromkeys(("ids", "queue", "state", "kind", "idempotency_key", "created_after",
                           "created_before", "cursor"))
    with psycopg.connect(url, autocommit=True) as conn:
        for label, path in table:
            if not path.startswith(("/ui/tasks?", "/v1/tasks?")):
                continue
            params = {**empty, "limit": 51}
            for key, value in urllib.parse.parse_qsl(path.split("?", 1)[1]):
                params["ids" if key == "id" else key] = [value] if key == "id" else value
            plan = conn.execute("EXPLAIN (ANALYZE, BUFFERS) " + statement, params).fetchall()
            print(f"\n### {label}\n" + "\n".join(row[0] for row in plan))
        # GET /v1/queues: the counts are its expensive part
        plan = conn.execute("EXPLAIN (ANALYZE, BUFFERS) " + statements["queue_task_counts"]).fetchall()
        print("\n### queue_task_counts (GET /v1/queues, the overview)\n" + "\n".join(row[0] for row in plan))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--existing-server", action="store_true")
    parser.add_argument("--explain", action="store_true")
    args = parser.parse_args()

    cluster = None
    if args.existing_server:
        server = pgcluster.find_server_url()
    else:
        cluster = pgcluster.ThrowawayCluster(settings={"fsync": False})
        cluster.start()
        server = cluster.url
    dbname = f"bench_console_{int(time.time())}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {dbname}")
        version = conn.execute("SHOW server_version").fetchone()[0]
    url = server.rsplit("/", 1)[0] + "/" + dbname
    try:
        migrate.apply(url)
        seed(url, args.tasks)
        table = pages(url)
        if args.explain:
            explain(url, table)
        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
        token = hashlib.sha256(TOKEN.encode()).hexdigest()
        settings = Settings(database_url=url, api_tokens=parse_api_tokens(f"bench:admin:{token}"),
                            console_session_key=secrets.token_urlsafe(32))
        server_ = make_server("127.0.0.1", 0, create_app(settings), threaded=True)
        threading.Thread(target=server_.serve_forever, daemon=True).start()
        base = f"http://127.0.0.1:{server_.server_port}"
        opener = sign_in(base)
        print(f"\nPostgres {version}, {args.tasks} tasks, {args.runs} requests per page "
              f"(after one warm-up), times in ms\n")
        print("| page | p50 | p95 | max |\n|---|---:|---:|---:|")
        for label, path in table:
            measure(base, opener, path, 1)
            times = measure(base, opener, path, args.runs)
            print(f"| {label} | {statistics.median(times):.1f} | {p95(times):.1f} | {max(times):.1f} |", flush=True)
        server_.shutdown()
    finally:
        if cluster is not None:
            cluster.cleanup()
        else:
            with psycopg.connect(server, autocommit=True) as conn:
                conn.execute(f"DROP DATABASE {dbname} WITH (FORCE)")


if __name__ == "__main__":
    main()
