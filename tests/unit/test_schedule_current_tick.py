"""Schedule.current_tick: the nominal time a "fire now" fires under, so that its idempotency key
is the one the scheduler gives the same time."""

from __future__ import annotations

import datetime as dt

from skiplock.engine.schedules import Schedule

UTC = dt.timezone.utc
NOW = dt.datetime(2026, 3, 29, 1, 30, 42, 123456, tzinfo=UTC)


def test_a_cron_schedules_tick_is_the_current_minute():
    s = Schedule(name="c", kind="k", cron="0 6 * * *", timezone="Europe/Berlin")
    next_fire = s.first_fire(NOW)
    assert s.current_tick(next_fire, NOW) == dt.datetime(2026, 3, 29, 1, 30, tzinfo=UTC)
    assert s.current_tick(next_fire, NOW + dt.timedelta(seconds=17)) == s.current_tick(next_fire, NOW)
    assert s.current_tick(next_fire, NOW + dt.timedelta(seconds=18)) == dt.datetime(2026, 3, 29, 1, 31, tzinfo=UTC)


def test_an_interval_schedules_tick_is_on_its_own_grid_at_or_before_now():
    s = Schedule(name="i", kind="k", interval_seconds=600)
    next_fire = dt.datetime(2026, 3, 29, 1, 37, 5, tzinfo=UTC)
    tick = dt.datetime(2026, 3, 29, 1, 27, 5, tzinfo=UTC)
    assert s.current_tick(next_fire, NOW) == tick
    assert s.current_tick(next_fire, tick) == tick  # a grid time is its own tick
    assert s.current_tick(next_fire, tick - dt.timedelta(microseconds=1)) == tick - dt.timedelta(minutes=10)
    # overdue (the schedulers are behind): the latest grid time, not next_fire_at
    assert s.current_tick(next_fire, next_fire + dt.timedelta(minutes=25)) == next_fire + dt.timedelta(minutes=20)
