"""examples/fastapi: a real uvicorn serving the app (async pool, dependency-managed transaction,
skiplock.enqueue_async), a real worker, the test's database."""

from __future__ import annotations

import sys

from tests.examples import shop as shop_mod


def test_an_order_commits_with_its_task_and_a_refused_one_leaves_neither(shop, db_url, processes, servers):
    port = servers.start([sys.executable, "-m", "uvicorn", "app:app", "--port", "{port}"], "fastapi",
                         DATABASE_URL=db_url)
    shop_mod.start_worker(processes, db_url, "fastapi")
    shop_mod.check_order_flow(shop, shop_mod.placed_over_http(port))
