"""Schedule definitions and the pure decisions of a tick (engine/schedules.py)."""

from __future__ import annotations

import datetime as dt

import pytest

from skiplock.engine.errors import InvalidInput
from skiplock.engine.schedules import FIRES_PER_TICK, Schedule, idempotency_key, plan_tick

T0 = dt.datetime(2026, 5, 1, 12, 0, tzinfo=dt.timezone.utc)
S = dt.timedelta(seconds=1)


def every(seconds: float, **kw) -> Schedule:
    return Schedule(name="s", kind="k", interval_seconds=seconds, **kw)


@pytest.mark.parametrize("fields, fragment", [
    (dict(cron="61 * * * *"), "61"),
    (dict(cron="not a cron"), "'not a cron'"),
    (dict(cron="0 6 * * *", timezone="Mars/Base"), "Mars/Base"),
    (dict(interval_seconds=0), "interval_seconds 0"),
    (dict(interval_seconds=-5), "interval_seconds -5"),
    (dict(interval_seconds=float("nan")), "interval_seconds nan"),
    (dict(cron="@hourly", interval_seconds=60), "exactly one of cron and interval_seconds"),
    (dict(), "exactly one of cron and interval_seconds"),
    (dict(interval_seconds=5, overlap="sometimes"), "overlap 'sometimes'"),
    (dict(interval_seconds=5, catchup="most"), "catchup 'most'"),
    (dict(interval_seconds=5, name="bad name!"), "name 'bad name!'"),
    (dict(interval_seconds=5, kind=""), "kind ''"),
    (dict(interval_seconds=5, queue="a/b"), "queue 'a/b'"),
    (dict(interval_seconds=5, priority=40000), "priority 40000"),
    (dict(interval_seconds=5, max_attempts=0), "max_attempts 0"),
    (dict(interval_seconds=5, payload=[1, 2]), "payload [1, 2]"),
    (dict(interval_seconds=5, jitter_seconds=-1), "jitter_seconds -1"),
    (dict(interval_seconds=5, catchup_window_seconds=0), "catchup_window_seconds 0"),
    (dict(interval_seconds=5, enabled="yes"), "enabled 'yes'"),
])
def test_bad_definitions_name_the_field_and_value(fields, fragment):
    values = dict(name="s", kind="k")
    values.update(fields)
    with pytest.raises(InvalidInput) as err:
        Schedule.from_mapping(values)
    assert fragment in str(err.value)


def test_from_mapping_refuses_unknown_and_missing_fields():
    with pytest.raises(InvalidInput, match="unknown field cronn"):
        Schedule.from_mapping({"name": "s", "kind": "k", "cronn": "@hourly"})
    with pytest.raises(InvalidInput, match="kind: required"):
        Schedule.from_mapping({"name": "s", "interval_seconds": 5})
    with pytest.raises(InvalidInput, match="interval_seconds '5m'"):
        Schedule.from_mapping({"name": "s", "kind": "k", "interval_seconds": "5m"})


def test_defaults():
    s = Schedule.from_mapping({"name": "nightly", "kind": "reports.daily", "cron": "@daily"})
    assert (s.queue, s.payload, s.overlap, s.catchup, s.timezone, s.enabled) == \
        ("default", {}, "skip", "one", "UTC", True)


def test_one_due_time_fires_once_and_advances():
    plan = plan_tick(every(10), next_fire_at=T0, buffered_fire_at=None, previous_state=None, now=T0 + 3 * S)
    assert [f.nominal_at for f in plan.fires] == [T0]
    assert plan.next_fire_at == T0 + 10 * S
    assert plan.records == [] and plan.skips == 0


def test_nothing_due_changes_nothing():
    plan = plan_tick(every(10), next_fire_at=T0, buffered_fire_at=None, previous_state=None, now=T0 - S)
    assert plan.fires == [] and plan.records == [] and plan.next_fire_at == T0


@pytest.mark.parametrize("catchup, fired", [("one", 1), ("all", 10), ("none", 0)])
def test_catch_up_after_ten_missed_intervals(catchup, fired):
    # the schedulers were down from T0 to T0 + 9.5 intervals: T0, T0+10s, ..., T0+90s are due
    s = every(10, catchup=catchup, overlap="allow")
    plan = plan_tick(s, next_fire_at=T0, buffered_fire_at=None, previous_state=None, now=T0 + 95 * S)
    assert len(plan.fires) == fired
    assert plan.next_fire_at == T0 + 100 * S
    if catchup == "one":
        assert plan.fires[0].nominal_at == T0 + 90 * S  # the latest due time
    if catchup == "all":
        assert [f.nominal_at for f in plan.fires] == [T0 + k * 10 * S for k in range(10)]
    if catchup == "none":
        assert plan.records == [(T0 + 90 * S, "missed", "10 due times dropped (catchup none)")]


def test_catch_up_all_is_bounded_by_the_window_and_per_tick():
    s = every(1, catchup="all", overlap="allow", catchup_window_seconds=150)
    plan = plan_tick(s, next_fire_at=T0, buffered_fire_at=None, previous_state=None, now=T0 + 1000 * S)
    # times older than now - 150 s are dropped; of the 151 left, one tick fires FIRES_PER_TICK
    assert plan.fires[0].nominal_at == T0 + 850 * S
    assert len(plan.fires) == FIRES_PER_TICK
    assert plan.next_fire_at == T0 + (850 + FIRES_PER_TICK) * S  # still due: the next tick continues
    assert plan.records[0][1] == "missed" and "850 due times" in plan.records[0][2]


def test_catch_up_one_for_cron_after_long_downtime():
    s = Schedule(name="s", kind="k", cron="*/5 * * * *")
    plan = plan_tick(s, next_fire_at=T0, buffered_fire_at=None, previous_state=None,
                     now=T0 + dt.timedelta(days=30, minutes=7))
    assert [f.nominal_at for f in plan.fires] == [T0 + dt.timedelta(days=30, minutes=5)]
    assert plan.next_fire_at == T0 + dt.timedelta(days=30, minutes=10)


@pytest.mark.parametrize("state, fires", [("queued", 0), ("running", 0), ("cancelling", 0),
                                          ("completed", 1), ("failed", 1), (None, 1)])
def test_overlap_skip_waits_for_the_previous_task(state, fires):
    plan = plan_tick(every(10), next_fire_at=T0, buffered_fire_at=None, previous_state=state, now=T0)
    assert len(plan.fires) == fires
    assert plan.skips == 1 - fires
    assert plan.next_fire_at == T0 + 10 * S  # a skipped time is decided too: it never fires later


def test_overlap_buffer_one_keeps_one_waiting_fire():
    s = every(10, overlap="buffer_one")
    first = plan_tick(s, next_fire_at=T0, buffered_fire_at=None, previous_state="running", now=T0)
    assert first.fires == [] and first.buffered_fire_at == T0 and first.records[0][1] == "buffered"
    second = plan_tick(s, next_fire_at=T0 + 10 * S, buffered_fire_at=T0, previous_state="running",
                       now=T0 + 10 * S)
    assert second.fires == [] and second.buffered_fire_at == T0 and second.skips == 1
    done = plan_tick(s, next_fire_at=T0 + 20 * S, buffered_fire_at=T0, previous_state="completed",
                     now=T0 + 15 * S)
    assert [f.nominal_at for f in done.fires] == [T0] and done.buffered_fire_at is None


def test_overlap_cancel_previous_and_allow():
    s = every(10, overlap="cancel_previous")
    plan = plan_tick(s, next_fire_at=T0, buffered_fire_at=None, previous_state="running", now=T0)
    assert [(f.nominal_at, f.cancel_previous) for f in plan.fires] == [(T0, True)]
    idle = plan_tick(s, next_fire_at=T0, buffered_fire_at=None, previous_state="completed", now=T0)
    assert [f.cancel_previous for f in idle.fires] == [False]
    allow = plan_tick(every(10, overlap="allow"), next_fire_at=T0, buffered_fire_at=None,
                      previous_state="running", now=T0)
    assert [f.cancel_previous for f in allow.fires] == [False]


def test_idempotency_key_is_per_name_and_utc_instant():
    berlin = T0.astimezone(dt.timezone(dt.timedelta(hours=2)))
    assert idempotency_key("s", T0) == idempotency_key("s", berlin) == "schedule:s:2026-05-01T12:00:00.000000+00:00"
    assert idempotency_key("s", T0) != idempotency_key("s", T0 + dt.timedelta(microseconds=1))
