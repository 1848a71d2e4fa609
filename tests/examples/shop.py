"""What the recipes' tests share: the example shop's tables and what is in them, a worker that
imports an example's tasks module, an example's app run as a real server, and the order flow
every recipe must pass."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

from tests.support import harness

EXAMPLES = harness.ROOT / "examples"
STOCK = 5  # widgets in stock when a test starts


def create_shop(db) -> None:
    """The shop's tables (examples/shop.sql) and its stock, on an autocommit connection."""
    db.execute((EXAMPLES / "shop.sql").read_text())
    stock_widgets(db)


def stock_widgets(db) -> None:
    db.execute("INSERT INTO stock (item, available) VALUES ('widget', %s)", (STOCK,))


def counts(db) -> dict[str, int]:
    return {
        "orders": harness.scalar(db, "SELECT count(*) FROM orders"),
        "receipts": harness.scalar(db, "SELECT count(*) FROM orders WHERE receipt_sent_at IS NOT NULL"),
        "tasks": harness.scalar(db, "SELECT count(*) FROM skiplock.tasks"),
        "completed": harness.scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE state = 'completed'"),
        "stock": harness.scalar(db, "SELECT available FROM stock WHERE item = 'widget'"),
    }


def example_path(example: str) -> str:
    """PYTHONPATH for a process running `example`: its directory (where its modules are, as the
    current directory is for a user running it there), then the repository (the test support)."""
    return os.pathsep.join(filter(None, [str(EXAMPLES / example), str(harness.ROOT), os.environ.get("PYTHONPATH")]))


def start_worker(processes, db_url: str, example: str, tasks: str = "tasks"):
    """A real `skiplock worker` with SKIPLOCK_TASKS naming the example's tasks module."""
    proc = processes.spawn(db_url, tasks=tasks, env={"PYTHONPATH": example_path(example)})
    processes.wait_ready(proc)
    return proc


def run_example(example: str, argv: list[str], **env: str) -> subprocess.CompletedProcess:
    """Runs argv to its end in the example's directory, as a user would there; output captured."""
    return subprocess.run(argv, cwd=EXAMPLES / example, capture_output=True, text=True, timeout=120,
                          env=harness.child_environment(PYTHONPATH=example_path(example), **env))


class AppServers:
    """Runs example apps as their users would (`flask run`, `uvicorn`, `manage.py runserver`) on a
    free port, and kills them when the test ends."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.procs: list[tuple[subprocess.Popen, Path]] = []

    def start(self, argv: list[str], example: str, **env: str) -> int:
        """Starts argv ('{port}' in it replaced) in the example's directory; returns the port once
        the server accepts connections."""
        port = harness.free_port()
        log_path = self.logdir / f"{example}-{len(self.procs)}.log"
        with open(log_path, "wb") as out:
            popen = subprocess.Popen([arg.replace("{port}", str(port)) for arg in argv], cwd=EXAMPLES / example,
                                     env=harness.child_environment(PYTHONPATH=example_path(example), **env),
                                     stdout=out, stderr=subprocess.STDOUT)
        self.procs.append((popen, log_path))

        def accepting():
            if popen.poll() is not None:
                raise AssertionError(f"{argv[:3]} exited ({popen.returncode}):\n{log_path.read_text()[-3000:]}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return True
            except OSError:
                return False

        harness.wait_for(accepting, 60, message=f"the {example} app on port {port}")
        return port

    def stop_all(self) -> None:
        for popen, _ in self.procs:
            if popen.poll() is None:
                popen.kill()
                popen.wait(10)


def post_json(port: int, path: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def placed_over_http(port: int):
    """place(quantity) for check_order_flow through the app's POST /orders: the task id of a 201,
    None for a 409 (not enough in stock)."""
    def place(quantity: int):
        status, body = post_json(port, "/orders", {"item": "widget", "quantity": quantity})
        assert status in (201, 409), (status, body)
        return body["task_id"] if status == 201 else None
    return place


def check_order_flow(db, place) -> None:
    """The recipe's promise, with a worker running: an order refused after its enqueue (more than
    the stock) leaves neither the order nor its task; a placed order leaves one order and exactly
    one task, which the worker runs (the receipt is marked sent)."""
    assert place(STOCK + 1) is None
    assert counts(db) == {"orders": 0, "receipts": 0, "tasks": 0, "completed": 0, "stock": STOCK}

    task_id = place(2)
    assert task_id is not None
    # committed before the app answered: the order and its task are there as soon as it returns
    assert harness.scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE id = %s", (task_id,)) == 1
    harness.wait_for(lambda: counts(db)["completed"] == 1, message="the receipt task completed")
    assert counts(db) == {"orders": 1, "receipts": 1, "tasks": 1, "completed": 1, "stock": STOCK - 2}
    order_id = harness.scalar(db, "SELECT id FROM orders")
    row = db.execute("SELECT id::text, kind, result FROM skiplock.tasks").fetchone()
    assert row == (str(task_id), "shop.send_receipt", {"order_id": order_id})
