"""Real `skiplock scheduler` processes against a real Postgres: replicas sharing one schedule table
fire each nominal time exactly once, the overlap policies hold with a real worker running the tasks,
SIGTERM exits 0, and `skiplock schedules apply` refuses bad files whole and syncs good ones."""

from __future__ import annotations

import datetime as dt
import signal
import subprocess
import sys
import time

import pytest

from skiplock.engine.schedule_actions import apply_schedules
from skiplock.engine.schedules import Schedule
from tests.support import harness
from tests.support.harness import ROOT, metric, scalar, wait_for

UTC = dt.timezone.utc


# ---- helpers -------------------------------------------------------------------------------------

def _key(name: str, nominal: dt.datetime) -> str:
    """The idempotency key a fire of `nominal` must carry (written out here, not imported)."""
    return f"schedule:{name}:{nominal.astimezone(UTC).isoformat(timespec='microseconds')}"


def _fired(db, name: str) -> list[tuple[dt.datetime, str | None]]:
    """(nominal time, the fired task's idempotency key), oldest first."""
    return db.execute("SELECT f.nominal_at, t.idempotency_key FROM skiplock.schedule_fires f "
                      "LEFT JOIN skiplock.tasks t ON t.id = f.task_id "
                      "WHERE f.schedule = %s AND f.outcome = 'fired' ORDER BY f.nominal_at", (name,)).fetchall()


def _outcomes(db, name: str) -> dict[str, int]:
    return dict(db.execute("SELECT outcome, count(*) FROM skiplock.schedule_fires WHERE schedule = %s "
                           "GROUP BY outcome", (name,)).fetchall())


def _schedule_tasks(db, name: str) -> tuple[int, int]:
    """(tasks, distinct idempotency keys) of the schedule's tasks."""
    return db.execute("SELECT count(*), count(DISTINCT idempotency_key) FROM skiplock.tasks "
                      "WHERE idempotency_key LIKE %s", (f"schedule:{name}:%",)).fetchone()


def _last_fired_nominal(db, name: str) -> dt.datetime | None:
    return scalar(db, "SELECT max(nominal_at) FROM skiplock.schedule_fires WHERE schedule = %s "
                      "AND outcome = 'fired'", (name,))


def _ready(proc: harness.Proc) -> bool:
    try:
        return harness.http_status(proc.metrics_port, "/readyz") == 200
    except OSError:
        return False


def _fires_metric(proc: harness.Proc, name: str) -> int:
    return int(metric(proc.metrics_port, "skiplock_schedule_fires_total", schedule=name) or 0)


def _check_consecutive(fired, interval: dt.timedelta) -> None:
    """Every nominal time from the first fire to the last is there, once, `interval` apart."""
    nominals = [n for n, _ in fired]
    gaps = {b - a for a, b in zip(nominals, nominals[1:])}
    assert gaps == {interval}, f"gaps between consecutive nominal times: {sorted(gaps)}"


# ---- a. the seed experiment -------------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_seed_experiment_3_replicas_200ms_for_5s_fire_25_times_not_75(db_url, db, store, processes):
    name, interval = "seed", dt.timedelta(seconds=0.2)
    apply_schedules(store, [Schedule(name, "t.noop", interval_seconds=0.2, overlap="allow", catchup="all")])
    first_nominal = store.schedules.schedule_get(name).next_fire_at

    replicas = [processes.spawn(db_url, command="scheduler") for _ in range(3)]
    for proc in replicas:
        processes.wait_ready(proc)
    # the window: 5 s of nominal times from the first one after all 3 replicas were ready
    ready_at = harness.db_clock(db)
    start = first_nominal + max(0, -(-(ready_at - first_nominal) // interval)) * interval
    end = start + dt.timedelta(seconds=5)
    wait_for(lambda: (_last_fired_nominal(db, name) or start) >= end, 30, interval=0.1,
             message=f"fires up to {end}")

    # stop firing (the UPDATE waits for a tick holding the row), then let the counters catch up
    db.execute("UPDATE skiplock.schedules SET enabled = false WHERE name = %s", (name,))
    fired = _fired(db, name)
    wait_for(lambda: sum(_fires_metric(p, name) for p in replicas) == len(fired), 10,
             message=f"skiplock_schedule_fires_total summed over the replicas to reach {len(fired)}")
    per_replica = [_fires_metric(p, name) for p in replicas]
    assert all(p.alive() for p in replicas)

    in_window = [n for n, _ in fired if start <= n < end]
    print(f"\n{'scenario':<48} {'executions':>10}  per replica")
    print(f"{'naive per-replica ticker (theory), 3 x 5 s / 0.2 s':<48} {75:>10}  25 / 25 / 25")
    print(f"{'skiplock, 3 replicas, 5 s window of 0.2 s':<48} {len(in_window):>10}  "
          f"(all {len(fired)} fires: {' / '.join(map(str, per_replica))})")

    # exactly 25 nominal times in the half-open 5 s window (it starts on a nominal time)
    assert len(in_window) == 25, in_window
    # the first fire is the schedule's first nominal time; none after it is missing or repeated
    assert fired[0][0] == first_nominal
    _check_consecutive(fired, interval)
    assert _outcomes(db, name) == {"fired": len(fired)}
    assert [key for _, key in fired] == [_key(name, n) for n, _ in fired]
    assert _schedule_tasks(db, name) == (len(fired), len(fired))
    # every fire was made by one of the replicas, and counted once
    assert sum(per_replica) == len(fired)


# ---- b. overlap policies with a real worker --------------------------------------------------------

def _overlapping_pairs(db) -> int:
    """Pairs of t.span executions whose [start, end] intervals intersect."""
    return scalar(db, """
        WITH spans AS (
            SELECT task_id, min(at) FILTER (WHERE note = 'start') AS s, max(at) FILTER (WHERE note = 'end') AS e
            FROM public.executions GROUP BY task_id)
        SELECT count(*) FROM spans a JOIN spans b ON a.task_id < b.task_id AND a.s < b.e AND b.s < a.e""")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("overlap", ["skip", "allow", "buffer_one"])
def test_overlap_policy_with_a_worker_running_300ms_tasks_every_200ms(db_url, db, store, processes, overlap):
    name = f"span_{overlap}"
    worker = processes.spawn(db_url, env={"SKIPLOCK_CONCURRENCY": 4})
    scheduler = processes.spawn(db_url, command="scheduler")
    processes.wait_ready(worker)
    processes.wait_ready(scheduler)
    apply_schedules(store, [Schedule(name, "t.span", payload={"sleep": 0.3}, interval_seconds=0.2,
                                    overlap=overlap)])
    first_nominal = store.schedules.schedule_get(name).next_fire_at

    # ~3 s of nominal times; meanwhile sample the schedule's queued tasks and buffered decisions
    max_queued, buffered_seen, samples = 0, 0, 0
    deadline = time.monotonic() + 30
    while (_last_fired_nominal(db, name) or first_nominal) < first_nominal + dt.timedelta(seconds=3):
        assert time.monotonic() < deadline, f"no fire 3 s after the first:\n{scheduler.log()[-3000:]}"
        queued, buffered = db.execute(
            "SELECT (SELECT count(*) FROM skiplock.tasks WHERE idempotency_key LIKE %s AND state = 'queued'), "
            "(SELECT count(*) FROM skiplock.schedule_fires WHERE schedule = %s AND outcome = 'buffered')",
            (f"schedule:{name}:%", name)).fetchone()
        max_queued, buffered_seen, samples = max(max_queued, queued), max(buffered_seen, buffered), samples + 1
        time.sleep(0.02)

    db.execute("UPDATE skiplock.schedules SET enabled = false WHERE name = %s", (name,))
    # the worker finishes what was fired; the handler records 'end' before the task completes
    wait_for(lambda: scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE state <> 'completed'") == 0, 15,
             message="the fired tasks to complete")
    tasks = scalar(db, "SELECT count(*) FROM skiplock.tasks")
    assert db.execute("SELECT count(*) FILTER (WHERE note = 'start'), count(*) FILTER (WHERE note = 'end'), "
                      "count(DISTINCT task_id) FROM public.executions").fetchone() == (tasks, tasks, tasks)
    fired = _fired(db, name)
    outcomes = _outcomes(db, name)
    overlapping = _overlapping_pairs(db)
    # fires from a buffered time record it: their row went from 'buffered' to 'fired'
    from_buffer = scalar(db, "SELECT count(*) FROM skiplock.schedule_fires WHERE schedule = %s "
                             "AND outcome = 'fired' AND detail LIKE 'buffered%%'", (name,))
    print(f"\noverlap {overlap}: {tasks} executions, {overlapping} overlapping pairs, decisions {outcomes}, "
          f"fired from the buffer {from_buffer}, max queued {max_queued} over {samples} samples")

    assert worker.alive() and scheduler.alive()
    assert len(fired) == tasks and _schedule_tasks(db, name) == (tasks, tasks)
    assert [key for _, key in fired] == [_key(name, n) for n, _ in fired]
    assert scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE kind <> 't.span'") == 0
    if overlap == "skip":
        assert overlapping == 0
        assert outcomes.get("skipped", 0) > 0
        assert set(outcomes) <= {"fired", "skipped"}
    elif overlap == "allow":
        assert overlapping > 0
        assert set(outcomes) == {"fired"}
    else:
        assert overlapping == 0
        assert max_queued <= 1
        assert buffered_seen + outcomes.get("buffered", 0) > 0, "no time was ever buffered"
        assert from_buffer > 0, "no buffered time fired after its predecessor finished"
        # at most one time waits at once: the one left when the schedule was disabled
        assert outcomes.get("buffered", 0) <= 1
        assert set(outcomes) <= {"fired", "skipped", "buffered"}


# ---- c. SIGTERM -------------------------------------------------------------------------------------

@pytest.mark.timeout(30)
def test_sigterm_stops_a_scheduler_with_exit_code_0(db_url, db, store, processes):
    apply_schedules(store, [Schedule("tick", "t.noop", interval_seconds=0.2)])
    scheduler = processes.spawn(db_url, command="scheduler")
    processes.wait_ready(scheduler)
    wait_for(lambda: _fired(db, "tick"), 15, message="a first fire")

    scheduler.signal(signal.SIGTERM)
    code, waited = harness.wait_exit(scheduler, 10)
    assert code == 0, scheduler.log()[-3000:]
    assert "scheduler stopped" in scheduler.log()
    print(f"\nexited {waited:.2f}s after SIGTERM")


# ---- d. the schedules CLI ---------------------------------------------------------------------------

def skiplock(*args: str, url: str) -> subprocess.CompletedProcess:
    env = {**harness.child_environment(), "SKIPLOCK_DATABASE_URL": url, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "skiplock.cli", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


GOOD = "- name: {name}\n  kind: t.noop\n  interval_seconds: {interval}\n"

BAD = [
    ("- name: nightly\n  kind: t.noop\n  cron: '61 * * * *'\n", ["cron '61 * * * *'", "minute 61"]),
    ("- name: nightly\n  kind: t.noop\n  cron: '0 6 * * *'\n  timezone: Mars/Olympus\n",
     ["timezone 'Mars/Olympus'"]),
    ("- name: nightly\n  kind: t.noop\n  interval_seconds: 0\n", ["interval_seconds 0"]),
    ("- name: nightly\n  kind: t.noop\n  cron: '* * * * *'\n  interval_seconds: 5\n",
     ["cron='* * * * *'", "interval_seconds=5"]),
    ("- name: nightly\n  kind: t.noop\n  interval_seconds: 5\n  overlap: sometimes\n", ["overlap 'sometimes'"]),
    ("- name: 'bad name!'\n  kind: t.noop\n  interval_seconds: 5\n", ["name 'bad name!'"]),
]


@pytest.mark.timeout(60)
def test_schedules_apply_refuses_a_bad_file_whole_and_syncs_a_good_one(db_url, db, tmp_path):
    bad_file = tmp_path / "bad.yaml"
    for entry, fragments in BAD:
        # a valid schedule first: a file is applied whole or not at all
        bad_file.write_text(GOOD.format(name="fine", interval=60) + entry)
        done = skiplock("schedules", "apply", "-f", str(bad_file), url=db_url)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 1, (entry, done.stdout, done.stderr)
        assert len(lines) == 1 and lines[0].startswith("skiplock schedules: "), done.stderr
        for fragment in fragments:
            assert fragment in lines[0], (fragment, lines[0])
        assert done.stdout == ""
        assert scalar(db, "SELECT count(*) FROM skiplock.schedules") == 0, entry

    good = tmp_path / "good.yaml"
    good.write_text(GOOD.format(name="report", interval=3600))
    done = skiplock("schedules", "apply", "-f", str(good), url=db_url)
    assert done.returncode == 0, done.stderr
    assert "created: report" in done.stdout.splitlines()
    again = skiplock("schedules", "apply", "-f", str(good), url=db_url)
    assert again.returncode == 0, again.stderr
    assert "unchanged: report" in again.stdout.splitlines()
    assert db.execute("SELECT name, kind, interval_seconds FROM skiplock.schedules").fetchall() == \
        [("report", "t.noop", 3600.0)]

    listed = skiplock("schedules", "list", url=db_url)
    assert listed.returncode == 0, listed.stderr
    rows = listed.stdout.splitlines()
    assert rows[0].split()[:2] == ["NAME", "KIND"]
    assert [r.split()[:2] for r in rows[1:]] == [["report", "t.noop"]]

    other = tmp_path / "other.yaml"
    other.write_text(GOOD.format(name="other", interval=60))
    pruned = skiplock("schedules", "apply", "-f", str(other), "--prune", url=db_url)
    assert pruned.returncode == 0, pruned.stderr
    assert {"created: other", "deleted: report"} <= set(pruned.stdout.splitlines())
    assert [r[0] for r in db.execute("SELECT name FROM skiplock.schedules")] == ["other"]


# ---- e. a kind no worker knows ----------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_a_schedule_of_a_kind_no_worker_knows_still_fires(db_url, db, store, processes):
    name = "orphan"
    worker = processes.spawn(db_url, env={"SKIPLOCK_CONCURRENCY": 2})
    scheduler = processes.spawn(db_url, command="scheduler")
    processes.wait_ready(worker)
    processes.wait_ready(scheduler)
    apply_schedules(store, [Schedule(name, "nobody.knows", interval_seconds=0.2)])

    # overlap 'skip' (the default): each next fire needs the previous task to have ended, which the
    # worker does by failing it (no handler); the fires keep coming
    wait_for(lambda: len(_fired(db, name)) >= 3, 20, message="3 fires of the unknown kind")
    db.execute("UPDATE skiplock.schedules SET enabled = false WHERE name = %s", (name,))
    wait_for(lambda: scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE state IN "
                                "('queued', 'running', 'cancelling')") == 0, 15,
             message="the fired tasks to end")
    fired = _fired(db, name)
    assert [key for _, key in fired] == [_key(name, n) for n, _ in fired]
    rows = db.execute("SELECT kind, state, last_error FROM skiplock.tasks").fetchall()
    assert len(rows) == len(fired) >= 3
    assert all(kind == "nobody.knows" and state == "failed" and "no handler" in error
               for kind, state, error in rows), rows
    assert worker.alive() and scheduler.alive()


def test_the_scheduler_applies_its_schedules_file_at_start_up(db_url, db, processes, tmp_path):
    path = tmp_path / "schedules.yaml"
    path.write_text("schedules:\n  - {name: from-file, kind: t.noop, interval_seconds: 3600}\n")
    proc = processes.spawn(db_url, command="scheduler", env={"SKIPLOCK_SCHEDULES_FILE": str(path)})
    processes.wait_ready(proc)
    assert db.execute("SELECT name, interval_seconds FROM skiplock.schedules").fetchall() == [("from-file", 3600.0)]
    assert '"schedules_created": 1' in proc.log()
