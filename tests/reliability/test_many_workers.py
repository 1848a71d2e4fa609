"""Many workers (issue 19): 8 worker processes drain one queue together on this machine, and no
worker waits for a lock another holds: every claim skips rows that others hold (FOR UPDATE SKIP
LOCKED), and every outcome and heartbeat skips a row another transaction holds and writes it again
(a claim statement of another worker can hold one for a moment). Each task is claimed once.

Two watches, on a Postgres of the test's own: the server logs every lock wait longer than 1 ms
(log_lock_waits, deadlock_timeout = 1ms, the application name in each line: what the backend did,
and its statement), and a sampler reads pg_stat_activity every few milliseconds for a skiplock
backend waiting on a lock (wait_event_type = 'Lock'), and for whom. A control first makes one
skiplock-named backend wait on a row lock, to show that both watches see one. 10,000 tasks in
`make test`, 100,000 under `make reliability`."""

from __future__ import annotations

import time

import psycopg
import pytest

import skiplock
from skiplock.engine import migrate
from tests.pgcluster import ThrowawayCluster
from tests.support import harness
from tests.support.harness import scalar, wait_for
from tests.support.lock_watch import LOG_LINE_PREFIX, LockSampler, is_extension, logged_waits
from tests.support.sizes import sized

WORKERS = 8
TASKS = sized(10_000, 100_000)
ENV = {"SKIPLOCK_CONCURRENCY": 16}
CONTROL = "skiplock-control"  # the control's backends: named like skiplock's, so both watches apply


@pytest.fixture
def cluster():
    settings = {"log_lock_waits": True, "deadlock_timeout": "1ms", "log_line_prefix": LOG_LINE_PREFIX,
                "max_connections": 200}
    with ThrowawayCluster(settings=settings) as pg:
        yield pg


# How a lock wait of a skiplock backend is counted. Only a conflict fails the test.
# - extension: a relation's extension lock, held while one backend adds a page at the end of a
#   table or index that many insert into (task_events, the tasks' new row versions): no lock of
#   another worker's claim.
# - update chain: a claim that found a row being claimed by another worker, saw that claim commit
#   the moment it checked, and then follows the row's newer versions to lock them; Postgres
#   (heap_lock_updated_tuple) waits there for a transaction holding the newest one (another
#   worker's outcome, heartbeat or claim), whatever SKIP LOCKED says. The log names it ("while
#   locking updated version"); a sample cannot tell it from a claim waiting for a claim, so a
#   sampled claim's wait on a transaction counts here, and any such wait over 1 ms is in the log,
#   where it is told apart.
# - conflict: any other: a claim waiting for a row another claim holds (log: "while locking
#   tuple"), an outcome or a heartbeat waiting at all (they skip a row another transaction holds
#   and write it again: model.BUSY).
KINDS = ("conflict", "extension", "update chain")


def sampled_kind(app: str, event: str, statement: str, blockers: tuple[str, ...]) -> str:
    if is_extension(event):
        return "extension"
    if app.endswith("-claims") and event == "transactionid":
        return "update chain"
    return "conflict"


def logged_kind(wait: dict[str, str]) -> str:
    if is_extension(wait["what"]):
        return "extension"
    if wait["app"].endswith("-claims") and wait["context"].startswith("while locking updated version"):
        return "update chain"
    return "conflict"


def control_wait(url: str) -> None:
    """One skiplock-named backend waits 300 ms for a row lock another holds (a task due in an
    hour, which no worker claims)."""
    task = skiplock.enqueue(url, "t.noop", {"control": True}, delay=3600)
    with psycopg.connect(url, autocommit=True, application_name=CONTROL) as holder, \
            psycopg.connect(url, autocommit=True, application_name=CONTROL) as waiter:
        with holder.transaction():
            holder.execute("SELECT 1 FROM skiplock.tasks WHERE id = %s FOR UPDATE", (task,))
            waiter.execute("SET statement_timeout = 300")
            with pytest.raises(psycopg.errors.QueryCanceled):
                waiter.execute("UPDATE skiplock.tasks SET priority = 0 WHERE id = %s", (task,))
        holder.execute("DELETE FROM skiplock.tasks WHERE id = %s", (task,))


@pytest.mark.parametrize("lanes", [0, 2])
def test_eight_workers_drain_one_queue_and_no_claim_waits_for_another(cluster, processes, lanes):
    """lanes: SKIPLOCK_CLAIM_LANES (0: claims of the queue overlap freely; 2: at most two at once,
    the others turned away without waiting)."""
    url = cluster.url
    migrate.apply(url)
    workers = [processes.spawn(url, env={**ENV, "SKIPLOCK_CLAIM_LANES": lanes}) for _ in range(WORKERS)]
    for proc in workers:
        processes.wait_ready(proc, timeout=60)

    with LockSampler(url) as sampler:
        control_wait(url)
        wait_for(lambda: sampler.waits, 5, message="the sampler to see the control's wait")
        started = time.monotonic()
        skiplock.enqueue_many(url, "t.noop", [{}] * TASKS)
        with psycopg.connect(url, autocommit=True) as db:
            wait_for(lambda: scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE state = 'completed'") == TASKS,
                     sized(90, 600), interval=0.1, message=f"{TASKS} tasks completed")
            seconds = time.monotonic() - started
            time.sleep(0.2)  # outcomes written: the last samples see the workers idle again

    with psycopg.connect(url, autocommit=True) as db:
        assert harness.state_counts(db) == {"completed": TASKS}
        claims, claimed_tasks, owners = db.execute(
            "SELECT count(*), count(DISTINCT task_id), count(DISTINCT data->>'owner') "
            "FROM skiplock.task_events WHERE type = 'running'").fetchone()
        assert (claims, claimed_tasks) == (TASKS, TASKS)  # each task claimed once
        assert scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE attempts <> 1 OR reclaims <> 0") == 0
        assert owners == WORKERS  # all of them took part
    metrics = [harness.scrape(proc.metrics_port) for proc in workers]
    crowded = sum(m.get("skiplock_claims_crowded_total", 0) for m in metrics)
    written_again = sum(m.get('skiplock_outcome_writes_busy_total{queue="default"}', 0) for m in metrics)
    assert (crowded > 0) == (lanes > 0), crowded  # with lanes, some claims were turned away

    logged = logged_waits(cluster.log_path)
    control_logged = [w for w in logged if w["app"] == CONTROL]
    control_sampled = [w for w in sampler.waits if w[0] == CONTROL]
    ours_logged = [w for w in logged if w["app"] != CONTROL and w["app"].startswith("skiplock-")]
    ours_sampled = [w for w in sampler.waits if w[0] != CONTROL]
    sampled = {kind: [w for w in ours_sampled if sampled_kind(*w) == kind] for kind in KINDS}
    logged_by = {kind: [w for w in ours_logged if logged_kind(w) == kind] for kind in KINDS}
    print(f"{TASKS} tasks by {WORKERS} workers (claim lanes {lanes}, claims turned away {crowded:.0f}, "
          f"outcomes written again for a row held {written_again:.0f}) in "
          f"{seconds:.1f} s; {sampler.samples} samples of "
          f"pg_stat_activity, {sampler.busy} with a skiplock statement running (up to {sampler.most_active} at "
          f"once); lock waits of skiplock's backends, sampled / logged over 1 ms: "
          + "; ".join(f"{kind} {len(sampled[kind])} / {len(logged_by[kind])}" for kind in KINDS)
          + f"; the control's wait: {len(control_sampled)} samples, {len(control_logged)} logged")
    # the watches work: they saw the control wait, and they watched the drain while it ran
    assert control_logged and control_sampled, (logged, sampler.waits)
    assert sampler.busy >= 20, (sampler.samples, sampler.busy)
    assert sampled["conflict"] == [] and logged_by["conflict"] == [], (sampled["conflict"], logged_by["conflict"])
    assert "deadlock detected" not in cluster.log_path.read_text(errors="replace")
    assert all(proc.alive() for proc in workers)
