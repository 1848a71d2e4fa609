"""Durable execution under faults, with real worker processes (issue 33): step_transactions whose
rows commit exactly once while workers are SIGKILLed; a zombie (SIGSTOP past its lease) whose step
record and writes are refused; step functions replayed at most once per reclaim; 1,000 durable
sleeps that hold no slot, a restart while they sleep, an hour's sleep that holds nothing; signals
(before, after, rolled back, twice, timed out, one send for 100 waiters, and the latency from a
send's commit to the handler's return, reported); a parent awaiting 50 children through a kill
storm; a handler changed between runs; and random handlers under random kills (Hypothesis).

The handlers are tests/support/durable_handlers.py's d.* kinds; the storm is
tests/support/kill_storm.py, at the pace and lease settings of tests/reliability/test_kill9.py.
"""

from __future__ import annotations

import random
import signal
import time
import uuid

import psycopg
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import skiplock
from tests.benchmarks import signal_latency
from tests.support import harness
from tests.support.harness import metric, scalar, wait_exit, wait_for
from tests.support.kill_storm import Workers
from tests.support.sizes import sized

HANDLERS = "tests.support.durable_handlers"
LEASE, HEARTBEAT, REAPER = 3, 1, 1
ENV = {"SKIPLOCK_LEASE_SECONDS": LEASE, "SKIPLOCK_HEARTBEAT_SECONDS": HEARTBEAT,
       "SKIPLOCK_REAPER_SECONDS": REAPER, "SKIPLOCK_SHUTDOWN_GRACE_SECONDS": 2}
FINAL = ("completed", "failed", "cancelled")


def states(db, ids) -> dict[str, int]:
    return dict(db.execute("SELECT state, count(*) FROM skiplock.tasks WHERE id = ANY(%s) GROUP BY state",
                           (list(ids),)).fetchall())


def all_final(db, ids) -> bool:
    return sum(n for state, n in states(db, ids).items() if state in FINAL) == len(ids)


def step_calls(db, kind: str) -> list[tuple]:
    """(id, reclaims, calls of its step functions, steps recorded) of every task of `kind`: a
    step's function runs again only when its run was lost before the record committed, so
    calls - steps <= reclaims."""
    return db.execute("""
        SELECT t.id, t.reclaims, (SELECT count(*) FROM public.executions e WHERE e.task_id = t.id) AS calls,
               (SELECT count(*) FROM skiplock.task_steps s WHERE s.task_id = t.id AND s.type = 'step') AS steps
        FROM skiplock.tasks t WHERE t.kind = %s""", (kind,)).fetchall()


# ---- exactly-once effects and replay under SIGKILL -----------------------------------------------

ROW_TASKS, ROW_STEPS = sized(200, 1_000), 5


def test_step_transaction_rows_commit_exactly_once_while_workers_are_killed(db_url, db, processes):
    rng = random.Random(33)
    workers = Workers(processes, db_url, db, 3, ENV, HANDLERS)
    # 5 steps of ~80 ms each, 12 slots: the drain lasts well past the storm; a kill lands inside a
    # step's transaction most of the time (its row written, its record not committed)
    ids = skiplock.enqueue_many(db_url, "d.rows", [{"steps": ROW_STEPS, "sleep_in_step": 0.08}] * ROW_TASKS)
    kills = workers.storm(sized(5, 10), lambda: all_final(db, ids), rng)
    left_at_last_kill = ROW_TASKS - states(db, ids).get("completed", 0)
    wait_for(lambda: all_final(db, ids), 90, interval=0.2, message=f"all {ROW_TASKS} tasks final")
    workers.ready()

    assert kills >= 3 and left_at_last_kill > 0, "the drain ended before the storm: nothing was tested"
    assert states(db, ids) == {"completed": ROW_TASKS}
    assert scalar(db, "SELECT count(*) FROM public.step_rows") == ROW_TASKS * ROW_STEPS
    assert db.execute("SELECT task_id, step, count(*) FROM public.step_rows GROUP BY 1, 2 HAVING count(*) <> 1"
                      ).fetchall() == []
    assert scalar(db, "SELECT count(DISTINCT (task_id, step)) FROM public.step_rows WHERE step < %s",
                  (ROW_STEPS,)) == ROW_TASKS * ROW_STEPS
    assert scalar(db, "SELECT count(*) FROM skiplock.task_steps") == ROW_TASKS * ROW_STEPS
    # a killed worker's step ran again after the reclaim, and only then
    rows = step_calls(db, "d.rows")
    assert [r for r in rows if r[2] - r[3] > r[1]] == []
    reclaims = sum(r[1] for r in rows)
    repeated = sum(r[2] - r[3] for r in rows)
    assert reclaims >= kills and repeated >= 1
    print(f"\nexactly once: {ROW_TASKS} tasks x {ROW_STEPS} rows, {kills} kills, {reclaims} reclaims, "
          f"{repeated} step calls repeated (their first rows rolled back), left at the last kill {left_at_last_kill}")


def test_a_step_function_runs_at_most_once_per_reclaim_while_workers_are_killed(db_url, db, processes):
    rng = random.Random(34)
    workers = Workers(processes, db_url, db, 3, ENV, HANDLERS)
    ids = skiplock.enqueue_many(db_url, "d.steps", [{"steps": 4, "step_sleep": 0.1}] * sized(100, 500))
    kills = workers.storm(sized(3, 8), lambda: all_final(db, ids), rng)
    wait_for(lambda: all_final(db, ids), 60, interval=0.2, message="every task final")
    assert kills >= 2
    assert states(db, ids) == {"completed": len(ids)}
    rows = step_calls(db, "d.steps")
    assert all(r[3] == 4 for r in rows)
    assert [r for r in rows if r[2] - r[3] > r[1]] == [], "a step ran again without a reclaim"
    # each step's function ran at least once, and its recorded result is what the handler returned
    for (result,) in db.execute("SELECT result FROM skiplock.tasks WHERE id = ANY(%s)", (ids,)):
        assert [r["step"] for r in result["results"]] == ["s0", "s1", "s2", "s3"]
    print(f"\nreplay: {len(ids)} tasks, {kills} kills, {sum(r[1] for r in rows)} reclaims, "
          f"{sum(r[2] - r[3] for r in rows)} step calls repeated")


def test_without_a_fault_a_step_runs_once_across_a_retry_of_a_later_step(db_url, db, processes):
    worker = processes.spawn(db_url, "--concurrency", "2", tasks=HANDLERS, env=ENV)
    processes.wait_ready(worker)
    task_id = skiplock.enqueue(db_url, "d.steps", {"steps": 3, "raise_in": 2})
    done = skiplock.wait(db_url, task_id, 30)
    assert (done.state, done.attempts) == ("completed", 2)
    calls = db.execute("SELECT note, attempt FROM public.executions WHERE task_id = %s ORDER BY at",
                       (task_id,)).fetchall()
    assert calls == [("s0", 1), ("s1", 1), ("s2", 1), ("s2", 2)]  # s2 raised on attempt 1
    assert [r["attempt"] for r in done.result["results"]] == [1, 1, 2]


# ---- a zombie inside a step ----------------------------------------------------------------------

def test_a_zombie_s_step_record_and_its_writes_are_refused_and_the_live_run_s_stand(db_url, db, processes):
    a = processes.spawn(db_url, "--concurrency", "2", tasks=HANDLERS, env=ENV)
    processes.wait_ready(a)
    task_id = skiplock.enqueue(db_url, "d.zombie", {"hold": 60})
    wait_for(lambda: scalar(db, "SELECT count(*) FROM public.executions WHERE task_id = %s AND pid = %s "
                                "AND note = 'charge'", (task_id, a.pid)), 10, interval=0.01,
             message="worker A inside the charge step")
    a.signal(signal.SIGSTOP)
    first_token = scalar(db, "SELECT lease_token FROM skiplock.tasks WHERE id = %s", (task_id,))
    wait_for(lambda: scalar(db, "SELECT lease_until < clock_timestamp() FROM skiplock.tasks WHERE id = %s",
                            (task_id,)), 10, message="A's lease to expire")
    b = processes.spawn(db_url, "--concurrency", "2", tasks=HANDLERS, env=ENV)
    processes.wait_ready(b)
    wait_for(lambda: scalar(db, "SELECT state FROM skiplock.tasks WHERE id = %s", (task_id,)) == "completed",
             20, message="worker B to reclaim and complete the task")

    a.signal(signal.SIGCONT)
    # A's step function sees the task final and returns: its record meets the fence
    wait_for(lambda: (metric(a.metrics_port, "skiplock_stale_writes_rejected_total", operation="step_record")
                      or 0) >= 1, 15, message="A's step record to be refused")
    samples = harness.scrape(a.metrics_port)
    assert not metric(samples, "skiplock_tasks_finished_total", outcome="completed")
    state, result, token = db.execute("SELECT state, result, lease_token FROM skiplock.tasks WHERE id = %s",
                                      (task_id,)).fetchone()
    assert state == "completed" and token > first_token
    assert result["charge"]["pid"] == result["ship"]["pid"] == result["pid"] == b.pid
    records = db.execute("SELECT name, lease_token, result FROM skiplock.task_steps WHERE task_id = %s "
                         "ORDER BY position", (task_id,)).fetchall()
    assert [(name, lease) for name, lease, _ in records] == [("charge", token), ("ship", token), ("notify", token)]
    assert records[0][2] == {"pid": b.pid}
    # the zombie's insert of the charge's row rolled back with its refused record: each row once
    assert db.execute("SELECT step, count(*) FROM public.step_rows WHERE task_id = %s GROUP BY step ORDER BY step",
                      (task_id,)).fetchall() == [(0, 1), (1, 1)]
    calls = db.execute("SELECT note, pid FROM public.executions WHERE task_id = %s ORDER BY at", (task_id,)).fetchall()
    assert calls == [("charge", a.pid), ("charge", b.pid), ("notify", b.pid)]
    assert scalar(db, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                      "AND state LIKE 'idle in transaction%%'") == 0
    assert a.alive() and b.alive()


# ---- durable sleeps ------------------------------------------------------------------------------

SLEEPERS = sized(1_000, 5_000)


def test_a_thousand_sleeps_hold_no_slot_and_wake_on_time(db_url, db, processes):
    concurrency = 10
    worker = processes.spawn(db_url, "--concurrency", str(concurrency), tasks=HANDLERS, env=ENV)
    processes.wait_ready(worker)
    ids = skiplock.enqueue_many(db_url, "d.sleep", [{"seconds": 2}] * SLEEPERS)
    peak_sleeping, peak_held = 0, 0
    deadline = time.monotonic() + 60
    while not all_final(db, ids):
        assert time.monotonic() < deadline, f"not all done: {states(db, ids)}"
        sleeping, leased = db.execute("SELECT count(*), count(lease_owner) + count(lease_until) FROM skiplock.tasks "
                                      "WHERE state = 'waiting'").fetchone()
        held = metric(worker.metrics_port, "skiplock_worker_inflight")
        assert leased == 0, "a sleeping task holds a lease"
        assert held <= 2 * concurrency  # its slots and the outcomes it has yet to write, never the sleepers
        peak_sleeping, peak_held = max(peak_sleeping, sleeping), max(peak_held, held)
        time.sleep(0.1)

    assert states(db, ids) == {"completed": SLEEPERS}
    assert peak_sleeping > 10 * concurrency, "the sleeps never overlapped: nothing was tested"
    # each slept its time on the database's clock, and was done a few seconds after it at most
    early, median, latest, woken = db.execute("""
        WITH slept AS (
            SELECT extract(epoch FROM t.finished_at - (s.result->>'until')::timestamptz) AS done_after,
                   extract(epoch FROM w.at - (s.result->>'until')::timestamptz) AS woken_after
            FROM skiplock.tasks t
            JOIN skiplock.task_steps s ON s.task_id = t.id AND s.type = 'sleep'
            JOIN skiplock.task_events w ON w.task_id = t.id AND w.type = 'queued'
                                       AND w.data->>'reason' = 'sleep ended'
            WHERE t.id = ANY(%s))
        SELECT min(done_after), percentile_cont(0.5) WITHIN GROUP (ORDER BY done_after), max(done_after),
               max(woken_after)
        FROM slept""", (ids,)).fetchone()
    # none ran on before its time, and each was queued again on time (the waker's half second,
    # with room for a loaded machine); when it then completed depends on how fast the worker works
    # off the runs queued before it (1.8 s at most on a quiet machine, 11 s in a full suite on 2
    # cores), so that is printed, not asserted
    assert early >= 0 and woken < 5, (early, woken, latest)
    # a sleeper run more than once says why: its events (a retry's error, a reclaim) and the worker's log
    again = [r[0] for r in db.execute("SELECT id FROM skiplock.tasks WHERE id = ANY(%s) AND attempts <> 1",
                                      (ids,)).fetchall()]
    assert again == [], (again, db.execute(
        "SELECT task_id, seq, type, attempt, data FROM skiplock.task_events WHERE task_id = ANY(%s) "
        "ORDER BY task_id, seq", (again[:3],)).fetchall(), worker.log()[-3000:])
    calls = db.execute("SELECT note, count(*) FROM public.executions GROUP BY note ORDER BY note").fetchall()
    assert calls == [("after", SLEEPERS), ("before", SLEEPERS)]
    print(f"\nsleeps: {SLEEPERS} on concurrency {concurrency}, at most {peak_sleeping} asleep at once while the "
          f"worker held at most {peak_held:g}; woken at most {woken:.2f} s late, done {median:.2f} s (median) / "
          f"{latest:.2f} s (max) after their time")


def test_a_worker_restarted_while_its_tasks_sleep_changes_nothing(db_url, db, processes):
    first = processes.spawn(db_url, "--concurrency", "10", tasks=HANDLERS, env=ENV)
    processes.wait_ready(first)
    # long enough that the last of the 200 falls asleep before the first wakes on a loaded machine
    # (5 s was not: its first sleepers woke, and the first worker ran their rest)
    ids = skiplock.enqueue_many(db_url, "d.sleep", [{"seconds": 12}] * 200)
    wait_for(lambda: states(db, ids) == {"waiting": 200}, 12, message="200 tasks asleep")
    first.signal(signal.SIGTERM)
    code, _ = wait_exit(first, 10)
    assert code == 0
    second = processes.spawn(db_url, "--concurrency", "10", tasks=HANDLERS, env=ENV)
    processes.wait_ready(second)
    wait_for(lambda: all_final(db, ids), 45, message="every task final")
    assert states(db, ids) == {"completed": 200}
    assert db.execute("SELECT note, pid = %s, count(*) FROM public.executions GROUP BY 1, 2 ORDER BY 1",
                      (second.pid,)).fetchall() == [("after", True, 200), ("before", False, 200)]
    assert scalar(db, "SELECT count(*) FROM skiplock.task_steps") == 3 * 200
    assert scalar(db, "SELECT sum(reclaims) + sum(attempts) FROM skiplock.tasks") == 200  # one attempt each


def test_a_task_sleeping_an_hour_holds_no_lease_lock_or_connection(db_url, db, processes):
    worker = processes.spawn(db_url, "--concurrency", "4", tasks=HANDLERS, env=ENV)
    processes.wait_ready(worker)
    task_id = skiplock.enqueue(db_url, "d.sleep", {"seconds": 3600})
    wait_for(lambda: scalar(db, "SELECT state FROM skiplock.tasks WHERE id = %s", (task_id,)) == "waiting", 10,
             message="the task asleep")
    state, suspended, owner, until, wake_in = db.execute(
        "SELECT state, suspended, lease_owner, lease_until, extract(epoch FROM wake_at - now()) "
        "FROM skiplock.tasks WHERE id = %s", (task_id,)).fetchone()
    assert (state, suspended, owner, until) == ("waiting", "sleep", None, None)
    assert 3500 < wake_in <= 3600
    wait_for(lambda: metric(worker.metrics_port, "skiplock_worker_inflight") == 0, 5, message="in_flight 0")
    # over a few heartbeats: no transaction of the worker stays open, no advisory lock held, and the
    # row can be locked at once (nobody holds it, not even FOR SHARE). A claim or heartbeat
    # transaction is seen idle between its statements for a moment; one held for the sleep is
    # older than a second.
    for _ in range(6):
        assert scalar(db, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                          "AND pid <> pg_backend_pid() AND state LIKE 'idle in transaction%%' "
                          "AND xact_start < clock_timestamp() - interval '1 second'") == 0
        assert scalar(db, "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database "
                          "WHERE d.datname = current_database() AND l.locktype = 'advisory'") == 0
        with db.transaction():
            assert scalar(db, "SELECT id FROM skiplock.tasks WHERE id = %s FOR UPDATE NOWAIT", (task_id,)) == task_id
        assert metric(worker.metrics_port, "skiplock_worker_inflight") == 0
        time.sleep(HEARTBEAT / 2)
    assert scalar(db, "SELECT state FROM skiplock.tasks WHERE id = %s", (task_id,)) == "waiting"


# ---- signals -------------------------------------------------------------------------------------

def _waiting_for(db, task_id, name) -> bool:
    return db.execute("SELECT state, awaited_signal FROM skiplock.tasks WHERE id = %s",
                      (task_id,)).fetchone() == ("waiting", name)


def _result(db, task_id):
    return db.execute("SELECT state, result FROM skiplock.tasks WHERE id = %s", (task_id,)).fetchone()


def test_signals_before_after_rolled_back_twice_and_timed_out(db_url, db, processes):
    worker = processes.spawn(db_url, "--concurrency", "10", tasks=HANDLERS, env=ENV)
    processes.wait_ready(worker)
    # sent before the wait: found by it
    assert skiplock.send_signal(db_url, "early", {"n": "early"}) == (True, 0)
    before = skiplock.enqueue(db_url, "d.signal", {"name": "early"})
    assert skiplock.wait(db_url, before, 10).result == {"got": {"n": "early"}}

    after, rolled, twice, barrier = (skiplock.enqueue(db_url, "d.signal", {"name": name})
                                     for name in ("after", "rolled", "twice", "barrier"))
    timed_out = skiplock.enqueue(db_url, "d.signal", {"name": "never", "timeout": 1})
    for task_id, name in ((after, "after"), (rolled, "rolled"), (twice, "twice"), (barrier, "barrier")):
        wait_for(lambda: _waiting_for(db, task_id, name), 10, message=f"a task waiting for {name!r}")
    # sent after the wait: wakes it
    assert skiplock.send_signal(db_url, "after", {"n": "after"}) == (True, 1)
    # sent in a transaction that rolls back: no signal, no wake-up. The barrier's send, committed
    # after it, is seen by the worker only after anything the rolled-back send could have woken
    with psycopg.connect(db_url) as conn:
        assert skiplock.send_signal(conn, "rolled", {"n": "rolled back"}) == (True, 1)
        conn.rollback()
    assert skiplock.send_signal(db_url, "barrier", None) == (True, 1)
    # twice: the first wins
    assert skiplock.send_signal(db_url, "twice", {"n": 1}) == (True, 1)
    assert skiplock.send_signal(db_url, "twice", {"n": 2}) == (False, 0)
    for task_id in (after, barrier, twice, timed_out):
        skiplock.wait(db_url, task_id, 15)
    assert _result(db, after) == ("completed", {"got": {"n": "after"}})
    assert _result(db, twice) == ("completed", {"got": {"n": 1}})
    assert _result(db, timed_out) == ("completed", {"got": None})
    assert scalar(db, "SELECT extract(epoch FROM finished_at - created_at) FROM skiplock.tasks WHERE id = %s",
                  (timed_out,)) >= 1
    assert _waiting_for(db, rolled, "rolled")
    assert scalar(db, "SELECT count(*) FROM skiplock.signals WHERE name = 'rolled'") == 0
    assert [r[0] for r in db.execute("SELECT type FROM skiplock.task_events WHERE task_id = %s ORDER BY seq",
                                     (rolled,))] == ["queued", "running", "suspended"]
    # a later wait for the second send's name gets the first payload too
    late = skiplock.enqueue(db_url, "d.signal", {"name": "twice"})
    assert skiplock.wait(db_url, late, 10).result == {"got": {"n": 1}}
    assert skiplock.send_signal(db_url, "rolled", {"n": "committed"}) == (True, 1)
    assert skiplock.wait(db_url, rolled, 10).result == {"got": {"n": "committed"}}


def test_one_send_wakes_a_hundred_waiters_and_the_latency_is_reported(db_url, db, processes):
    worker = processes.spawn(db_url, "--concurrency", "10", tasks=HANDLERS, env=ENV)
    processes.wait_ready(worker)
    ids = skiplock.enqueue_many(db_url, "d.signal", [{"name": "go"}] * 100)
    wait_for(lambda: states(db, ids) == {"waiting": 100}, 15, message="100 tasks waiting for 'go'")
    assert skiplock.send_signal(db_url, "go", {"all": True}) == (True, 100)
    wait_for(lambda: all_final(db, ids), 20, message="the 100 waiters done")
    assert db.execute("SELECT state, result, count(*) FROM skiplock.tasks WHERE id = ANY(%s) GROUP BY 1, 2",
                      (ids,)).fetchall() == [("completed", {"got": {"all": True}}, 100)]
    # measured and reported, not asserted (tests/benchmarks/signal_latency.py runs it on its own)
    print("\n" + signal_latency.measure(db_url, db, sized(50, 500)).line())


# ---- children awaited through a kill storm -------------------------------------------------------

def test_a_parent_awaiting_50_children_resumes_once_after_the_last_while_workers_are_killed(db_url, db, processes):
    rng = random.Random(36)
    workers = Workers(processes, db_url, db, 3, ENV, HANDLERS)
    parent = skiplock.enqueue(db_url, "d.parent", {"children": 50, "child_sleep": 0.6, "spawn_sleep": 3,
                                                   "linger": 3})

    def notes(note):
        return scalar(db, "SELECT count(*) FROM public.executions WHERE task_id = %s AND note = %s", (parent, note))

    def children():
        return [r[0] for r in db.execute("SELECT id FROM skiplock.tasks WHERE kind = 'd.child'")]

    # killed inside its spawn step: neither the record nor the children it enqueued commit
    wait_for(lambda: notes("spawn"), 10, interval=0.01, message="the parent inside its spawn step")
    workers.kill_holder([parent])
    assert children() == []
    # killed while the children run
    wait_for(lambda: children(), 20, message="the children spawned again")
    kills = 1 + workers.storm(3, lambda: all_final(db, children()), rng, task_ids=children())
    # killed after it resumed, before it returned
    wait_for(lambda: notes("resumed"), 30, interval=0.01, message="the parent resumed")
    assert workers.kill_holder([parent]) is not None
    kills += 1
    done = skiplock.wait(db_url, parent, 60)
    workers.ready()

    assert done.state == "completed"
    assert done.result == {"states": ["completed"] * 50, "n": 50}
    assert len(children()) == 50 and states(db, children()) == {"completed": 50}
    reclaims = scalar(db, "SELECT reclaims FROM skiplock.tasks WHERE id = %s", (parent,))
    last_child = scalar(db, "SELECT max(finished_at) FROM skiplock.tasks WHERE kind = 'd.child'")
    first_resume = scalar(db, "SELECT min(at) FROM public.executions WHERE task_id = %s AND note = 'resumed'",
                          (parent,))
    assert first_resume > last_child
    # run again after a resume only as often as it was reclaimed since
    reclaimed_after = scalar(db, "SELECT count(*) FROM skiplock.task_events WHERE task_id = %s "
                                 "AND type = 'reclaimed' AND at > %s", (parent, first_resume))
    assert notes("resumed") == 1 + reclaimed_after and reclaimed_after >= 1
    assert notes("spawn") - 1 <= reclaims
    assert scalar(db, "SELECT count(*) FROM skiplock.task_events WHERE task_id = %s AND type = 'completed'",
                  (parent,)) == 1
    assert [r[0] for r in db.execute("SELECT type FROM skiplock.task_steps WHERE task_id = %s ORDER BY position",
                                     (parent,))] == ["step", "tasks"]
    child_reclaims = scalar(db, "SELECT sum(reclaims) FROM skiplock.tasks WHERE kind = 'd.child'")
    print(f"\nchildren: {kills} kills, parent reclaimed {reclaims} times (resumed {notes('resumed')} times), "
          f"children reclaimed {child_reclaims} times")


# ---- a handler changed between runs --------------------------------------------------------------

def test_a_handler_changed_between_runs_fails_with_one_line_and_overwrites_nothing(db_url, db, processes):
    old = processes.spawn(db_url, "--concurrency", "2", tasks=HANDLERS, env={**ENV, "DURABLE_STEP_ORDER": "a,b,c"})
    processes.wait_ready(old)
    task_id = skiplock.enqueue(db_url, "d.deployed", {"pause_after": "b", "pause": 2})
    wait_for(lambda: scalar(db, "SELECT state FROM skiplock.tasks WHERE id = %s", (task_id,)) == "waiting", 10,
             message="the task asleep after step b")
    recorded = db.execute("SELECT * FROM skiplock.task_steps WHERE task_id = %s ORDER BY position",
                          (task_id,)).fetchall()
    assert [(r[1], r[2]) for r in recorded] == [(1, "a"), (2, "b"), (3, "sleep")]
    # the deploy: the old version stops, the new one (steps b and c swapped) takes over
    old.signal(signal.SIGTERM)
    assert wait_exit(old, 10)[0] == 0
    new = processes.spawn(db_url, "--concurrency", "2", tasks=HANDLERS, env={**ENV, "DURABLE_STEP_ORDER": "a,c,b"})
    processes.wait_ready(new)
    done = skiplock.wait(db_url, task_id, 15)
    assert (done.state, done.attempts) == ("failed", 1)
    assert done.last_error == ("step mismatch at position 2: this run called step 'c', the recorded call there "
                               "is step 'b' (the handler changed under a task in flight)")
    assert db.execute("SELECT * FROM skiplock.task_steps WHERE task_id = %s ORDER BY position",
                      (task_id,)).fetchall() == recorded
    # the new version replayed a and called nothing
    assert db.execute("SELECT note, pid FROM public.executions WHERE task_id = %s ORDER BY at",
                      (task_id,)).fetchall() == [("a", old.pid), ("b", old.pid)]


# ---- random handlers under random kills ----------------------------------------------------------

NAMES = ("pay", "ship", "mail")
OPS = st.one_of(st.tuples(st.just("step"), st.sampled_from(NAMES)),
                st.tuples(st.just("tx"), st.sampled_from(NAMES)),
                st.tuples(st.just("sleep"), st.sampled_from([0.1, 0.3, 0.6])),
                st.tuples(st.just("signal"), st.integers(0, 2)))


def _expected_records(ops, signal_names) -> list[tuple[int, str, int, str]]:
    """(position, name, occurrence, type) of each call of `ops`, as the handler makes them."""
    seen: dict[str, int] = {}
    out = []
    for position, (op, arg) in enumerate(ops, 1):
        name, type_ = {"step": (arg, "step"), "tx": (arg, "step"), "sleep": ("sleep", "sleep"),
                       "signal": (signal_names[arg] if op == "signal" else "", "signal")}[op]
        seen[name] = seen.get(name, 0) + 1
        out.append((position, name, seen[name], type_))
    return out


@pytest.fixture
def crew(processes, db_url, db):
    """The property test's two workers: one set for all its examples (Hypothesis runs them all
    in one call of the test, with the same fixtures), replaced as they are killed."""
    workers = Workers(processes, db_url, db, 2, ENV, HANDLERS)
    yield workers
    print(f"\nrandom handlers: {len(workers.killed)} kills over the examples, "
          f"{scalar(db, 'SELECT sum(reclaims) FROM skiplock.tasks')} reclaims, "
          f"{scalar(db, 'SELECT count(*) FROM skiplock.tasks')} tasks")


@settings(max_examples=sized(4, 25), deadline=None, database=None, derandomize=True,
          phases=(Phase.explicit, Phase.generate), suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                         HealthCheck.too_slow])
@given(plans=st.lists(st.lists(OPS, min_size=1, max_size=6), min_size=1, max_size=4),
       sends=st.lists(st.floats(-0.2, 1.0), min_size=3, max_size=3),
       kills=st.lists(st.floats(0.0, 1.5), max_size=2), seed=st.integers(0, 2**16))
def test_random_handlers_under_random_kills_record_each_step_once_and_end_final(db_url, db, crew, plans, sends,
                                                                                 kills, seed):
    rng = random.Random(seed)
    example = uuid.uuid4().hex[:8]
    signal_names = [f"{example}-{i}" for i in range(3)]
    # signals with a negative time are sent before the tasks exist
    for name, at in zip(signal_names, sends):
        if at < 0:
            skiplock.send_signal(db_url, name, {"name": name})
    ids = skiplock.enqueue_many(db_url, "d.plan", [
        {"ops": [(op, signal_names[arg] if op == "signal" else arg) for op, arg in ops], "work": 0.05}
        for ops in plans])
    start = time.monotonic()
    events = sorted([(at, "send", name) for name, at in zip(signal_names, sends) if at >= 0]
                    + [(at, "kill", None) for at in kills])
    for at, what, name in events:
        time.sleep(max(0.0, start + at - time.monotonic()))  # the moment is the example's
        if what == "send":
            skiplock.send_signal(db_url, name, {"name": name})
        else:  # the next worker to hold a claim of these tasks within a second (they spend most
            # of their time asleep or waiting for a signal sent later)
            until = time.monotonic() + 1
            crew.kill_holder(ids, rng, stop=lambda: time.monotonic() > until or all_final(db, ids))
    wait_for(lambda: all_final(db, ids), 60, interval=0.1, message="every task final")

    assert db.execute("SELECT state, last_error FROM skiplock.tasks WHERE id = ANY(%s) AND state <> 'completed'",
                      (ids,)).fetchall() == []
    for task_id, ops in zip(ids, plans):
        records = db.execute("SELECT position, name, occurrence, type FROM skiplock.task_steps WHERE task_id = %s "
                             "ORDER BY position", (task_id,)).fetchall()
        assert records == _expected_records(ops, signal_names)
        rows = db.execute("SELECT step, count(*) FROM public.step_rows WHERE task_id = %s GROUP BY step ORDER BY step",
                          (task_id,)).fetchall()
        assert rows == [(position, 1) for position, (op, _) in enumerate(ops, 1) if op == "tx"]
        steps = sum(op in ("step", "tx") for op, _ in ops)
        calls, reclaims, got = db.execute(
            "SELECT (SELECT count(*) FROM public.executions WHERE task_id = t.id), t.reclaims, t.result->'got' "
            "FROM skiplock.tasks t WHERE t.id = %s", (task_id,)).fetchone()
        assert steps <= calls <= steps + reclaims
        returned = [op for op in ops if op[0] != "sleep"]  # what the handler's result lists, in order
        assert [g for g, (op, _) in zip(got, returned) if op == "signal"] == \
            [{"name": signal_names[arg]} for op, arg in returned if op == "signal"]
