"""examples/flask: a real `flask run` app on a psycopg pool, a real worker, the test's database."""

from __future__ import annotations

import sys

from tests.examples import shop as shop_mod


def test_an_order_commits_with_its_task_and_a_refused_one_leaves_neither(shop, db_url, processes, servers):
    port = servers.start([sys.executable, "-m", "flask", "--app", "app", "run", "--port", "{port}"], "flask",
                         DATABASE_URL=db_url)
    shop_mod.start_worker(processes, db_url, "flask")
    shop_mod.check_order_flow(shop, shop_mod.placed_over_http(port))
