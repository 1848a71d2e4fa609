"""examples/django: the shop migrated by `manage.py migrate`, served by a real `manage.py runserver`
(URLconf, middleware, Django's own psycopg connection), a real worker, the test's database."""

from __future__ import annotations

import sys

from tests.examples import shop as shop_mod


def test_an_order_commits_with_its_task_and_a_refused_one_leaves_neither(db, db_url, processes, servers):
    migrated = shop_mod.run_example("django", [sys.executable, "manage.py", "migrate", "--no-input"],
                                    DATABASE_URL=db_url)
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    shop_mod.stock_widgets(db)
    port = servers.start([sys.executable, "manage.py", "runserver", "--noreload", "127.0.0.1:{port}"], "django",
                         DATABASE_URL=db_url)
    shop_mod.start_worker(processes, db_url, "django", tasks="orders.tasks")
    shop_mod.check_order_flow(db, shop_mod.placed_over_http(port))
