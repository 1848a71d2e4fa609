"""The console's flow-control views through Flask's test client on a real database: the Limits
page lists each limit with what it holds back after real claims, the overview shows each queue's
throttled count, and a task's page its concurrency key (none when it has none)."""

from __future__ import annotations

import re

import skiplock
from skiplock.engine.limits import Limit
from tests.integration.test_console import make_app, sign_in  # noqa: F401 (fixtures)


def test_limits_page_throttled_counts_and_the_concurrency_key(make_app, db_url, store):
    client = make_app().test_client()
    sign_in(client, "reader")
    assert "No limit is set." in client.get("/ui/limits").text
    store.limits.limit_upsert(Limit.build("mail.send", concurrency=1, rate="10/s", burst=2))
    keyed = [skiplock.enqueue(db_url, "mail.send", {}, queue="mail", concurrency_key=key) for key in ("a", "a", "a")]
    plain = skiplock.enqueue(db_url, "other", {}, queue="mail")
    store.tasks.task_claim(["mail"], 10, "w-1", 60)
    assert len(store.tasks.task_claim_limited(["mail"], 10, "w-1", 60)) == 1

    page = client.get("/ui/limits")
    assert page.status_code == 200
    row = re.search(r'<tr data-limit="mail.send">(.*?)</tr>', page.text, re.S).group(1)
    fields = dict(re.findall(r'data-field="(\w+)">(?:<a [^>]*>)?([^<]*)<', row))
    assert fields == {"concurrency": "1", "rate": "10/s", "burst": "2", "throttled": "2", "running": "1",
                      "busy_groups": "1", "saturation": "100 %", "tokens": fields["tokens"]}
    assert 0 <= float(fields["tokens"]) <= 2
    overview = client.get("/ui/").text
    queue = re.search(r'<tr data-queue="mail">(.*?)</tr>', overview, re.S).group(1)
    assert re.search(r'data-field="throttled"><a href="/ui/limits">2</a>', queue)
    assert 'data-field="concurrency_key"><a href="/ui/limits">a</a>' in client.get(f"/ui/tasks/{keyed[0]}").text
    assert "concurrency key" not in client.get(f"/ui/tasks/{plain}").text
    assert re.search(r'<a href="/ui/limits"[^>]*>Limits</a>', page.text)
