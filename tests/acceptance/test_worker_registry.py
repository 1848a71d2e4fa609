"""The worker registry as an operator sees it: real `skiplock worker` processes register
themselves (host, pid, queues, concurrency, version), report their in-flight count with their
heartbeat, and leave on SIGTERM; a SIGKILLed one is removed by the scheduler once its heartbeat
is three leases old. `GET /v1/workers`, `skiplock workers list` and the scheduler's
skiplock_workers gauges show the same workers."""

from __future__ import annotations

import importlib.metadata
import json
import signal
import socket

import httpx

from tests.acceptance.test_api_process import ADMIN, start_api, wait_ready
from tests.acceptance.test_cli import skiplock
from tests.support.harness import free_port, metric, scalar, wait_exit, wait_for

VERSION = importlib.metadata.version("skiplock")
# short leases, so that heartbeats (lease / 3) come often and a dead worker goes soon
FAST = {"SKIPLOCK_LEASE_SECONDS": "3", "SKIPLOCK_HEARTBEAT_SECONDS": "0.5", "SKIPLOCK_SHUTDOWN_GRACE_SECONDS": "2"}
TASKS = "tests.support.handlers,tests.support.gated"


def _rows(db) -> dict[int, tuple]:
    """{pid: (id, host, queues, concurrency, in_flight, version)} of the registry."""
    return {r[2]: (r[0], r[1], r[3], r[4], r[5], r[6]) for r in db.execute(
        "SELECT id, host, pid, queues, concurrency, in_flight, version FROM skiplock.workers")}


def _gauges(port: int, queue: str) -> tuple[float | None, float | None]:
    return metric(port, "skiplock_workers", queue=queue), metric(port, "skiplock_workers_concurrency", queue=queue)


def test_workers_register_report_in_flight_and_leave_on_sigterm(processes, db_url, db, tmp_path):
    first = processes.spawn(db_url, "--queues", "default,reports", "--concurrency", "3", tasks=TASKS, env=FAST)
    second = processes.spawn(db_url, "--queues", "reports", "--concurrency", "2", tasks=TASKS,
                             env={**FAST, "SKIPLOCK_POD_NAME": "skiplock-worker-7d9f-x2k4p"})
    scheduler = processes.spawn(db_url, command="scheduler", env={**FAST, "SKIPLOCK_GAUGES_SECONDS": "0.2",
                                                                  "SKIPLOCK_REAPER_SECONDS": "0.2"})
    for proc in (first, second, scheduler):
        processes.wait_ready(proc)

    rows = wait_for(lambda: len(r := _rows(db)) == 2 and r, 10, message="both workers registered")
    host = socket.gethostname()
    assert rows[first.pid][1:] == (host, ["default", "reports"], 3, 0, VERSION)
    assert rows[second.pid][1:] == ("skiplock-worker-7d9f-x2k4p", ["reports"], 2, 0, VERSION)
    # the registry's id is the lease owner of the worker's claims
    assert rows[first.pid][0].split(":")[:2] == [host, str(first.pid)]

    # the scheduler's gauges count the live workers per queue, and their concurrency
    port = scheduler.metrics_port
    wait_for(lambda: _gauges(port, "reports") == (2, 5), 10, message="2 workers of concurrency 5 on reports")
    assert _gauges(port, "default") == (1, 3)

    # in flight: gated tasks hold the first worker's slots; its next heartbeat reports them
    gate = tmp_path / "gate"
    ids = [skiplock_enqueue(db_url, {"gate": str(gate)}, "default") for _ in range(2)]
    wait_for(lambda: scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE state = 'running' AND id = ANY(%s)",
                            (ids,)) == 2, 10, message="2 gated tasks running")
    wait_for(lambda: _rows(db)[first.pid][4] == 2, 5, message="in_flight = 2 in the registry")
    owner = scalar(db, "SELECT DISTINCT lease_owner FROM skiplock.tasks WHERE id = ANY(%s)", (ids,))
    assert owner == rows[first.pid][0]

    # the API and the CLI list the same workers
    api_port = free_port()
    base = f"http://127.0.0.1:{api_port}"
    api = start_api(processes, db_url, api_port)
    wait_ready(api, base)
    listed = httpx.get(f"{base}/v1/workers", headers=ADMIN, timeout=10)
    assert listed.status_code == 200, listed.text
    by_pid = {w["pid"]: w for w in listed.json()["workers"]}
    assert set(by_pid) == {first.pid, second.pid}
    assert {k: by_pid[first.pid][k] for k in ("id", "host", "queues", "concurrency", "in_flight", "version")} == \
        {"id": rows[first.pid][0], "host": host, "queues": ["default", "reports"], "concurrency": 3,
         "in_flight": 2, "version": VERSION}
    assert by_pid[first.pid]["heartbeat_age_seconds"] < 3
    assert httpx.get(f"{base}/v1/workers", timeout=10).status_code == 401
    cli_json = skiplock("workers", "list", "-o", "json", url=db_url)
    assert cli_json.returncode == 0, cli_json.stderr
    assert {w["pid"]: (w["id"], w["concurrency"]) for w in json.loads(cli_json.stdout)["workers"]} == \
        {first.pid: (rows[first.pid][0], 3), second.pid: (rows[second.pid][0], 2)}
    table = skiplock("workers", "list", url=db_url)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split()[:4] == ["ID", "HOST", "PID", "QUEUES"] and len(lines) == 3
    # aligned: every row's columns start where the header's do
    column = {name: lines[0].index(name) for name in ("HOST", "PID", "IN FLIGHT")}
    assert sorted((int(line[column["PID"]:].split()[0]), line[column["HOST"]:].split()[0],
                   int(line[column["IN FLIGHT"]:].split()[0])) for line in lines[1:]) == \
        sorted([(first.pid, host, 2), (second.pid, "skiplock-worker-7d9f-x2k4p", 0)])

    # SIGTERM: the first worker drains (the gate opens), exits 0 and takes its row with it
    first.signal(signal.SIGTERM)
    gate.touch()
    assert wait_exit(first, 15)[0] == 0
    assert set(_rows(db)) == {second.pid}
    wait_for(lambda: _gauges(port, "default") == (0, 0), 10, message="no worker on default")
    assert _gauges(port, "reports") == (1, 2)
    assert scalar(db, "SELECT count(*) FROM skiplock.tasks WHERE state = 'completed' AND id = ANY(%s)", (ids,)) == 2

    second.signal(signal.SIGTERM)
    assert wait_exit(second, 15)[0] == 0
    assert _rows(db) == {}
    assert skiplock("workers", "list", url=db_url).stdout.strip() == "no workers"


def test_a_killed_worker_is_removed_by_the_scheduler_after_three_leases(processes, db_url, db):
    worker = processes.spawn(db_url, "--queues", "mail", "--concurrency", "4", tasks=TASKS, env=FAST)
    processes.wait_ready(worker)
    wait_for(lambda: worker.pid in _rows(db), 10, message="the worker registered")
    worker.popen.kill()
    worker.wait(10)
    last_beat_age = "SELECT extract(epoch FROM now() - heartbeat_at) FROM skiplock.workers WHERE pid = %s"

    scheduler = processes.spawn(db_url, command="scheduler", env={**FAST, "SKIPLOCK_GAUGES_SECONDS": "0.2",
                                                                  "SKIPLOCK_REAPER_SECONDS": "0.2"})
    processes.wait_ready(scheduler)
    # still listed while its heartbeat is younger than three leases (9 s)
    wait_for(lambda: metric(scheduler.metrics_port, "skiplock_workers", queue="mail") == 1, 10,
             message="the dead worker still counted")
    assert worker.pid in _rows(db) and float(scalar(db, last_beat_age, (worker.pid,))) < 9

    ages = []

    def removed() -> bool:
        age = scalar(db, last_beat_age, (worker.pid,))
        if age is not None:
            ages.append(float(age))
        return age is None

    wait_for(removed, 20, interval=0.1, message="the dead worker's row removed")
    assert max(ages) >= 8.5  # not before its heartbeat was three leases old (polled every 0.1 s)
    wait_for(lambda: metric(scheduler.metrics_port, "skiplock_workers", queue="mail") == 0, 10,
             message="skiplock_workers{queue=mail} = 0")
    assert metric(scheduler.metrics_port, "skiplock_workers_removed_total") == 1
    assert "removed workers whose heartbeat stopped" in scheduler.log()


def skiplock_enqueue(db_url: str, payload: dict, queue: str):
    import skiplock as package

    return package.enqueue(db_url, "t.gated", payload, queue=queue)
