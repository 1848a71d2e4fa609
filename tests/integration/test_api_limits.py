"""Flow control through the HTTP API (the real WSGI app, real Postgres): /v1/limits set, read,
list with what each limit holds back after real claims, and delete, each change with its audit
row; bad input as a one-line 400 naming the field with nothing written; roles (a reader reads, a
submitter cannot set); concurrency_key on submitted tasks, single and batch, shown in the task
view; and the queue view's throttled count."""

from __future__ import annotations

import pytest

from tests.integration.test_api import api, audit_rows, count, error_of, make_api  # noqa: F401 (fixtures)

LIMITS = "SELECT count(*) FROM skiplock.limits"


def claim_all(store, queue: str = "default") -> int:
    """Claims as a worker makes them, until nothing more is claimable: the free claim parks the
    limited kinds' tasks, the limited claim leases what their groups allow. Returns the leased count."""
    leased = 0
    while True:
        got = len(store.tasks.task_claim([queue], 50, "w-1", 60)) + \
            len(store.tasks.task_claim_limited([queue], 50, "w-1", 60))
        if not got:
            return leased
        leased += got


def test_set_read_list_and_delete_a_limit_with_audit_rows(api, db, store):
    r = api.request("PUT", "/v1/limits/mail.send", json={"concurrency": 2})
    assert r.status_code == 201, r.get_json()
    assert r.headers["Location"] == "/v1/limits/mail.send"
    body = r.get_json()
    assert {k: body[k] for k in ("kind", "concurrency", "rate", "burst", "throttled", "running")} == \
        {"kind": "mail.send", "concurrency": 2, "rate": None, "burst": None, "throttled": 0, "running": 0}
    again = api.request("PUT", "/v1/limits/mail.send", json={"concurrency": 2})
    assert again.status_code == 200
    changed = api.request("PUT", "/v1/limits/mail.send", json={"concurrency": 1, "rate": "20/s", "burst": 5})
    assert changed.status_code == 200
    assert {k: changed.get_json()[k] for k in ("concurrency", "rate", "rate_per_second", "burst")} == \
        {"concurrency": 1, "rate": "20/s", "rate_per_second": 20.0, "burst": 5}
    assert api.request("PUT", "/v1/limits/report.build", json={"rate": "30/m"}).get_json()["burst"] == 1

    # 3 tasks with key a, 2 with key b, 1 without: concurrency 1 per key leases one of each
    for key in ("a", "a", "a", "b", "b", None):
        assert api.post("/v1/tasks", json={"kind": "mail.send", "concurrency_key": key}).status_code == 201
    assert claim_all(store) == 3
    listed = api.get("/v1/limits", role="reader").get_json()["limits"]
    assert [item["kind"] for item in listed] == ["mail.send", "report.build"]
    mail = listed[0]
    assert (mail["throttled"], mail["running"], mail["busy_groups"], mail["saturation"]) == (3, 3, 3, 1.0)
    assert 0 <= mail["tokens"] <= 5
    assert listed[1]["saturation"] is None and listed[1]["throttled"] == 0
    one = api.get("/v1/limits/mail.send", role="reader").get_json()
    # the bucket refills between the two reads: every field but the tokens is the same
    assert {**one, "tokens": None} == {**mail, "tokens": None} and one["tokens"] >= mail["tokens"]
    queue = api.get("/v1/queues", role="reader").get_json()["queues"][0]
    assert (queue["name"], queue["throttled"], queue["tasks"]["running"]) == ("default", 3, 3)

    assert api.request("DELETE", "/v1/limits/report.build").status_code == 204
    assert error_of(api.get("/v1/limits/report.build")) == (404, "limit.not_found", "no limit for kind 'report.build'")
    gone = api.request("DELETE", "/v1/limits/report.build")
    assert error_of(gone)[:2] == (404, "limit.not_found")
    assert count(db, LIMITS) == 1
    assert audit_rows(db) == [
        ("admin-bot", "limit.set", "mail.send", "ok"), ("admin-bot", "limit.set", "mail.send", "ok"),
        ("admin-bot", "limit.set", "mail.send", "ok"), ("admin-bot", "limit.set", "report.build", "ok"),
        *[("admin-bot", "task.submit", t, "ok") for (t,) in db.execute(
            "SELECT id::text FROM skiplock.tasks ORDER BY id").fetchall()],
        ("admin-bot", "limit.delete", "report.build", "ok"), ("admin-bot", "limit.delete", "report.build",
                                                               "limit.not_found")]
    details = [d for (d,) in db.execute("SELECT detail FROM skiplock.audit_log WHERE action = 'limit.set' "
                                        "ORDER BY id").fetchall()]
    assert [d["change"] for d in details] == ["created", "unchanged", "updated", "created"]
    assert details[2] == {"change": "updated", "concurrency": 1, "rate": "20/s", "burst": 5}


@pytest.mark.parametrize("body,field", [
    ({"concurrency": 0}, "concurrency"),
    ({"concurrency": -3}, "concurrency"),
    ({"rate": "0/s"}, "rate"),
    ({"rate": "lots"}, "rate"),
    ({"rate": "5/0s"}, "rate"),
    ({"burst": 4}, "burst"),
    ({"rate": "10/s", "burst": 0}, "burst"),
    ({}, "give a concurrency, a rate, or both"),
    ({"concurrency": 2, "weight": 1}, "weight"),
    ({"concurrency": "2"}, "concurrency"),
])
def test_a_bad_limit_is_one_line_naming_the_field_and_writes_nothing(api, db, body, field):
    r = api.request("PUT", "/v1/limits/k", json=body)
    status, code, message = error_of(r)
    assert (status, code) == (400, "request.invalid") and field in message and "\n" not in message, message
    assert count(db, LIMITS) == 0
    assert audit_rows(db) == [("admin-bot", "limit.set", "k", "request.invalid")]


def test_only_an_admin_changes_limits_and_a_reader_reads_them(api, db):
    assert api.request("PUT", "/v1/limits/k", json={"concurrency": 1}).status_code == 201
    for role in ("reader", "submitter"):
        assert error_of(api.request("PUT", "/v1/limits/k", json={"concurrency": 9}, role=role))[:2] == \
            (403, "auth.forbidden")
        assert error_of(api.request("DELETE", "/v1/limits/k", role=role))[:2] == (403, "auth.forbidden")
    assert api.get("/v1/limits", role=None).status_code == 401
    assert api.get("/v1/limits/k", role="reader").get_json()["concurrency"] == 1
    assert db.execute("SELECT kind, concurrency FROM skiplock.limits").fetchall() == [("k", 1)]
    assert [a for _, a, _, _ in audit_rows(db)] == ["limit.set"]


def test_concurrency_key_is_stored_and_shown_in_the_task_view(api, db):
    keyed = api.post("/v1/tasks", json={"kind": "k", "concurrency_key": "customer:42"}, role="submitter")
    assert keyed.status_code == 201 and keyed.get_json()["concurrency_key"] == "customer:42"
    plain = api.post("/v1/tasks", json={"kind": "k"}, role="submitter").get_json()
    assert plain["concurrency_key"] is None
    explicit_null = api.post("/v1/tasks", json={"kind": "k", "concurrency_key": None}).get_json()
    assert explicit_null["concurrency_key"] is None
    batch = api.post("/v1/tasks:batch", json={"tasks": [{"kind": "k", "concurrency_key": "b:1"}, {"kind": "k"}]})
    assert batch.status_code == 201
    ids = [t["id"] for t in batch.get_json()["tasks"]]
    assert api.get(f"/v1/tasks/{keyed.get_json()['id']}", role="reader").get_json()["concurrency_key"] == "customer:42"
    listed = {t["id"]: t["concurrency_key"] for t in api.get("/v1/tasks", role="reader").get_json()["tasks"]}
    assert listed == {keyed.get_json()["id"]: "customer:42", plain["id"]: None, explicit_null["id"]: None,
                      ids[0]: "b:1", ids[1]: None}
    assert db.execute("SELECT concurrency_key, count(*) FROM skiplock.tasks GROUP BY 1 ORDER BY 1").fetchall() == \
        [("", 3), ("b:1", 1), ("customer:42", 1)]


def test_an_idempotent_replay_with_another_concurrency_key_is_a_conflict(api):
    first = api.post("/v1/tasks", json={"kind": "k", "concurrency_key": "a"}, headers={"Idempotency-Key": "x"})
    same = api.post("/v1/tasks", json={"kind": "k", "concurrency_key": "a"}, headers={"Idempotency-Key": "x"})
    assert (first.status_code, same.status_code) == (201, 200)
    other = api.post("/v1/tasks", json={"kind": "k", "concurrency_key": "b"}, headers={"Idempotency-Key": "x"})
    assert error_of(other)[:2] == (409, "task.idempotency_conflict")
    # a key-less submission keeps the fingerprint it always had
    api.post("/v1/tasks", json={"kind": "k"}, headers={"Idempotency-Key": "y"})
    assert api.post("/v1/tasks", json={"kind": "k"}, headers={"Idempotency-Key": "y"}).status_code == 200


@pytest.mark.parametrize("key,fragment", [
    ("k" * 257, "concurrency_key"),
    ("é" * 129, "concurrency_key: must be at most 256 bytes (got 258)"),
    ("a\x00b", "concurrency_key"),
    (42, "concurrency_key: must be a string"),
])
def test_a_bad_concurrency_key_is_one_line_and_enqueues_nothing(api, db, key, fragment):
    for path, body in (("/v1/tasks", {"kind": "k", "concurrency_key": key}),
                       ("/v1/tasks:batch", {"tasks": [{"kind": "k"}, {"kind": "k", "concurrency_key": key}]})):
        status, code, message = error_of(api.post(path, json=body))
        assert (status, code) == (400, "request.invalid") and fragment in message and "\n" not in message, message
    assert count(db, "SELECT count(*) FROM skiplock.tasks") == 0


def test_the_document_describes_the_limits_and_the_new_fields(api):
    doc = api.get("/v1/openapi.json", role=None).get_json()
    assert set(doc["paths"]["/v1/limits/{kind}"]) == {"get", "put", "delete"}
    assert doc["paths"]["/v1/limits/{kind}"]["put"]["x-required-role"] == "admin"
    assert doc["paths"]["/v1/limits"]["get"]["x-required-role"] == "reader"
    queue = doc["paths"]["/v1/queues"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert "throttled" in queue["properties"]["queues"]["items"]["required"]
    submit = doc["paths"]["/v1/tasks"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert submit["properties"]["concurrency_key"]["maxLength"] == 256
    assert api.get("/v1/", role=None).get_json()["links"]["limits"] == "/v1/limits"
