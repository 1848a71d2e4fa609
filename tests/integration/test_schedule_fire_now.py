"""Firing a schedule by hand (POST /v1/schedules/{name}/fire, the console's "Fire now") and its
last decisions (GET /v1/schedules/{name}/fires, the console's schedules page): one tick is one
task whoever fires it, each call is audited, and the page shows fired and skipped times with
their reasons."""

from __future__ import annotations

import datetime as dt

from skiplock.engine.metrics import Metrics
from skiplock.engine.schedule_actions import apply_schedules
from skiplock.engine.schedules import Schedule, idempotency_key
from skiplock.scheduler.firing import Firer
from tests.integration.test_api import make_api  # noqa: F401 (fixture)
from tests.integration.test_console import csrf_of, make_app, sign_in  # noqa: F401 (make_app is a fixture)

HOURLY = {"name": "digest", "kind": "mail.digest", "queue": "mail", "payload": {"to": "all"},
          "interval_seconds": 3600}


def _tasks(db, kind="mail.digest"):
    return db.execute("SELECT id::text, idempotency_key, queue, payload FROM skiplock.tasks WHERE kind = %s",
                      (kind,)).fetchall()


def test_firing_twice_in_one_tick_is_one_task_under_the_schedulers_key(make_api, db):
    api = make_api()
    assert api.post("/v1/schedules", json=HOURLY).status_code == 201
    # the current tick of an hourly schedule made now: the hour up to its first fire
    first_fire = dt.datetime.fromisoformat(api.get("/v1/schedules/digest").json["next_fire_at"])
    tick = first_fire - dt.timedelta(hours=1)

    first = api.post("/v1/schedules/digest/fire", role="submitter")
    assert first.status_code == 201, first.text
    assert first.json["created"] is True and dt.datetime.fromisoformat(first.json["nominal_at"]) == tick
    again = api.post("/v1/schedules/digest/fire", role="admin")
    assert again.status_code == 200 and again.json == {**first.json, "created": False}
    assert _tasks(db) == [(first.json["task_id"], idempotency_key("digest", tick), "mail", {"to": "all"})]

    schedule = api.get("/v1/schedules/digest").json
    assert (schedule["fires"], schedule["last_task_id"]) == (1, first.json["task_id"])
    assert schedule["next_fire_at"] == first_fire.isoformat().replace("+00:00", "Z")  # timing unchanged
    fires = api.get("/v1/schedules/digest/fires", role="reader").json["fires"]
    assert [(f["outcome"], f["task_id"], f["detail"]) for f in fires] == [
        ("fired", first.json["task_id"], "fired now by submitter-bot")]
    assert fires[0]["lag_seconds"] >= 0

    assert api.post("/v1/schedules/digest/fire", role="reader").status_code == 403
    assert api.post("/v1/schedules/nope/fire").status_code == 404
    assert api.get("/v1/schedules/nope/fires").status_code == 404
    assert db.execute("SELECT actor, action, target, outcome, detail->>'created' FROM skiplock.audit_log "
                      "WHERE action = 'schedule.fire' ORDER BY id").fetchall() == [
        ("submitter-bot", "schedule.fire", "digest", "ok", "true"),
        ("admin-bot", "schedule.fire", "digest", "ok", "false"),
        ("admin-bot", "schedule.fire", "nope", "schedule.not_found", None)]


def test_the_schedules_page_shows_fired_and_skipped_times_and_fires_now(make_app, store, db):
    app = make_app()
    admin = app.test_client()
    sign_in(admin, "admin")
    page = admin.get("/ui/schedules").text
    assert "No schedule yet." in page
    apply_schedules(store, [Schedule(name="tick", kind="k", queue="q", interval_seconds=60, overlap="skip")])
    # the scheduler fires the first time; the second finds that task still queued and skips it
    start = store.schedules.schedule_get("tick").next_fire_at
    firer = Firer(store, Metrics())
    assert firer.run_once(now=start + dt.timedelta(seconds=1)).fired == 1
    assert firer.run_once(now=start + dt.timedelta(seconds=61)).skipped == 1

    page = admin.get("/ui/schedules").text
    row = page[page.index('<tr data-schedule="tick">'):]
    row = row[:row.index("</tr>")]
    assert row.count('data-outcome="skipped"') == 1 and row.count('data-outcome="fired"') == 1
    assert row.index('data-outcome="skipped"') < row.index('data-outcome="fired"')  # newest first
    assert "the previous fire&#39;s task is still queued or running" in row
    assert 'action="/ui/schedules/tick/fire"' in row

    r = admin.post("/ui/schedules/tick/fire", data={"csrf": csrf_of(page)})
    assert r.status_code == 303
    (fired_now,) = db.execute("SELECT task_id::text FROM skiplock.schedule_fires "
                              "WHERE detail = 'fired now by admin-bot'").fetchone()
    assert r.headers["Location"] == f"/ui/schedules?fired={fired_now}"
    assert admin.post("/ui/schedules/tick/fire", data={"csrf": csrf_of(page)}).headers["Location"] == r.headers[
        "Location"]  # the same tick: the same task
    assert db.execute("SELECT count(*) FROM skiplock.tasks WHERE kind = 'k'").fetchone()[0] == 2
    assert f"/ui/tasks/{fired_now}" in admin.get(r.headers["Location"]).text

    reader = app.test_client()
    sign_in(reader, "reader")
    page = reader.get("/ui/schedules").text
    assert "Fire now" not in page and page.count("data-outcome=") == 3
    assert reader.post("/ui/schedules/tick/fire", data={"csrf": csrf_of(page)}).status_code == 403
