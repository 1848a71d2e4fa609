"""The overview's throughput chart: GET /v1/queues/throughput counts the completed and failed
events per queue and minute, and the console draws them as an inline SVG whose bars and titles
carry the same numbers."""

from __future__ import annotations

import datetime as dt

import re

import skiplock
from skiplock.api.render import iso
from tests.integration.test_api import TOKENS
from tests.integration.test_console import make_app, sign_in  # noqa: F401 (make_app is a fixture)

# an outcome event at a chosen time, after the task's own events
SEED = """
INSERT INTO skiplock.task_events (task_id, seq, type, at)
SELECT id, event_seq + 1, %(type)s, %(at)s FROM skiplock.tasks WHERE id = %(id)s
"""


def _outcome(db, db_url, queue: str, kind: str, at) -> None:
    db.execute(SEED, {"id": skiplock.enqueue(db_url, "k", {}, queue=queue), "type": kind, "at": at})


def test_completions_and_failures_per_minute_in_the_api_and_the_chart(make_app, db_url, db):
    # two minutes ago (whole minutes by the database's clock), and an hour and a half ago
    minute, long_ago = db.execute("SELECT date_trunc('minute', now()) - interval '2 minutes', "
                                  "now() - interval '90 minutes'").fetchone()
    at = minute.replace(second=20)
    for kind in ("completed", "completed", "completed", "failed", "claimed"):  # 'claimed': not an outcome
        _outcome(db, db_url, "mail", kind, at)
    _outcome(db, db_url, "mail", "completed", db.execute("SELECT now()").fetchone()[0])
    _outcome(db, db_url, "old", "failed", long_ago)  # outside the window
    app = make_app()

    r = app.test_client().get("/v1/queues/throughput?minutes=60",
                              headers={"Authorization": f"Bearer {TOKENS['reader']}"})
    assert r.status_code == 200, r.text
    body = r.json
    assert body["minutes"] == 60 and [q["name"] for q in body["queues"]] == ["mail"]
    mail = body["queues"][0]
    assert (mail["completed"], mail["failed"], len(mail["per_minute"])) == (4, 1, 60)
    assert {"minute": iso(minute), "completed": 3, "failed": 1} in mail["per_minute"]
    assert sum(m["completed"] + m["failed"] for m in mail["per_minute"]) == 5
    assert app.test_client().get("/v1/queues/throughput?minutes=0", headers={
        "Authorization": f"Bearer {TOKENS['reader']}"}).status_code == 400

    client = app.test_client()
    sign_in(client, "reader")
    page = client.get("/ui/").text
    chart = re.search(r'<svg class="throughput".*?</svg>', page, re.S).group(0)
    label = "mail: 4 completed, 1 failed in the last hour"
    assert f'aria-label="{label}"' in chart and f"<title>{label}</title>" in chart
    # the y axis runs to a round number over the busiest bar (4: to 5), labelled at 0 and 5
    assert 'role="img"' in chart and 'data-peak="5"' in chart and 'data-bars="60"' in chart
    assert re.findall(r'<text class="y-tick"[^>]*>(\d+)</text>', chart) == ["0", "5"]
    # six time labels (HH:MM) along the x axis, the first at the window's first minute
    ticks = re.findall(r'<text class="x-tick"[^>]*>(\d\d:\d\d)</text>', chart)
    assert len(ticks) == 6 and ticks[0] == (minute - dt.timedelta(minutes=57)).strftime("%H:%M")
    assert len(re.findall(r'<g class="bar"', chart)) == 60
    bar = re.search(rf'<g class="bar" data-start="{iso(minute)}" data-completed="3" data-failed="1">(.*?)</g>',
                    chart, re.S)
    assert bar, chart
    # hovering the bar shows its minute and numbers
    assert f"<title>{minute:%H:%M} UTC: 3 completed, 1 failed</title>" in bar.group(1)
    # of the plot's 120 units of height: 3 of 5 completed, 1 of 5 failed on top
    assert re.search(r'class="completed" x="[\d.]+" y="54.0" width="[\d.]+" height="72.0"', bar.group(1))
    assert re.search(r'class="failed" x="[\d.]+" y="30.0" width="[\d.]+" height="24.0"', bar.group(1))
    assert chart.count('<rect class="completed"') == 2 and chart.count('<rect class="failed"') == 1
    assert "<script" not in chart

    # the last day: 48 bars of 30 minutes, the same outcomes in them
    day = client.get("/ui/?range=day").text
    chart = re.search(r'<svg class="throughput".*?</svg>', day, re.S).group(0)
    assert 'aria-label="mail: 4 completed, 1 failed in the last day"' in chart and 'data-bars="48"' in chart
    assert sum(int(n) for n in re.findall(r'<g class="bar" data-start="[^"]+" data-completed="(\d+)"', chart)) == 4
    assert client.get("/ui/?range=week").status_code == 200  # an unknown range: the last hour


def test_no_outcome_no_chart(make_app, db_url):
    client = make_app().test_client()
    sign_in(client, "reader")
    page = client.get("/ui/").text
    assert "<svg" not in page and "No task completed or failed in the last hour." in page
