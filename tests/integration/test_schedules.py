"""Schedules against a real Postgres: firing, overlap and catch-up against real task rows, DST
walks with a pinned database clock, declarative apply, and concurrent tickers."""

from __future__ import annotations

import datetime as dt
import threading
import zoneinfo

import pytest

from skiplock.engine.errors import InvalidInput, ScheduleNotFound
from skiplock.engine.metrics import Metrics
from skiplock.engine.schedule_actions import apply_schedules, set_schedule_enabled
from skiplock.engine.schedules import Schedule, idempotency_key
from skiplock.engine.store import Store
from skiplock.scheduler.firing import Firer

UTC = dt.timezone.utc
T0 = dt.datetime(2026, 6, 1, 8, 0, tzinfo=UTC)
S = dt.timedelta(seconds=1)


def tasks_of(db, name: str) -> list[tuple]:
    return db.execute("SELECT id, kind, queue, payload, priority, max_attempts, state, idempotency_key "
                      "FROM skiplock.tasks WHERE idempotency_key LIKE %s ORDER BY idempotency_key",
                      (f"schedule:{name}:%",)).fetchall()


def fires_of(db, name: str) -> list[tuple]:
    return db.execute("SELECT nominal_at, outcome, task_id FROM skiplock.schedule_fires WHERE schedule = %s "
                      "ORDER BY nominal_at", (name,)).fetchall()


def test_a_due_schedule_fires_once_with_its_definition(store: Store, db):
    s = Schedule(name="report", kind="reports.build", queue="reports", payload={"scope": "all"}, priority=5,
                 max_attempts=7, interval_seconds=60)
    assert apply_schedules(store, [s], now=T0) == {"created": ["report"], "updated": [], "unchanged": [],
                                                  "deleted": []}
    firer = Firer(store, Metrics())
    assert firer.run_once(now=T0 + 59 * S).fired == 0  # not yet due
    counts = firer.run_once(now=T0 + 61 * S)
    assert counts.fired == 1
    (task,) = tasks_of(db, "report")
    assert task[1:] == ("reports.build", "reports", {"scope": "all"}, 5, 7, "queued",
                        idempotency_key("report", T0 + 60 * S))
    assert fires_of(db, "report") == [(T0 + 60 * S, "fired", task[0])]
    status = store.schedules.schedule_get("report")
    assert (status.next_fire_at, status.last_fire_at, status.last_task_id, status.fires) == \
        (T0 + 120 * S, T0 + 60 * S, task[0], 1)
    # the same moment again decides nothing new
    assert firer.run_once(now=T0 + 61 * S).fired == 0
    assert len(tasks_of(db, "report")) == 1


def test_a_repeated_decision_finds_the_first_task(store: Store, db):
    apply_schedules(store, [Schedule(name="s", kind="k", interval_seconds=10, overlap="allow")], now=T0)
    firer = Firer(store, Metrics())
    firer.run_once(now=T0 + 10 * S)
    # as if a tick's advance were lost: the same nominal time is due again
    db.execute("UPDATE skiplock.schedules SET next_fire_at = %s", (T0 + 10 * S,))
    firer.run_once(now=T0 + 11 * S)
    assert len(tasks_of(db, "s")) == 1
    assert [f[1] for f in fires_of(db, "s")] == ["fired"]


def test_concurrent_tickers_decide_each_schedule_once(store: Store, db):
    apply_schedules(store, [Schedule(name=f"s{i}", kind="k", interval_seconds=10) for i in range(40)], now=T0)
    barrier = threading.Barrier(8)
    totals = []

    def tick():
        firer = Firer(store, Metrics(), batch=7)
        barrier.wait()
        fired = 0
        for _ in range(10):
            fired += firer.run_once(now=T0 + 10 * S).fired
        totals.append(fired)

    threads = [threading.Thread(target=tick) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(totals) == 40
    assert db.execute("SELECT count(*), count(DISTINCT idempotency_key) FROM skiplock.tasks").fetchone() == (40, 40)


def test_overlap_skip_against_the_previous_task_state(store: Store, db):
    apply_schedules(store, [Schedule(name="s", kind="k", interval_seconds=10)], now=T0)
    firer = Firer(store, Metrics())
    assert firer.run_once(now=T0 + 10 * S).fired == 1
    counts = firer.run_once(now=T0 + 20 * S)  # the first task is still queued
    assert (counts.fired, counts.skipped) == (0, 1)
    db.execute("UPDATE skiplock.tasks SET state = 'completed', finished_at = now()")
    assert firer.run_once(now=T0 + 30 * S).fired == 1
    assert [f[1] for f in fires_of(db, "s")] == ["fired", "skipped", "fired"]
    assert store.schedules.schedule_get("s").skips == 1


def test_overlap_buffer_one_fires_the_buffered_time_when_the_previous_ends(store: Store, db):
    apply_schedules(store, [Schedule(name="s", kind="k", interval_seconds=10, overlap="buffer_one")], now=T0)
    firer = Firer(store, Metrics())
    firer.run_once(now=T0 + 10 * S)
    firer.run_once(now=T0 + 20 * S)  # buffered
    firer.run_once(now=T0 + 30 * S)  # one is already buffered: skipped
    assert [f[1] for f in fires_of(db, "s")] == ["fired", "buffered", "skipped"]
    assert len(tasks_of(db, "s")) == 1
    db.execute("UPDATE skiplock.tasks SET state = 'completed', finished_at = now()")
    assert firer.run_once(now=T0 + 35 * S).fired == 1  # not due, but the buffered fire is
    assert [(f[0], f[1]) for f in fires_of(db, "s")] == [(T0 + 10 * S, "fired"), (T0 + 20 * S, "fired"),
                                                         (T0 + 30 * S, "skipped")]
    assert store.schedules.schedule_get("s").buffered_fire_at is None


def test_overlap_cancel_previous_cancels_the_running_task(store: Store, db):
    apply_schedules(store, [Schedule(name="s", kind="k", interval_seconds=10, overlap="cancel_previous")], now=T0)
    firer = Firer(store, Metrics())
    firer.run_once(now=T0 + 10 * S)
    (first,) = store.tasks.task_claim(["default"], 1, "w", 30)
    firer.run_once(now=T0 + 20 * S)
    states = [t[6] for t in tasks_of(db, "s")]
    assert states == ["cancelling", "queued"]  # the running one is asked to stop; its worker learns it


@pytest.mark.parametrize("catchup, fired", [("one", 1), ("all", 10), ("none", 0)])
def test_downtime_of_ten_intervals(store: Store, db, catchup, fired):
    apply_schedules(store, [Schedule(name="s", kind="k", interval_seconds=10, overlap="allow",
                                    catchup=catchup)], now=T0)
    firer = Firer(store, Metrics())
    # first fire due at T0+10s; no scheduler ran until T0+105s: T0+10s ... T0+100s are due
    firer.run_once(now=T0 + 105 * S)
    assert len(tasks_of(db, "s")) == fired
    assert store.schedules.schedule_get("s").next_fire_at == T0 + 110 * S
    firer.run_once(now=T0 + 111 * S)  # and back to normal
    assert len(tasks_of(db, "s")) == fired + 1


def walk(firer: Firer, start: dt.datetime, end: dt.datetime, step: dt.timedelta) -> None:
    now = start
    while now <= end:
        firer.run_once(now=now)
        now += step


@pytest.mark.parametrize("day, fire_utc", [
    (dt.date(2026, 3, 29), dt.datetime(2026, 3, 29, 1, 0, tzinfo=UTC)),    # 02:30 does not exist: 03:00 CEST
    (dt.date(2026, 10, 25), dt.datetime(2026, 10, 25, 0, 30, tzinfo=UTC)),  # 02:30 twice: the first
])
def test_daily_cron_across_dst_in_berlin_fires_once_a_day(store: Store, db, day, fire_utc):
    berlin = zoneinfo.ZoneInfo("Europe/Berlin")
    start = dt.datetime.combine(day - dt.timedelta(days=2), dt.time(12), tzinfo=UTC)
    apply_schedules(store, [Schedule(name="nightly", kind="k", cron="30 2 * * *", timezone="Europe/Berlin",
                                    overlap="allow")], now=start)
    walk(Firer(store, Metrics()), start, start + dt.timedelta(days=4), dt.timedelta(minutes=10))
    nominal = [f[0] for f in fires_of(db, "nightly")]
    local_days = [n.astimezone(berlin).date() for n in nominal]
    assert local_days == [day - dt.timedelta(days=1), day, day + dt.timedelta(days=1), day + dt.timedelta(days=2)]
    assert fire_utc in nominal
    assert len(tasks_of(db, "nightly")) == 4


def test_across_fall_back_an_hourly_cron_fires_every_hour_and_a_wall_time_once(store: Store, db):
    start = dt.datetime(2026, 10, 24, 22, 0, tzinfo=UTC)  # 00:00 CEST on the 25th
    apply_schedules(store, [Schedule(name="hourly", kind="k", cron="0 * * * *", timezone="Europe/Berlin",
                                     overlap="allow"),
                            Schedule(name="nightly", kind="k", cron="30 2 * * *", timezone="Europe/Berlin",
                                     overlap="allow")], now=start - S)
    walk(Firer(store, Metrics()), start, start + dt.timedelta(hours=25, minutes=1), dt.timedelta(minutes=5))
    berlin = zoneinfo.ZoneInfo("Europe/Berlin")
    fires = [f[0] for f in fires_of(db, "hourly")]
    wall = [f.astimezone(berlin).strftime("%d %H:%M%Z") for f in fires]
    # 25 real hours: an interval-like field fires through both passes of the repeated 02:00, as cron does
    assert wall == ([f"25 {h:02d}:00CEST" for h in range(3)] + [f"25 {h:02d}:00CET" for h in range(2, 24)]
                    + ["26 00:00CET"])
    assert all(b - a == dt.timedelta(hours=1) for a, b in zip(fires, fires[1:]))
    # a named wall time fires once, in the first pass
    assert [f[0].astimezone(berlin).strftime("%d %H:%M%Z") for f in fires_of(db, "nightly")] == ["25 02:30CEST"]


def test_apply_keeps_the_place_of_unchanged_schedules_and_retimes_changed_ones(store: Store, db):
    s = Schedule(name="s", kind="k", interval_seconds=10)
    apply_schedules(store, [s], now=T0)
    Firer(store, Metrics()).run_once(now=T0 + 10 * S)
    before = store.schedules.schedule_get("s")
    assert apply_schedules(store, [s], now=T0 + 12 * S)["unchanged"] == ["s"]
    assert store.schedules.schedule_get("s").next_fire_at == before.next_fire_at == T0 + 20 * S
    # a payload change is an update that keeps the timing
    changed = Schedule(name="s", kind="k", interval_seconds=10, payload={"v": 2})
    assert apply_schedules(store, [changed], now=T0 + 13 * S)["updated"] == ["s"]
    assert store.schedules.schedule_get("s").next_fire_at == T0 + 20 * S
    # a new timing starts from now: the old definition never fires again
    daily = Schedule(name="s", kind="k", cron="0 0 * * *")
    apply_schedules(store, [daily], now=T0 + 14 * S)
    assert store.schedules.schedule_get("s").next_fire_at == dt.datetime(2026, 6, 2, tzinfo=UTC)
    assert Firer(store, Metrics()).run_once(now=T0 + 25 * S).fired == 0


def test_apply_prune_pause_resume_delete(store: Store, db):
    a, b = Schedule(name="a", kind="k", interval_seconds=10), Schedule(name="b", kind="k", interval_seconds=10)
    apply_schedules(store, [a, b], now=T0)
    assert apply_schedules(store, [a], prune=True, now=T0)["deleted"] == ["b"]
    assert [st.schedule.name for st in store.schedules.schedule_list()] == ["a"]
    set_schedule_enabled(store, "a", False)
    assert Firer(store, Metrics()).run_once(now=T0 + 60 * S).fired == 0  # paused: nothing fires
    set_schedule_enabled(store, "a", True)
    resumed = store.schedules.schedule_get("a")
    # resuming starts from the database's now (no catch-up of the paused time)
    assert resumed.schedule.enabled and resumed.next_fire_at > dt.datetime.now(UTC)
    store.schedules.schedule_delete("a")
    with pytest.raises(ScheduleNotFound):
        store.schedules.schedule_get("a")
    with pytest.raises(ScheduleNotFound):
        set_schedule_enabled(store, "a", True)
    with pytest.raises(InvalidInput, match="more than once"):
        apply_schedules(store, [a, a])


def test_jitter_delays_the_task_not_the_nominal_time(store: Store, db):
    apply_schedules(store, [Schedule(name="s", kind="k", interval_seconds=10, jitter_seconds=30)], now=T0)
    Firer(store, Metrics()).run_once(now=T0 + 10 * S)
    run_after, created, key = db.execute("SELECT run_after, created_at, idempotency_key FROM skiplock.tasks").fetchone()
    assert key == idempotency_key("s", T0 + 10 * S)
    assert dt.timedelta(0) <= run_after - created <= dt.timedelta(seconds=30)


def test_a_row_that_cannot_be_evaluated_is_postponed_not_spun_on(store: Store, db):
    apply_schedules(store, [Schedule(name="good", kind="k", interval_seconds=10)], now=T0)
    db.execute("INSERT INTO skiplock.schedules (name, kind, interval_seconds, timezone, next_fire_at) "
               "VALUES ('broken', 'k', 60, 'Mars/Olympus', %s)", (T0,))
    counts = Firer(store, Metrics()).run_once(now=T0 + 10 * S)
    assert counts.fired == 1  # the good schedule still fires
    broken = db.execute("SELECT next_fire_at FROM skiplock.schedules WHERE name = 'broken'").fetchone()[0]
    assert broken == T0 + 70 * S  # looked at again in a minute, not at every tick


def test_a_schedule_whose_payload_is_over_the_limit_is_postponed_and_the_rest_fire(store: Store, db):
    big = Schedule(name="big", kind="k", interval_seconds=10, payload={"blob": "x" * 2000})
    small = Schedule(name="small", kind="k", interval_seconds=10)
    apply_schedules(store, [big, small], now=T0)
    counts = Firer(store, Metrics(), max_payload_bytes=1000).run_once(now=T0 + 10 * S)
    assert counts.fired == 1
    assert [t[7] for t in tasks_of(db, "small")] == [idempotency_key("small", T0 + 10 * S)]
    assert tasks_of(db, "big") == [] and fires_of(db, "big") == []
    assert store.schedules.schedule_get("big").next_fire_at == T0 + 70 * S
