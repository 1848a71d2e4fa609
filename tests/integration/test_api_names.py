"""How many queues and kinds API submissions may bring into existence (the real WSGI app, real
Postgres): past SKIPLOCK_API_MAX_QUEUES / _KINDS a submitter's new name is refused in one line
with nothing written, a batch whole; names that exist stay open, an admin is not bounded, and
submissions racing for the last places take exactly as many as there are."""

from __future__ import annotations

import threading

import psycopg

from tests.integration.test_api import TOKENS, count, error_of, make_api  # noqa: F401 (fixtures)
from tests.support.harness import wait_for

QUEUES = "SELECT count(DISTINCT queue) FROM skiplock.tasks"
KINDS = "SELECT count(DISTINCT kind) FROM skiplock.tasks"
TASKS = "SELECT count(*) FROM skiplock.tasks"


def submit(api, queue: str, kind: str = "k", role: str = "submitter"):
    return api.post("/v1/tasks", role=role, json={"kind": kind, "queue": queue})


def test_new_queues_and_kinds_past_the_limits_are_refused_and_known_ones_stay_open(make_api, db):
    api = make_api(api_max_queues=3, api_max_kinds=2)
    assert [submit(api, f"q{i}").status_code for i in range(5)] == [201, 201, 201, 409, 409]
    status, code, message = error_of(submit(api, "q9"))
    assert (status, code) == (409, "task.name_limit") and "\n" not in message
    assert message.startswith("queue 'q9': 3 queues exist") and "SKIPLOCK_API_MAX_QUEUES" in message
    assert (count(db, QUEUES), count(db, TASKS)) == (3, 3)
    # a queue that exists takes any number of tasks; kinds have their own bound
    assert [submit(api, "q0", kind).status_code for kind in ("k", "k2", "k3")] == [201, 201, 409]
    assert error_of(submit(api, "q0", "k3"))[2].startswith("kind 'k3': 2 kinds exist")
    # a batch that would bring one too many is refused whole
    batch = {"tasks": [{"kind": "k", "queue": "q1"}, {"kind": "k", "queue": "new"}]}
    assert api.post("/v1/tasks:batch", role="submitter", json=batch).status_code == 409
    assert (count(db, QUEUES), count(db, KINDS), count(db, TASKS)) == (3, 2, 5)
    # an admin's names are the operator's: not bounded, and counted from then on
    assert submit(api, "ops", role="admin").status_code == 201
    assert submit(api, "q4").status_code == 409
    assert count(db, QUEUES) == 4


def test_zero_means_no_limit(make_api, db):
    api = make_api(api_max_queues=0, api_max_kinds=0)
    assert [submit(api, f"q{i}", f"k{i}").status_code for i in range(5)] == [201] * 5


def test_racing_submissions_take_exactly_the_places_left(make_api, db, db_url):
    api = make_api(api_max_queues=3)
    assert submit(api, "first").status_code == 201
    racers, statuses = 6, []

    def race(i: int) -> None:
        client = api.app.test_client()  # one per thread: each its own request
        statuses.append(client.post("/v1/tasks", json={"kind": "k", "queue": f"race-{i}"},
                                    headers={"Authorization": f"Bearer {TOKENS['submitter']}"}).status_code)

    # every racer is held at its audit row, after it has decided and before it commits: each
    # would see one queue and take a place, were the decisions not made one after another
    with psycopg.connect(db_url) as blocker:
        blocker.execute("LOCK TABLE skiplock.audit_log IN EXCLUSIVE MODE")
        threads = [threading.Thread(target=race, args=(i,)) for i in range(racers)]
        for t in threads:
            t.start()
        wait_for(lambda: count(db, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                   "AND wait_event_type = 'Lock'") == racers, message="every racer waiting")
        blocker.rollback()
    for t in threads:
        t.join()
    assert sorted(statuses) == [201] * 2 + [409] * (racers - 2)
    assert count(db, QUEUES) == 3
