"""Import orders from a CSV file as skiplock tasks: all rows or none.

    SKIPLOCK_DATABASE_URL=postgresql://localhost/shop python import_orders.py orders.csv

The file has the columns reference, item, quantity. Every row is checked before anything is
written: a bad row is reported as `orders.csv line 7: ...` and nothing is enqueued (exit 1).
Then skiplock.enqueue_many writes one task per row in one statement and one transaction.

Each task's idempotency key is its row's reference, so the script may run again on the same file
(from cron, after a failure, twice by mistake): a row queued before keeps its task, and only new
rows get one.
"""

from __future__ import annotations

import csv
import os
import sys

import skiplock
from skiplock import SkiplockError

COLUMNS = ("reference", "item", "quantity")


class BadFile(Exception):
    """The file, or a row of it, is not an order list: the message says where."""


def read_orders(path: str) -> list[dict]:
    orders = []
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise BadFile(f"{path}: no column {', '.join(missing)} (the header needs {', '.join(COLUMNS)})")
        for row in reader:
            where = f"{path} line {reader.line_num}"
            if None in row or None in row.values():
                raise BadFile(f"{where}: {len(COLUMNS)} fields expected")
            reference, item, quantity = (row[c].strip() for c in COLUMNS)
            if not reference or not item:
                raise BadFile(f"{where}: reference and item must not be empty")
            if not quantity.isdigit() or int(quantity) < 1:
                raise BadFile(f"{where}: quantity {quantity!r} is not a whole number >= 1")
            orders.append({"reference": reference, "item": item, "quantity": int(quantity)})
    return orders


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: import_orders.py FILE.csv (SKIPLOCK_DATABASE_URL names the database)", file=sys.stderr)
        return 2
    url = os.environ.get("SKIPLOCK_DATABASE_URL")
    if not url:
        print("import_orders: SKIPLOCK_DATABASE_URL is not set", file=sys.stderr)
        return 2
    try:
        orders = read_orders(argv[1])
        ids = skiplock.enqueue_many(url, "shop.import_order", orders,
                                    idempotency_keys=[f"order-import:{o['reference']}" for o in orders])
    except (BadFile, OSError, SkiplockError) as exc:
        print(f"import_orders: {exc}", file=sys.stderr)
        return 1
    print(f"{len(ids)} orders queued from {argv[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
