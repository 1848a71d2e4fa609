"""Failover: a primary with a synchronous streaming standby; a worker, a scheduler and the API
connect with a multi-host URL and target_session_attrs=read-write. Mid-drain the primary stops
with `-m immediate` and the standby is promoted. Every enqueued task ends completed or failed,
a task runs again only after a reclaim, no lease token repeats across the promotion, every role's
/readyz is 503 while no primary answers, and the roles are back within RECOVERY_BOUND of the
promotion, with no restart by hand.

Why tokens cannot repeat: a lease token is nextval('skiplock.lease_tokens') inside the claim's own
statement. nextval writes its WAL record (covering the next 32 values) before it returns a value,
so that record precedes the claim's commit record in the WAL. With synchronous replication a claim
is acknowledged only once the standby has flushed its commit record, hence also the sequence's
record; the promoted standby's sequence starts past every token a role was ever given. A claim
whose acknowledgement was lost never reached its worker. (With asynchronous replication the
newest acknowledged commits, enqueues included, can be lost, and with them the sequence's
advance: the guarantees here need synchronous_commit with a synchronous standby.)

The clusters are the test's own (ThrowawayCluster): the session's server is never touched."""

from __future__ import annotations

import time

import psycopg
import pytest

import skiplock
from skiplock.engine import migrate
from tests.acceptance.test_api_process import start_api
from tests.pgcluster import ThrowawayCluster
from tests.support import harness
from tests.support.fault_handlers import executions
from tests.support.harness import free_port, http_status, scalar, wait_for
from tests.support.sizes import sized

TASKS = sized(1_500, 20_000)
# the bound stated in docs/OPERATIONS.md: the borrow slice, one connection, the claimer's backoff
RECOVERY_BOUND = 10.0
ENV = {"SKIPLOCK_LEASE_SECONDS": 3, "SKIPLOCK_HEARTBEAT_SECONDS": 1, "SKIPLOCK_REAPER_SECONDS": 1,
       "SKIPLOCK_SHUTDOWN_GRACE_SECONDS": 2, "SKIPLOCK_POLL_SECONDS": 0.5}


@pytest.fixture
def pair():
    primary = ThrowawayCluster(settings={"synchronous_commit": True, "synchronous_standby_names": "*"})
    standby = None
    try:
        primary.start()
        # the standby, once promoted, has no standby of its own to wait for
        standby = primary.standby(settings={"synchronous_standby_names": ""})
        yield primary, standby
    finally:
        if standby is not None:
            standby.cleanup()
        primary.cleanup()


def _url(*clusters: ThrowawayCluster) -> str:
    hosts = ",".join(f"127.0.0.1:{c.port}" for c in clusters)
    return f"postgresql://postgres@{hosts}/postgres?target_session_attrs=read-write"


def _ready(proc) -> int:
    try:
        return http_status(proc.metrics_port, "/readyz")
    except OSError:
        return 0


def test_failover_to_a_promoted_standby_mid_drain(pair, processes, tmp_path):
    primary, standby = pair
    url = _url(primary, standby)
    migrate.apply(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(harness.SUPPORT_SCHEMA)
    # t.noted counts its executions in files: a bookkeeping connection of the handler's own would
    # break in the failover, fail the handler and have it retried, a rerun no reclaim explains
    skiplock.enqueue_many(url, "t.noted", [{"sleep": 0.01}] * TASKS)
    worker_env = {**ENV, "SKIPLOCK_TEST_EXECUTIONS_DIR": tmp_path}
    roles = {name: processes.spawn(url, "--concurrency", "8", env=worker_env, tasks="tests.support.fault_handlers")
             for name in ("worker-1", "worker-2")}
    roles.update({
             "scheduler": processes.spawn(url, command="scheduler", env=ENV)})
    roles["api"] = start_api(processes, url, free_port())
    for proc in roles.values():
        processes.wait_ready(proc, timeout=30)

    def completed(cluster) -> int:
        with psycopg.connect(cluster.url, autocommit=True, connect_timeout=5) as conn:
            return scalar(conn, "SELECT count(*) FROM skiplock.tasks WHERE state = 'completed'")

    wait_for(lambda: completed(primary) >= TASKS // 5, 60, interval=0.02, message="a fifth completed")
    primary.stop("immediate")
    stopped = time.monotonic()

    # no primary answers: every role says so
    for name, proc in roles.items():
        wait_for(lambda: _ready(proc) == 503, 15, interval=0.05, message=f"{name} /readyz 503")
    with psycopg.connect(standby.url, autocommit=True) as conn:
        at_switch = completed(standby)
        # everything any role was given is here (synchronous replication): the highest token of all
        tokens_before = conn.execute("SELECT max(lease_token), count(*) FROM skiplock.task_events "
                                     "WHERE type = 'running'").fetchone()
    assert at_switch < TASKS, "the drain ended before the failover: nothing was tested"

    standby.promote()
    promoted = time.monotonic()
    back = {}
    for name, proc in roles.items():
        wait_for(lambda: _ready(proc) == 200, RECOVERY_BOUND + 5, interval=0.05, message=f"{name} ready again")
        back[name] = round(time.monotonic() - promoted, 2)
    wait_for(lambda: completed(standby) > at_switch, RECOVERY_BOUND, interval=0.05,
             message="completions on the new primary")
    progress = round(time.monotonic() - promoted, 2)
    print(f"outage {promoted - stopped:.2f} s; ready again after promotion (s): {back}; "
          f"first completion after {progress} s; completed at the switch: {at_switch}")
    assert max(back.values()) <= RECOVERY_BOUND, back

    with psycopg.connect(standby.url, autocommit=True) as db:
        wait_for(lambda: scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE state IN ('completed', 'failed')")
                 == TASKS, 120, interval=0.2, message=f"all {TASKS} tasks finished")
        assert scalar(db, "SELECT count(*) FROM skiplock.tasks") == TASKS
        counts = harness.state_counts(db)
        ran = executions(tmp_path)
        rows = [(str(task_id), reclaims, ran.get(str(task_id), 0))
                for task_id, reclaims in db.execute("SELECT id, reclaims FROM skiplock.tasks").fetchall()]
        assert [r for r in rows if r[2] == 0] == [], "tasks that never ran"
        too_many = [r for r in rows if r[2] - 1 > r[1]]
        assert too_many == [], f"{len(too_many)} tasks ran more often than they were reclaimed: {too_many[:5]}"
        # no claim made on the new primary reused a token given out before the switch
        max_before, claims_before = tokens_before
        assert scalar(db, "SELECT count(*) FROM skiplock.task_events WHERE type = 'running' "
                          "AND lease_token <= %s", (max_before,)) == claims_before
        # every outcome stands under the task's last claim: no write of an older lease was taken
        stale = scalar(db, """
            SELECT count(*) FROM skiplock.tasks t
            WHERE t.state = 'completed' AND t.lease_token IS DISTINCT FROM (
                SELECT e.lease_token FROM skiplock.task_events e
                WHERE e.task_id = t.id AND e.type = 'running' ORDER BY e.seq DESC LIMIT 1)""")
        reclaims = scalar(db, "SELECT sum(reclaims) FROM skiplock.tasks")
    print(f"states {counts}, reclaims {reclaims}")
    assert stale == 0
    assert all(proc.alive() for proc in roles.values()), {n: p.log()[-2000:] for n, p in roles.items()
                                                          if not p.alive()}
