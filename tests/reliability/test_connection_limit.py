"""Connection limits: a server with max_connections = 40 and 4 workers at concurrency 20 whose
handlers each hold a ctx.transaction(). Each worker may hold concurrency + 7 connections (a pool
of concurrency + 4, claims, outcomes, LISTEN): 108 wanted, 37 to be had. The workers start while
every slot is taken: they wait with one log line naming the cause instead of exiting, and start
once slots free up. Then nothing is lost, no handler waits forever for a connection (the drain
ends), and the pool metrics show the waits. A worker that finds no slot free keeps waiting, and
claims nothing until one frees: it starts when a started worker stops, as on a scale-in.

The server is the test's own (ThrowawayCluster); the workers connect as an ordinary role, so the
superuser's reserved slots stay free for the test's own checks."""

from __future__ import annotations

import signal

import psycopg
import pytest

import skiplock
from skiplock.engine import migrate
from tests.pgcluster import ThrowawayCluster
from tests.support import harness
from tests.support.harness import metric, scalar, wait_for
from tests.support.sizes import sized

TASKS = sized(2_000, 20_000)
WORKERS, CONCURRENCY = 4, 20
ENV = {"SKIPLOCK_CONCURRENCY": CONCURRENCY, "SKIPLOCK_LEASE_SECONDS": 30}
SLOTS_GONE = "remaining connection slots are reserved"


@pytest.fixture
def cluster():
    with ThrowawayCluster(settings={"max_connections": 40}) as pg:
        yield pg


def test_workers_share_a_full_connection_limit_and_lose_nothing(cluster, processes):
    with psycopg.connect(cluster.url, autocommit=True) as conn:
        conn.execute("CREATE ROLE app LOGIN")
        conn.execute("ALTER DATABASE postgres OWNER TO app")
        conn.execute("ALTER SCHEMA public OWNER TO app")
    url = cluster.url.replace("postgres@", "app@", 1)
    migrate.apply(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(harness.SUPPORT_SCHEMA)
    skiplock.enqueue_many(url, "t.ledger", [{"sleep": 0.01}] * TASKS)

    # take every slot an ordinary role may have
    hog = []
    with pytest.raises(psycopg.OperationalError, match=SLOTS_GONE):
        while len(hog) < 100:
            hog.append(psycopg.connect(url, autocommit=True))
    workers = [processes.spawn(url, env=ENV, tasks="tests.support.fault_handlers")
               for _ in range(WORKERS)]
    for proc in workers:
        wait_for(lambda: not proc.alive() or SLOTS_GONE in proc.log(), 30,
                 message=f"worker {proc.pid} to say why it waits")
        assert proc.alive(), proc.log()[-3000:]
    for conn in hog:
        conn.close()

    # not every worker gets a slot: one that finds none stays unready and claims nothing, but runs
    with psycopg.connect(cluster.url, autocommit=True) as db:  # a superuser's reserved slot
        wait_for(lambda: scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE state IN ('completed', 'failed')")
                 == TASKS, 120, interval=0.2, message=f"all {TASKS} tasks finished")
        assert harness.state_counts(db) == {"completed": TASKS}
        # each completion committed its handler's transaction once
        assert scalar(db, "SELECT count(*) FROM public.ledger") == TASKS
        assert scalar(db, "SELECT count(DISTINCT task_id) FROM public.ledger") == TASKS
        peak = scalar(db, "SELECT count(*) FROM pg_stat_activity WHERE usename = 'app'")

    # A worker still waiting for a slot at startup serves no metrics yet, and the started ones keep
    # their connections after the drain. As when an autoscaler removes a pod, one started worker
    # stops: the slots it frees let every waiting worker start at its next try.
    started = [proc for proc in workers if "worker started" in proc.log()]
    assert started, "no worker started"
    samples = {proc.pid: harness.scrape(proc.metrics_port) for proc in started}
    leaving = started[0]
    leaving.signal(signal.SIGTERM)
    assert leaving.wait(30) == 0, leaving.log()[-3000:]
    staying = [proc for proc in workers if proc is not leaving]
    for proc in staying:
        wait_for(lambda: "worker started" in proc.log(), 30, message=f"worker {proc.pid} to start")
    ready = sum(harness.http_status(proc.metrics_port, "/readyz") == 200 for proc in staying)
    samples.update({proc.pid: harness.scrape(proc.metrics_port) for proc in staying})
    samples = list(samples.values())
    waited = sum(metric(s, "skiplock_db_pool_wait_seconds_total") or 0 for s in samples)
    refused = sum(metric(s, "skiplock_db_pool_connect_errors_total") or 0 for s in samples)
    exhausted = sum(metric(s, "skiplock_db_pool_exhausted_total") or 0 for s in samples)
    print(f"pool waits {waited:.1f} s in all, connection attempts refused {refused:g}, borrowers that "
          f"gave up {exhausted:g}, connections at the end {peak}, {len(started)} of {WORKERS} workers started during the drain, {ready} of {WORKERS - 1} ready after one stopped")
    for s in samples:
        # the arithmetic of docs/OPERATIONS.md: a pool of concurrency + 4, one for claims, one for outcomes
        assert metric(s, "skiplock_db_pool_connections_max", pool="worker") == CONCURRENCY + 4
        assert metric(s, "skiplock_db_pool_connections_max") == CONCURRENCY + 6
    assert waited > 0, "no borrower waited: the limit was not reached"
    for proc in workers:
        assert proc is leaving or proc.alive(), proc.log()[-3000:]
        assert proc.log().count("no free connection slot") == 1
