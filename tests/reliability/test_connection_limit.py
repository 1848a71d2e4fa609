"""Connection limits: a server with max_connections = 40 and 4 workers at concurrency 20 whose
handlers each hold a ctx.transaction(). Each worker may hold concurrency + 7 connections (a pool
of concurrency + 4, claims, outcomes, LISTEN): 108 wanted, 37 to be had. The workers start while
every slot is taken: they wait with one log line naming the cause instead of exiting, and start
once slots free up. Then nothing is lost, no handler waits forever for a connection (the drain
ends), and the pool metrics show the waits. A worker that finds no slot free keeps waiting, and
claims nothing until one frees: it starts when a started worker stops, as on a scale-in.
A worker that can get no connection at all still stops within seconds of SIGTERM.

The server is the test's own (ThrowawayCluster); the workers connect as an ordinary role, so the
superuser's reserved slots stay free for the test's own checks."""

from __future__ import annotations

import signal
import time

import psycopg
import pytest

import skiplock
from skiplock.engine import migrate
from skiplock.engine.migrate import slots_exhausted
from tests.pgcluster import ThrowawayCluster
from tests.support import harness
from tests.support.harness import metric, scalar, wait_for
from tests.support.sizes import sized

TASKS = sized(2_000, 20_000)
WORKERS, CONCURRENCY = 4, 20
ENV = {"SKIPLOCK_CONCURRENCY": CONCURRENCY, "SKIPLOCK_LEASE_SECONDS": 30}


@pytest.fixture
def cluster():
    with ThrowawayCluster(settings={"max_connections": 40}) as pg:
        yield pg


def app_url(cluster: ThrowawayCluster) -> str:
    """The URL of an ordinary role that owns the database, migrated."""
    with psycopg.connect(cluster.url, autocommit=True) as conn:
        conn.execute("CREATE ROLE app LOGIN")
        conn.execute("ALTER DATABASE postgres OWNER TO app")
        conn.execute("ALTER SCHEMA public OWNER TO app")
    url = cluster.url.replace("postgres@", "app@", 1)
    migrate.apply(url)
    return url


def test_workers_share_a_full_connection_limit_and_lose_nothing(cluster, processes):
    url = app_url(cluster)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(harness.SUPPORT_SCHEMA)
    skiplock.enqueue_many(url, "t.ledger", [{"sleep": 0.01}] * TASKS)

    # take every slot an ordinary role may have
    hog = []
    with pytest.raises(psycopg.OperationalError) as refused:
        while len(hog) < 100:
            hog.append(psycopg.connect(url, autocommit=True))
    # whatever words this Postgres refuses with, skiplock reads them as a full server
    assert slots_exhausted(refused.value), refused.value
    workers = [processes.spawn(url, env=ENV, tasks="tests.support.fault_handlers")
               for _ in range(WORKERS)]
    for proc in workers:
        wait_for(lambda: not proc.alive() or "no free connection slot" in proc.log(), 30,
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


def test_a_worker_that_can_get_no_connection_stops_at_once(cluster, processes):
    """SIGTERM while none of the worker's connections can be had: it holds no task, so it exits
    within seconds, not after the claim's wait for its connection and the registry delete's (15 s
    each: a pod past its termination grace, killed). The role's connection limit makes every
    new connection fail, as a full max_connections does."""
    url = app_url(cluster)
    proc = processes.spawn(url, env=ENV, tasks="tests.support.fault_handlers")
    processes.wait_ready(proc)
    with psycopg.connect(cluster.url, autocommit=True) as db:
        db.execute("ALTER ROLE app CONNECTION LIMIT 0")
        db.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'app'")
        wait_for(lambda: scalar(db, "SELECT count(*) FROM pg_stat_activity WHERE usename = 'app'") == 0, 10,
                 message="the worker's backends to end")
    # the claimer's next claim (every poll interval, 1 s) waits for a connection that cannot be had
    # (the worker says so once for all its paths: engine/outage.py)
    wait_for(lambda: "too many connections for role" in proc.log() or "database unreachable" in proc.log(), 10,
             message="a refused reconnection")
    time.sleep(1.5)
    proc.signal(signal.SIGTERM)
    sent = time.monotonic()
    assert proc.wait(20) == 0, proc.log()[-3000:]
    took = time.monotonic() - sent
    log = proc.log()
    print(f"stopped {took:.1f} s after SIGTERM with no connection to be had")
    assert took < 12, log[-3000:]
    assert "could not remove this worker from the registry" in log  # it gave up on the delete
    assert "claim failed; retrying" not in log[log.index("SIGTERM received"):]
