"""kill -9 of scheduler replicas while an interval schedule fires every 100 ms: a tick killed
mid-transaction rolls back and a survivor (or a replacement) decides the same nominal times again,
so every nominal time from the first fire to the last is fired exactly once, none missed."""

from __future__ import annotations

import datetime as dt
import random
import signal
import time

import pytest

from skiplock.engine.schedule_actions import apply_schedules
from skiplock.engine.schedules import Schedule
from tests.support import harness
from tests.support.harness import metric, scalar, wait_for

UTC = dt.timezone.utc
NAME = "heartbeat"
INTERVAL = dt.timedelta(seconds=0.1)
KILLING_FOR = 6.0  # seconds
MIN_KILLS = 5


def _ready(proc: harness.Proc) -> bool:
    try:
        return harness.http_status(proc.metrics_port, "/readyz") == 200
    except OSError:
        return False


def _last_fired_nominal(db):
    return scalar(db, "SELECT max(nominal_at) FROM skiplock.schedule_fires WHERE schedule = %s "
                      "AND outcome = 'fired'", (NAME,))


@pytest.mark.timeout(90)
def test_kill_9_scheduler_replicas_every_nominal_time_fires_exactly_once(db_url, db, store, processes):
    rng = random.Random()
    apply_schedules(store, [Schedule(NAME, "t.noop", interval_seconds=INTERVAL.total_seconds(),
                                    overlap="allow", catchup="all")])
    first_nominal = store.schedules.schedule_get(NAME).next_fire_at

    live = [processes.spawn(db_url, command="scheduler") for _ in range(2)]
    for proc in live:
        processes.wait_ready(proc)

    # a kill every 0.3-0.8 s, at a random moment of whatever the victim is doing (that pace is the
    # scenario, not a wait for a condition); only replicas that are up and firing are victims, and
    # each is replaced at once (not waited for: the replacement's start-up overlaps the next kill)
    kills, victims_fires = 0, []
    started = time.monotonic()
    while time.monotonic() - started < KILLING_FOR or kills < MIN_KILLS:
        assert time.monotonic() - started < 40, f"only {kills} kills in 40 s: replicas never got ready"
        time.sleep(rng.uniform(0.3, 0.8))
        candidates = [p for p in live if _ready(p)]
        if not candidates:
            continue
        victim = rng.choice(candidates)
        fires = metric(victim.metrics_port, "skiplock_schedule_fires_total", schedule=NAME) or 0
        victim.signal(signal.SIGKILL)
        assert victim.wait(10) == -signal.SIGKILL
        kills += 1
        victims_fires.append(int(fires))
        live.remove(victim)
        live.append(processes.spawn(db_url, command="scheduler"))
    killed_until = harness.db_clock(db)

    # the survivors catch up on whatever was due while replicas were dead, then stop cleanly
    for proc in live:
        processes.wait_ready(proc)
    wait_for(lambda: (_last_fired_nominal(db) or first_nominal) >= killed_until, 30, interval=0.1,
             message=f"fires to reach {killed_until}")
    for proc in live:
        proc.signal(signal.SIGTERM)
    for proc in live:
        code, _ = harness.wait_exit(proc, 15)
        assert code == 0, proc.log()[-3000:]

    fired = db.execute("SELECT f.nominal_at, t.idempotency_key FROM skiplock.schedule_fires f "
                       "LEFT JOIN skiplock.tasks t ON t.id = f.task_id "
                       "WHERE f.schedule = %s AND f.outcome = 'fired' ORDER BY f.nominal_at", (NAME,)).fetchall()
    nominals = [n for n, _ in fired]
    gaps = {b - a for a, b in zip(nominals, nominals[1:])}
    tasks, keys = db.execute("SELECT count(*), count(DISTINCT idempotency_key) FROM skiplock.tasks").fetchone()
    outcomes = dict(db.execute("SELECT outcome, count(*) FROM skiplock.schedule_fires GROUP BY outcome").fetchall())
    status = store.schedules.schedule_get(NAME)
    print(f"\n{kills} kills (fires each victim had made: {victims_fires}); {len(fired)} fires from "
          f"{nominals[0]:%H:%M:%S.%f} to {nominals[-1]:%H:%M:%S.%f}")

    assert kills >= MIN_KILLS
    # from the schedule's first nominal time to the last fire: each one, once, 100 ms apart
    assert nominals[0] == first_nominal
    assert gaps == {INTERVAL}, sorted(gaps)
    assert nominals[-1] >= killed_until
    assert outcomes == {"fired": len(fired)}
    assert tasks == keys == len(fired)
    assert [key for _, key in fired] == \
        [f"schedule:{NAME}:{n.astimezone(UTC).isoformat(timespec='microseconds')}" for n in nominals]
    # the row agrees: it counted every fire once and waits for the time after the last
    assert status.fires == len(fired)
    assert status.next_fire_at == nominals[-1] + INTERVAL
