"""The console's views of dependencies (Flask's test client, real Postgres): a task's page links
its parents and children, a waiting task can be cancelled, and `waiting` is a column of the
overview and a choice of the tasks page's state filter."""

from __future__ import annotations

import re

import skiplock
from tests.integration.test_console import make_app, sign_in  # noqa: F401 (fixture)


def test_a_tasks_page_links_its_parents_and_children_and_waiting_is_counted(make_app, db_url):
    client = make_app().test_client()
    sign_in(client, "admin")
    parents = [skiplock.enqueue(db_url, "export", {}) for _ in range(2)]
    report = skiplock.enqueue(db_url, "report", {}, depends_on=parents, on_parent_failure="run")

    page = client.get(f"/ui/tasks/{report}").text
    linked = re.findall(r'<dd data-field="parents">(.*?)</dd>', page, re.S)[0]
    assert re.findall(r'href="/ui/tasks/([0-9a-f-]+)"', linked) == sorted(str(p) for p in parents)
    assert '<dd data-field="on_parent_failure">run</dd>' in page
    assert '<dd data-field="waiting_on">2 parent(s)</dd>' in page
    assert 'action="/ui/tasks/%s/cancel"' % report in page
    parent_page = client.get(f"/ui/tasks/{parents[0]}").text
    linked = re.findall(r'<dd data-field="children">(.*?)</dd>', parent_page, re.S)[0]
    assert re.findall(r'href="/ui/tasks/([0-9a-f-]+)"', linked) == [str(report)]
    assert 'data-field="parents"' not in parent_page
    # a task without relatives has no such section
    plain = skiplock.enqueue(db_url, "plain", {})
    assert "Dependencies" not in client.get(f"/ui/tasks/{plain}").text

    overview = client.get("/ui/").text
    assert '<th scope="col">waiting</th>' in overview
    assert re.search(r'data-state="waiting"><a href="/ui/tasks\?queue=default&amp;state=waiting">1</a>', overview)
    tasks = client.get("/ui/tasks?state=waiting").text
    assert '<option value="waiting" selected>waiting</option>' in tasks
    assert tasks.count('<tr data-task="') == 1 and f'data-task="{report}"' in tasks
