"""examples/csv_script: import_orders.py run as a subprocess on a generated CSV, a real worker,
the test's database."""

from __future__ import annotations

import sys

import pytest

from tests.examples import shop as shop_mod
from tests.support import harness

ROWS = 500


def write_orders(path, rows: int, bad: tuple[int, str] | None = None):
    """A CSV of `rows` orders for widgets; bad=(index, line) puts `line` in place of that row."""
    lines = ["reference,item,quantity"] + [f"ref-{i},widget,{i % 3 + 1}" for i in range(rows)]
    if bad is not None:
        lines[1 + bad[0]] = bad[1]
    path.write_text("\n".join(lines) + "\n")
    return path


def import_orders(db_url: str, path):
    return shop_mod.run_example("csv_script", [sys.executable, "import_orders.py", str(path)],
                                SKIPLOCK_DATABASE_URL=db_url)


def test_every_row_becomes_a_task_the_worker_runs_once_even_when_imported_twice(shop, db_url, processes, tmp_path):
    shop_mod.start_worker(processes, db_url, "csv_script")
    orders = write_orders(tmp_path / "orders.csv", ROWS)

    first = import_orders(db_url, orders)
    assert (first.returncode, first.stdout.strip()) == (0, f"{ROWS} orders queued from {orders}"), first.stderr
    assert harness.scalar(shop, "SELECT count(*) FROM skiplock.tasks WHERE kind = 'shop.import_order'") == ROWS
    harness.wait_for(lambda: shop_mod.counts(shop)["completed"] == ROWS, 120, message=f"{ROWS} imports completed")

    # the same file again, as a cron job run twice would: each row's key returns its task, none is added
    again = import_orders(db_url, orders)
    assert again.returncode == 0, again.stderr
    counts = shop_mod.counts(shop)
    assert (counts["tasks"], counts["completed"], counts["orders"]) == (ROWS, ROWS, ROWS)
    assert harness.scalar(shop, "SELECT count(DISTINCT reference) FROM orders WHERE reference LIKE 'ref-%'") == ROWS


@pytest.mark.parametrize("bad_line, message", [
    ("ref-x,widget,lots", "line 402: quantity 'lots' is not a whole number >= 1"),
    ("ref-x,widget", "line 402: 3 fields expected"),
    ("ref-x,,2", "line 402: reference and item must not be empty"),
])
def test_a_malformed_row_is_one_line_of_error_and_nothing_is_written(shop, db_url, tmp_path, bad_line, message):
    orders = write_orders(tmp_path / "orders.csv", ROWS, bad=(400, bad_line))
    result = import_orders(db_url, orders)
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.splitlines() == [f"import_orders: {orders} {message}"]
    assert harness.scalar(shop, "SELECT count(*) FROM skiplock.tasks") == 0
