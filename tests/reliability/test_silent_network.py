"""A silent network path: a worker, a scheduler and a dispatcher reach Postgres through a proxy that stops
forwarding without closing (tests/support/silent_proxy.py), like a hung pooler or proxy in between,
which TCP keepalives cannot see. Each notices within NOTICE_BOUND (its /readyz is 503): no answer
comes within a lease, so the connection is given up (store AnsweringConnection). The worker's
claims run out; a healthy worker with a direct path reclaims and completes them. When the path
comes back, the cut-off worker's late outcomes are refused and counted, and it takes new work by
itself, without a restart.

The server is the test's own (ThrowawayCluster); the fault is only the proxy's."""

from __future__ import annotations

import signal
import time

import psycopg
import pytest

import skiplock
from skiplock.engine import migrate
from tests.pgcluster import ThrowawayCluster
from tests.support import harness
from tests.support.harness import http_status, metric, scalar, wait_for
from tests.support.silent_proxy import SilentProxy
from tests.support.sizes import sized

LEASE, HEARTBEAT, POLL = 3, 0.5, 1
ENV = {"SKIPLOCK_LEASE_SECONDS": LEASE, "SKIPLOCK_HEARTBEAT_SECONDS": HEARTBEAT, "SKIPLOCK_REAPER_SECONDS": 0.5,
       "SKIPLOCK_SHUTDOWN_GRACE_SECONDS": 1, "SKIPLOCK_POLL_SECONDS": POLL}
# the bound stated in docs/OPERATIONS.md: the next statement (at most a poll away) waits a lease
# for its answer, plus 2 s for a loaded machine
NOTICE_BOUND = POLL + LEASE + 2
HELD = sized(2, 8)


@pytest.fixture
def cluster():
    with ThrowawayCluster() as pg:
        yield pg


def _ready(proc) -> int:
    try:
        return http_status(proc.metrics_port, "/readyz")
    except OSError:
        return 0


def test_a_worker_cut_off_by_a_silent_path_is_reclaimed_refused_and_resumes(cluster, processes):
    url = cluster.url
    migrate.apply(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(harness.SUPPORT_SCHEMA)
    with SilentProxy(cluster.port) as proxy, psycopg.connect(url, autocommit=True) as db:
        via_proxy = url.replace(f":{cluster.port}/", f":{proxy.port}/")
        cut = processes.spawn(via_proxy, "--concurrency", str(HELD), env=ENV)
        scheduler = processes.spawn(via_proxy, command="scheduler", env=ENV)
        dispatcher = processes.spawn(via_proxy, command="dispatcher", env=ENV)
        for proc in (cut, scheduler, dispatcher):
            processes.wait_ready(proc)
        ids = [skiplock.enqueue(url, "t.whoami", {"sleep": 2 * LEASE}) for _ in range(HELD)]
        wait_for(lambda: scalar(db, "SELECT count(DISTINCT task_id) FROM public.executions WHERE pid = %s",
                                (cut.pid,)) == HELD, 10, interval=0.02, message="the worker to run every task")

        proxy.silence()
        silenced = time.monotonic()
        noticed = {}
        for name, proc in (("worker", cut), ("scheduler", scheduler), ("dispatcher", dispatcher)):
            wait_for(lambda: _ready(proc) == 503, NOTICE_BOUND - (time.monotonic() - silenced), interval=0.05,
                     message=f"the {name} to notice the silence")
            noticed[name] = round(time.monotonic() - silenced, 2)

        healthy = processes.spawn(url, "--concurrency", str(HELD), env=ENV)
        processes.wait_ready(healthy)
        wait_for(lambda: scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE state = 'completed' "
                                    "AND (result->>'pid')::int = %s", (healthy.pid,)) == HELD, 30,
                 message="the healthy worker to reclaim and complete the cut-off worker's tasks")
        assert cut.alive() and scheduler.alive() and dispatcher.alive()

        proxy.heal()
        healed = time.monotonic()
        wait_for(lambda: (metric(cut.metrics_port, "skiplock_stale_writes_rejected_total") or 0) >= HELD, 30,
                 message="the cut-off worker's late outcomes refused and counted")
        for proc in (cut, scheduler, dispatcher):
            wait_for(lambda: _ready(proc) == 200, 30, interval=0.05, message=f"pid {proc.pid} ready again")
        resumed = round(time.monotonic() - healed, 2)

        # the cut-off worker takes new work by itself
        healthy.signal(signal.SIGTERM)
        assert healthy.wait(15) == 0
        after = skiplock.enqueue(url, "t.whoami", {"sleep": 0})
        wait_for(lambda: scalar(db, "SELECT state FROM skiplock.tasks WHERE id = %s", (after,)) == "completed",
                 15, message="the cut-off worker to run a new task")
        assert scalar(db, "SELECT (result->>'pid')::int FROM skiplock.tasks WHERE id = %s", (after,)) == cut.pid

        rows = db.execute("SELECT state, reclaims, (result->>'pid')::int FROM skiplock.tasks WHERE id = ANY(%s)",
                          (ids,)).fetchall()
        assert rows == [("completed", 1, healthy.pid)] * HELD
        refused = metric(cut.metrics_port, "skiplock_stale_writes_rejected_total")
    print(f"noticed after (s): {noticed}; ready again {resumed} s after the path came back; "
          f"late writes refused: {refused:g}")
