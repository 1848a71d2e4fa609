"""Reads on a replica (SKIPLOCK_READ_DATABASE_URL): `skiplock api` with a streaming standby made
by pg_basebackup. Both servers log every statement with its application_name (the API's primary
pool is `skiplock-api`, its replica pool `skiplock-api-read`), so the test reads from the servers
themselves which one ran what.

- The listings, a task and its events, the queues, schedules and workers, and the console's pages
  run on the standby; the primary runs none of those reads (only the lag check's WAL position).
- With the standby's replay paused (its copy visibly behind): a submission answers with its task,
  an Idempotency-Key replay finds its task, cancel answers the cancelled task, a read with
  `Skiplock-Read-From: primary` finds it, and the console's page after its own cancel shows the
  cancel, all from the primary, while a plain read of the replica does not see them yet.
- An API whose SKIPLOCK_READ_MAX_LAG_SECONDS is short sends those reads to the primary once the
  paused standby is further behind than that, and reports the lag.
- The standby stopped: writes still work, reads fall back to the primary (no error), /readyz is
  200; started again, reads go back to it by themselves.
- The primary stopped: /readyz is 503 on both ports, whatever the replica.

The clusters are the test's own (ThrowawayCluster): the session's server is never touched."""

from __future__ import annotations

import time

import httpx
import psycopg
import pytest

import skiplock
from skiplock.api.replica import DOWN_SECONDS
from skiplock.engine import migrate
from tests.integration.test_api import CONSOLE_SESSION_KEY, TOKEN_CONFIG, TOKENS
from tests.integration.test_console import csrf_of
from tests.pgcluster import ThrowawayCluster
from tests.support.harness import free_port, http_status, metric, scalar, wait_for

ADMIN = {"Authorization": f"Bearer {TOKENS['admin']}"}
PRIMARY = {"Skiplock-Read-From": "primary"}
# every statement in the server's log, after the name of the connection that sent it
LOGGED = {"log_statement": "all", "log_line_prefix": "%a|"}
READS = 20
SHORT_LAG = 2.0


@pytest.fixture
def pair():
    primary = ThrowawayCluster(settings=LOGGED)
    standby = None
    try:
        primary.start()
        standby = primary.standby()
        yield primary, standby
    finally:
        if standby is not None:
            standby.cleanup()
        primary.cleanup()


class ServerLog:
    """The statements a cluster logged since `mark()`, by application_name."""

    def __init__(self, cluster: ThrowawayCluster):
        self.path = cluster.log_path
        self.offset = 0

    def mark(self) -> None:
        self.offset = self.path.stat().st_size

    def statements(self, application: str) -> list[str]:
        with open(self.path, "rb") as log:
            log.seek(self.offset)
            lines = log.read().decode(errors="replace").splitlines()
        prefix = f"{application}|LOG:  "
        return [line[len(prefix):] for line in lines if line.startswith(prefix)
                and (" execute " in line or "statement: " in line)]

    def reads_of_tasks(self, application: str) -> int:
        """Statements that read skiplock's tasks or their events."""
        return sum(1 for s in self.statements(application)
                   if "FROM skiplock.tasks" in s or "FROM skiplock.task_events" in s)


def _api(processes, url: str, replica_url: str, max_lag: float):
    port = free_port()
    proc = processes.spawn(url, "--bind", f"127.0.0.1:{port}", "--workers", "1", command="api",
                           env={"SKIPLOCK_API_TOKENS": TOKEN_CONFIG, "SKIPLOCK_LOG_FORMAT": "text",
                                "SKIPLOCK_CONSOLE_SESSION_KEY": CONSOLE_SESSION_KEY,
                                "SKIPLOCK_READ_DATABASE_URL": replica_url, "SKIPLOCK_READ_MAX_LAG_SECONDS": max_lag})
    return proc, port


def _wait_replayed(primary: ThrowawayCluster, standby: ThrowawayCluster) -> None:
    """Until the standby has replayed everything the primary has written so far."""
    with psycopg.connect(primary.url, autocommit=True) as conn:
        written = scalar(conn, "SELECT pg_current_wal_insert_lsn()::text")
    with psycopg.connect(standby.url, autocommit=True) as conn:
        wait_for(lambda: scalar(conn, "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (written,)), 10,
                 message="the standby replayed the primary's writes")


def _ready(port: int) -> int:
    try:
        return http_status(port, "/readyz")
    except OSError:
        return 0


def _sign_in(client: httpx.Client) -> None:
    page = client.get("/ui/login")
    r = client.post("/ui/login", data={"token": TOKENS["admin"], "csrf": csrf_of(page.text)})
    assert r.status_code == 303, r.text


def test_reads_go_to_a_streaming_standby_and_writes_stay_on_the_primary(pair, processes):
    primary, standby = pair
    migrate.apply(primary.url)
    ids = [str(skiplock.enqueue(primary.url, "replica.seen", {"n": n})) for n in range(3)]
    _wait_replayed(primary, standby)

    api, port = _api(processes, primary.url, standby.url, max_lag=60)
    short, short_port = _api(processes, primary.url, standby.url, max_lag=SHORT_LAG)
    for proc in (api, short):
        processes.wait_ready(proc, timeout=30)
    primary_log, standby_log = ServerLog(primary), ServerLog(standby)
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=ADMIN, timeout=10)
    console = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10)
    _sign_in(console)

    # -- reads: on the standby, none on the primary
    primary_log.mark(), standby_log.mark()
    for _ in range(READS):
        listing = client.get("/v1/tasks")
        assert listing.status_code == 200 and len(listing.json()["tasks"]) == 3, listing.text
    for task_id in ids:
        assert client.get(f"/v1/tasks/{task_id}").status_code == 200
        assert client.get(f"/v1/tasks/{task_id}/events").status_code == 200
    for path in ("/v1/queues", "/v1/queues/throughput", "/v1/schedules", "/v1/workers", "/v1/webhooks",
                 "/v1/deliveries"):
        assert client.get(path).status_code == 200, path
    for page in ("/ui/", "/ui/tasks", f"/ui/tasks/{ids[0]}", "/ui/schedules", "/ui/workers"):
        assert console.get(page).status_code == 200, page
    on_standby = standby_log.reads_of_tasks("skiplock-api-read")
    on_primary = [s for s in primary_log.statements("skiplock-api") if "skiplock." in s]
    print(f"reads of tasks on the standby: {on_standby}; statements on skiplock's tables on the primary: "
          f"{len(on_primary)}")
    # the listings, the tasks and their events, the overview's and the console's reads of them
    assert on_standby >= READS + 2 * len(ids) + 4, on_standby
    assert on_primary == [], on_primary[:5]
    assert metric(api.metrics_port, "skiplock_api_reads_total", database="replica", reason="ok") >= READS

    # -- the replica frozen: the caller's own writes are read on the primary
    with psycopg.connect(standby.url, autocommit=True) as conn:
        conn.execute("SELECT pg_wal_replay_pause()")
        wait_for(lambda: scalar(conn, "SELECT pg_get_wal_replay_pause_state()") == "paused", 10,
                 message="replay paused")
    primary_log.mark()
    submitted = client.post("/v1/tasks", json={"kind": "replica.new", "payload": {"n": 9}})
    assert submitted.status_code == 201 and submitted.json()["state"] == "queued", submitted.text
    new_id = submitted.json()["id"]
    assert client.get(f"/v1/tasks/{new_id}").status_code == 404  # the replica is behind: proof of where reads go
    assert client.get(f"/v1/tasks/{new_id}", headers=PRIMARY).json()["id"] == new_id
    keyed = [client.post("/v1/tasks", json={"kind": "replica.keyed"}, headers={"Idempotency-Key": "once"})
             for _ in range(2)]
    assert [r.status_code for r in keyed] == [201, 200] and keyed[0].json()["id"] == keyed[1].json()["id"]
    cancelled = client.post(f"/v1/tasks/{new_id}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled", cancelled.text
    page = console.get(f"/ui/tasks/{ids[0]}")
    acted = console.post(f"/ui/tasks/{ids[0]}/cancel", data={"csrf": csrf_of(page.text)})
    assert acted.status_code == 303, acted.text
    after = console.get(acted.headers["Location"])
    assert 'data-field="state">cancelled<' in after.text  # the console's own write, read on the primary
    assert client.get(f"/v1/tasks/{ids[0]}").json()["state"] == "queued"  # what the replica still holds
    assert client.get(f"/v1/tasks/{new_id}").status_code == 404
    on_primary = primary_log.statements("skiplock-api")
    assert sum(1 for s in on_primary if "INSERT INTO skiplock.tasks" in s) == 3  # the replay inserts too, in vain
    assert sum(1 for s in on_primary if "pg_current_xact_id()" in s) == 2  # the key's lookup (task_submitted)
    assert metric(api.metrics_port, "skiplock_api_reads_total", database="primary", reason="requested") == 1
    assert metric(api.metrics_port, "skiplock_api_reads_total", database="primary", reason="not_replayed") >= 1

    # -- lagging past SKIPLOCK_READ_MAX_LAG_SECONDS: the short API's reads go to the primary
    frozen = time.monotonic()
    with httpx.Client(base_url=f"http://127.0.0.1:{short_port}", headers=ADMIN, timeout=10) as lagging:
        wait_for(lambda: lagging.get(f"/v1/tasks/{new_id}").status_code == 200, SHORT_LAG + 15,
                 message="reads on the primary once the replica lags")
    switched = round(time.monotonic() - frozen, 1)
    lag = metric(short.metrics_port, "skiplock_api_replica_lag_seconds")
    print(f"replay paused: the short API read on the primary after {switched} s, lag {lag:.1f} s")
    assert lag > SHORT_LAG
    assert metric(short.metrics_port, "skiplock_api_reads_total", database="primary", reason="lagging") >= 1
    assert client.get(f"/v1/tasks/{new_id}").status_code == 404  # the other API's bound is 60 s

    with psycopg.connect(standby.url, autocommit=True) as conn:
        conn.execute("SELECT pg_wal_replay_resume()")
    wait_for(lambda: client.get(f"/v1/tasks/{new_id}").status_code == 200, 10, message="the replica caught up")

    # -- the standby stopped: writes work, reads fall back to the primary, the API stays ready
    standby.stop("fast")
    stopped = time.monotonic()
    primary_log.mark()
    assert client.post("/v1/tasks", json={"kind": "replica.down"}).status_code == 201
    statuses = [client.get("/v1/tasks").status_code for _ in range(5)]
    fallback = round(time.monotonic() - stopped, 2)
    assert statuses == [200] * 5, statuses
    assert (_ready(port), _ready(api.metrics_port)) == (200, 200)
    assert primary_log.reads_of_tasks("skiplock-api") >= 5  # the reads ran on the primary
    assert metric(api.metrics_port, "skiplock_api_reads_total", database="primary", reason="unreachable") >= 1

    standby.start()
    standby_log.mark()
    restarted = time.monotonic()
    wait_for(lambda: client.get("/v1/tasks").status_code == 200 and standby_log.reads_of_tasks("skiplock-api-read") > 0,
             3 * DOWN_SECONDS + 10, interval=0.2, message="reads back on the standby")
    back = round(time.monotonic() - restarted, 1)
    print(f"standby stopped: 1 write and 5 reads answered in {fallback} s; reads back on it {back} s after "
          "it started again")

    # -- the primary stopped: not ready, whatever the replica
    primary.stop("immediate")
    for probe in (port, api.metrics_port):
        wait_for(lambda: _ready(probe) == 503, 15, message=f"/readyz 503 on {probe}")
    client.close(), console.close()
