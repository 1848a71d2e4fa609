"""Cron's day syntax (L, LW, 5L, MON#1) the ways a schedule arrives, against real Postgres: a
schedules file applied and fired by the scheduler's tick, and the API. The calendar itself is
tested in tests/unit/test_cron.py and against cronsim in tests/unit/test_cron_oracle.py."""

from __future__ import annotations

import calendar
import datetime as dt
import zoneinfo

import pytest

from skiplock.engine.errors import InvalidInput
from skiplock.engine.metrics import Metrics
from skiplock.engine.schedule_actions import apply_schedules
from skiplock.engine.schedules import load_file
from skiplock.engine.store import Store
from skiplock.scheduler.firing import Firer
from tests.integration.test_api import api, count, error_of, make_api  # noqa: F401 (fixtures)

UTC = dt.timezone.utc
BERLIN = zoneinfo.ZoneInfo("Europe/Berlin")
# overlap allow: no worker runs these tasks, so each stays queued and `skip` would drop the next fire
SCHEDULES = """\
schedules:
  - {name: month-end, kind: k, cron: '0 18 LW * *', timezone: Europe/Berlin, overlap: allow}
  - {name: first-monday, kind: k, cron: '0 9 * * MON#1', timezone: Europe/Berlin, overlap: allow}
  - {name: last-friday, kind: k, cron: '30 2 * * FRIL', timezone: Europe/Berlin, overlap: allow}
"""


def fired_local(db, name: str) -> list[str]:
    rows = db.execute("SELECT nominal_at FROM skiplock.schedule_fires WHERE schedule = %s AND outcome = 'fired' "
                      "ORDER BY nominal_at", (name,)).fetchall()
    return [row[0].astimezone(BERLIN).strftime("%a %m-%d %H:%M") for row in rows]


def test_a_schedules_file_with_last_and_nth_days_fires_on_those_days(store: Store, db, tmp_path):
    path = tmp_path / "schedules.yaml"
    path.write_text(SCHEDULES)
    schedules = load_file(str(path))
    apply_schedules(store, schedules, now=dt.datetime(2026, 1, 1, tzinfo=UTC))
    firer, end = Firer(store, Metrics()), dt.datetime(2026, 4, 1, tzinfo=UTC)
    # tick at each next fire time (the database's clock is the `now` passed in)
    while (now := min(store.schedules.schedule_get(s.name).next_fire_at for s in schedules)) < end:
        firer.run_once(now=now)
    assert fired_local(db, "month-end") == ["Fri 01-30 18:00", "Fri 02-27 18:00", "Tue 03-31 18:00"]
    assert fired_local(db, "first-monday") == ["Mon 01-05 09:00", "Mon 02-02 09:00", "Mon 03-02 09:00"]
    assert fired_local(db, "last-friday") == ["Fri 01-30 02:30", "Fri 02-27 02:30", "Fri 03-27 02:30"]
    assert count(db, "SELECT count(*) FROM skiplock.tasks") == 9


def test_a_schedules_file_with_a_bad_day_is_refused_in_one_line(tmp_path):
    path = tmp_path / "schedules.yaml"
    path.write_text(SCHEDULES.replace("MON#1", "MON#6"))
    with pytest.raises(InvalidInput) as caught:
        load_file(str(path))
    assert str(caught.value) == (f"{path}: schedules[1] (first-monday): cron '0 9 * * MON#6': "
                                 "day-of-week 'MON#6': the week after # must be 1-5")


def test_the_api_takes_the_day_syntax_and_refuses_a_bad_one_naming_the_field(api, db):
    created = api.post("/v1/schedules", json={"name": "month-end", "kind": "k", "cron": "0 18 LW * *",
                                               "timezone": "Europe/Berlin"})
    assert created.status_code == 201, created.get_json()
    assert created.get_json()["cron"] == "0 18 LW * *"
    next_fire = dt.datetime.fromisoformat(created.get_json()["next_fire_at"].replace("Z", "+00:00"))
    local = next_fire.astimezone(BERLIN)
    assert (local.hour, local.minute, local.isoweekday() <= 5) == (18, 0, True)
    days_in_month = calendar.monthrange(local.year, local.month)[1]
    later_days = [local.date().replace(day=d) for d in range(local.day + 1, days_in_month + 1)]
    assert all(day.isoweekday() > 5 for day in later_days)  # the month's last weekday
    status, code, message = error_of(api.post("/v1/schedules", json={"name": "bad", "kind": "k",
                                                                       "cron": "0 0 32L * *"}))
    assert (status, code) == (400, "request.invalid")
    assert "cron '0 0 32L * *': day-of-month '32L' is not a number, L (last day) or LW (last weekday)" in message
    assert "\n" not in message
    assert count(db, "SELECT count(*) FROM skiplock.schedules") == 1
