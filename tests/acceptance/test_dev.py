"""`skiplock dev` (what `make dev` runs), against a real Postgres: it migrates, runs every role in one
process, drains its demo workload, serves the API without auth, prints progress, and stops
cleanly on Ctrl-C; what its banner tells a user to run in a second terminal works there; its
terminal carries no Python warning, on a server or on its embedded Postgres, and no line per
webhook attempt."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import urllib.request
from pathlib import Path

from tests.support.harness import free_port, scalar, wait_exit, wait_for


def python_warnings(log: str) -> list[str]:
    """Python warnings printed into the terminal (RuntimeDirWarning, DeprecationWarning, ...)."""
    return re.findall(r"^.*\b\w*Warning\b.*$", log, re.M)


def test_dev_runs_the_demo_to_the_end_serves_the_api_and_stops_on_ctrl_c(db_url, db, processes):
    api_port = free_port()
    dev = processes.spawn(db_url, command="dev", env={"SKIPLOCK_DEV_API_PORT": api_port})

    enqueued = wait_for(lambda: re.search(r"enqueued (\d+) demo tasks", dev.log()), 60,
                        message="the demo workload enqueued")
    demo_tasks = int(enqueued.group(1))
    assert demo_tasks > 0

    def finished() -> bool:
        if not dev.alive():
            raise AssertionError(f"skiplock dev exited early:\n{dev.log()[-3000:]}")
        return scalar(db, "SELECT count(*) FILTER (WHERE state IN ('completed', 'failed')) >= %s "
                          "AND count(*) FILTER (WHERE state IN ('queued', 'running')) = 0 "
                          "FROM skiplock.tasks WHERE kind LIKE 'demo.%%'", (demo_tasks,))

    wait_for(finished, 90, interval=0.5, message=f"{demo_tasks} demo tasks finished")
    # demo.refund fails for good at its first attempt, so the console's failed view has a task from the
    # start; demo.flaky fails half its attempts on purpose: one may spend all five (1 in 32); nothing else fails
    failed = db.execute("SELECT kind, attempts, last_error FROM skiplock.tasks WHERE state = 'failed'").fetchall()
    refunds = [row for row in failed if row[0] == "demo.refund"]
    assert len(refunds) == 1 and refunds[0][1] == 1 and "refused" in refunds[0][2], failed
    assert all(kind == "demo.flaky" and attempts == 5 and "503" in error for kind, attempts, error in failed
               if kind != "demo.refund"), failed
    # the progress line shows the drained workload
    wait_for(lambda: re.search(r"\[skiplock dev\] queued 0 · running 0 · completed \d+", dev.log()), 10,
             message="a progress line with nothing left")

    # the API answers without a token (dev runs it with auth disabled)
    with urllib.request.urlopen(f"http://127.0.0.1:{api_port}/v1/tasks?limit=5", timeout=5) as response:
        assert response.status == 200
        page = json.loads(response.read())
    assert len(page["tasks"]) == 5
    # the worker claims on a connection of its own, as `skiplock worker` does
    assert scalar(db, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                      "AND application_name = 'skiplock-dev-claims'") == 1

    dev.signal(signal.SIGINT)
    code, _ = wait_exit(dev, 40)
    assert code == 0, dev.log()[-3000:]
    assert '"worker stopped"' in dev.log()
    assert python_warnings(dev.log()) == []


def test_the_embedded_postgres_starts_without_a_warning(processes, tmp_path):
    """No SKIPLOCK_DATABASE_URL: dev starts pgserver's Postgres under ./.skiplock, here with no
    XDG_RUNTIME_DIR (a container's or an ssh session's environment), and its banner is clean."""
    dev = processes.spawn("", "--no-demo", command="dev", cwd=tmp_path,
                          env={"XDG_RUNTIME_DIR": "", "SKIPLOCK_DEV_API_PORT": 0})
    try:
        wait_for(lambda: '"worker started"' in dev.log() or not dev.alive(), 120,
                 message="dev on its embedded Postgres")
        log = dev.log()
        assert "starting embedded Postgres in .skiplock/pgdata/" in log, log[-3000:]
        assert re.search(r"^\[skiplock dev\] database postgresql://\S*host=\S*\.skiplock/pgdata", log, re.M), log
        assert python_warnings(log) == [], log[-3000:]
    finally:
        dev.signal(signal.SIGINT)  # dev stops its Postgres on the way out
        code, _ = wait_exit(dev, 60)
    assert code == 0, dev.log()[-3000:]
    assert python_warnings(dev.log()) == []


def second_terminal(banner: str) -> list[str]:
    """The indented lines under "in another terminal:", as printed."""
    block = re.search(r"^\[skiplock dev\] in another terminal:\n((?:    .*\n)+)", banner, re.M)
    assert block, banner[-3000:]
    return [line[4:] for line in block.group(1).splitlines()]


def shell(tmp_path: Path, *lines: str) -> subprocess.CompletedProcess:
    """`lines` pasted into a new terminal: bash with the PATH dev had, none of the test run's
    SKIPLOCK_* variables, in a directory of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKIPLOCK_") and k != "PYTHONPATH"}
    return subprocess.run(["bash", "-e", "-c", "\n".join(lines)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60)


def test_the_banner_commands_work_in_a_second_terminal(db_url, db, processes, receiver, tmp_path):
    # a receiver that always fails uses all 4 attempts within seconds
    dev = processes.spawn(db_url, "--no-demo", command="dev", env={
        "SKIPLOCK_DEV_API_PORT": 0, "SKIPLOCK_WEBHOOK_MAX_ATTEMPTS": 4,
        "SKIPLOCK_WEBHOOK_RETRY_BASE_SECONDS": 0.05, "SKIPLOCK_WEBHOOK_RETRY_CAP_SECONDS": 0.2})
    export, enqueue, curl = wait_for(lambda: re.search(r"in another terminal:\n(    .*\n){3}", dev.log())
                                     and second_terminal(dev.log()), 60, message="the banner")
    assert export.startswith("export SKIPLOCK_DATABASE_URL=") and curl.startswith("curl ")
    program, _, rest = enqueue.partition(" enqueue ")
    assert rest.startswith("demo.hello --payload ") and program.endswith("skiplock"), enqueue
    api_url = re.search(r"^\[skiplock dev\] api +(http://127\.0\.0\.1:\d+/v1/) ", dev.log(), re.M).group(1)

    # the printed enqueue, run with the printed export, lands in dev's database and dev runs it
    done = shell(tmp_path, export, enqueue)
    assert done.returncode == 0, done.stderr
    task_id = done.stdout.strip()
    assert scalar(db, "SELECT payload FROM skiplock.tasks WHERE id = %s", (task_id,)) == {"name": "you"}
    wait_for(lambda: scalar(db, "SELECT state FROM skiplock.tasks WHERE id = %s", (task_id,)) == "completed", 30,
             message="the enqueued task completed by dev's worker")

    # the printed curl lists it (curl itself if this machine has it, else the same URL)
    if shutil.which("curl"):
        listed = shell(tmp_path, curl)
        assert listed.returncode == 0, listed.stderr
        tasks = json.loads(listed.stdout)["tasks"]
    else:
        url = re.fullmatch(r"curl '([^']+)'", curl).group(1)
        tasks = json.loads(urllib.request.urlopen(url, timeout=5).read())["tasks"]
    assert [t["id"] for t in tasks] == [task_id]

    # the printed API URL answers
    with urllib.request.urlopen(api_url, timeout=5) as response:
        assert response.status == 200
        index = json.loads(response.read())
    assert index["name"] == "skiplock" and index["links"]["tasks"] == "/v1/tasks"
    # and the printed console URL shows the console, saying it has no authentication
    console_url = re.search(r"^\[skiplock dev\] console +(http://127\.0\.0\.1:\d+/ui/) ", dev.log(), re.M).group(1)
    with urllib.request.urlopen(console_url, timeout=5) as response:
        assert response.status == 200 and "No authentication" in response.read().decode()

    # a webhook receiver on this machine, added from the second terminal, gets dev's deliveries
    receiver.expect_request("/hook", method="POST").respond_with_data("ok")
    receiver.expect_request("/down", method="POST").respond_with_data("down", status=500)
    for path in ("hook", "down"):
        added = shell(tmp_path, export, f"{program} webhooks add http://127.0.0.1:{receiver.port}/{path} "
                                        "--events task.completed")
        assert added.returncode == 0, added.stderr
        assert added.stdout.startswith("id: ")
    second = shell(tmp_path, export, enqueue)
    assert second.returncode == 0, second.stderr
    second_id = second.stdout.strip()

    def delivered() -> list:
        return [json.loads(request.get_data()) for request, _ in receiver.log if request.path == "/hook"]

    bodies = wait_for(delivered, 30, message="a delivery to the local receiver")
    assert len(bodies) == 1 and second_id in json.dumps(bodies[0]), bodies
    assert "task.completed" in json.dumps(bodies[0])
    wait_for(lambda: scalar(db, "SELECT count(*) FROM skiplock.webhook_deliveries WHERE state = 'delivered'") == 1,
             10, message="the delivery recorded as delivered")
    wait_for(lambda: scalar(db, "SELECT attempts FROM skiplock.webhook_deliveries WHERE state = 'dead'") == 4,
             30, message="the failing receiver's delivery dead after 4 attempts")
    # 5 attempts, and the terminal has one line for them: the dead letter (the rest is at DEBUG),
    # and the progress line counts them
    attempt_lines = re.findall(r'"msg": "delivery (\w+)"', dev.log())
    assert attempt_lines == ["dead"], attempt_lines
    wait_for(lambda: re.search(r"^\[skiplock dev\] .* · webhooks delivered 1, retried 3, dead 1$", dev.log(), re.M),
             10, message="the progress line's webhook counts")
    assert python_warnings(dev.log()) == []

    dev.signal(signal.SIGINT)
    code, _ = wait_exit(dev, 40)
    assert code == 0, dev.log()[-3000:]
