"""`skiplock limits set|list|delete|apply` and `skiplock enqueue --concurrency-key` on real Postgres:
what each prints, what it writes (limits, tasks, audit rows with the actor cli:<os user>), and bad
input as one line on stderr naming the field, exit code 1, with nothing written. Run through the
command's main() in this process, and once as a real `skiplock` process."""

from __future__ import annotations

import getpass
import json

import pytest

from skiplock import cli
from tests.acceptance.test_cli import skiplock

ACTOR = f"cli:{getpass.getuser()}"


@pytest.fixture
def run(db_url, monkeypatch, capsys):
    """run(*args) -> (exit code, stdout, stderr) of `skiplock *args` against the test's database."""
    monkeypatch.setenv("SKIPLOCK_DATABASE_URL", db_url)

    def run(*args: str) -> tuple[int, str, str]:
        code = cli.main(list(args))
        out, err = capsys.readouterr()
        return code, out, err
    return run


def audit(db) -> list[tuple]:
    return db.execute("SELECT actor, action, target, outcome FROM skiplock.audit_log ORDER BY id").fetchall()


def test_set_list_and_delete(run, db, store):
    assert run("limits", "list") == (0, "no limits\n", "")
    assert run("limits", "set", "mail.send", "--concurrency", "2") == \
        (0, "created: mail.send (concurrency 2)\n", "")
    assert run("limits", "set", "mail.send", "--concurrency", "2")[1] == "unchanged: mail.send (concurrency 2)\n"
    assert run("limits", "set", "mail.send", "--concurrency", "1", "--rate", "20/s", "--burst", "5")[1] == \
        "updated: mail.send (concurrency 1, rate 20/s, burst 5)\n"
    assert run("limits", "set", "report.build", "--rate", "30/m")[1] == "created: report.build (rate 30/m, burst 1)\n"
    assert db.execute("SELECT kind, concurrency, rate_count, rate_seconds, burst FROM skiplock.limits "
                      "ORDER BY kind").fetchall() == [("mail.send", 1, 20, 1.0, 5), ("report.build", None, 30, 60.0, 1)]

    for key in ("a", "a", "b", None):
        assert run("enqueue", "mail.send", *(["--concurrency-key", key] if key else []))[0] == 0
    assert db.execute("SELECT concurrency_key, count(*) FROM skiplock.tasks GROUP BY 1 ORDER BY 1").fetchall() == \
        [("", 1), ("a", 2), ("b", 1)]
    leased = len(store.tasks.task_claim(["default"], 10, "w-1", 60))
    leased += len(store.tasks.task_claim_limited(["default"], 10, "w-1", 60))
    assert leased == 3  # one per key: a, b and the key-less group

    code, out, _ = run("limits", "list")
    header, mail, report = out.splitlines()
    assert code == 0 and header.split() == ["KIND", "CONCURRENCY", "RATE", "BURST", "THROTTLED", "RUNNING",
                                            "SATURATION", "TOKENS", "UPDATED", "(UTC)"]
    assert mail.split()[:7] == ["mail.send", "1", "20/s", "5", "1", "3", "100%"]
    assert report.split()[:8] == ["report.build", "-", "30/m", "1", "0", "0", "-", "-"]
    listed = json.loads(run("limits", "list", "-o", "json")[1])["limits"]
    assert [(item["kind"], item["throttled"], item["running"]) for item in listed] == \
        [("mail.send", 1, 3), ("report.build", 0, 0)]
    queues = run("queues", "list")[1].splitlines()
    column = queues[0].split().index("THROTTLED")
    assert queues[1].split()[column] == "1"

    assert run("limits", "delete", "report.build") == (0, "deleted: report.build\n", "")
    assert run("limits", "delete", "report.build") == (1, "", "skiplock limits: no limit for kind 'report.build'\n")
    assert [k for (k,) in db.execute("SELECT kind FROM skiplock.limits").fetchall()] == ["mail.send"]
    rows = audit(db)
    tasks = db.execute("SELECT id::text FROM skiplock.tasks ORDER BY id").fetchall()
    assert [r for r in rows if r[1] == "task.submit"] == [(ACTOR, "task.submit", i, "ok") for (i,) in tasks]
    assert [r for r in rows if r[1] != "task.submit"] == [
        (ACTOR, "limit.set", "mail.send", "ok"), (ACTOR, "limit.set", "mail.send", "ok"),
        (ACTOR, "limit.set", "mail.send", "ok"), (ACTOR, "limit.set", "report.build", "ok"),
        (ACTOR, "limit.delete", "report.build", "ok"), (ACTOR, "limit.delete", "report.build", "limit.not_found")]


@pytest.mark.parametrize("args,message", [
    (("--concurrency", "0"), "concurrency 0: must be a positive integer"),
    (("--concurrency", "-2"), "concurrency -2: must be a positive integer"),
    (("--rate", "0/s"), "rate '0/s': the count must be a positive integer"),
    (("--rate", "fast"), "rate 'fast': expected N/s, N/m, N/h or N/d (e.g. 100/s)"),
    (("--rate", "10/s", "--burst", "0"), "burst 0: must be a positive integer"),
    (("--burst", "3"), "burst: only with a rate (--rate)"),
    ((), "limit of 'k': give a concurrency, a rate, or both"),
])
def test_a_bad_limit_is_one_line_naming_the_field_and_writes_nothing(run, db, args, message):
    assert run("limits", "set", "k", *args) == (1, "", f"skiplock limits: {message}\n")
    assert db.execute("SELECT count(*) FROM skiplock.limits").fetchone()[0] == 0
    assert audit(db) == []


def test_a_bad_concurrency_key_enqueues_nothing(run, db):
    code, out, err = run("enqueue", "k", "--concurrency-key", "x" * 257)
    assert (code, out, err) == (1, "", "skiplock enqueue: concurrency_key: must be at most 256 bytes (got 257)\n")
    assert run("enqueue", "k", "--concurrency-key", "x" * 256)[0] == 0
    assert db.execute("SELECT count(*), max(length(concurrency_key)) FROM skiplock.tasks").fetchone() == (1, 256)


def test_apply_a_file_dry_run_prune_and_a_bad_file_applies_nothing(run, db, tmp_path):
    path = tmp_path / "limits.yaml"
    path.write_text("limits:\n  - {kind: mail.send, concurrency: 2}\n  - {kind: report.build, rate: 10/s, burst: 3}\n")
    assert run("limits", "apply", "-f", str(path), "--dry-run") == \
        (0, "valid: mail.send (concurrency 2)\nvalid: report.build (rate 10/s, burst 3)\n", "")
    assert db.execute("SELECT count(*) FROM skiplock.limits").fetchone()[0] == 0
    assert run("limits", "apply", "-f", str(path))[1] == \
        "created: mail.send\ncreated: report.build\n2 created, 0 updated, 0 unchanged, 0 deleted\n"
    assert run("limits", "set", "extra", "--concurrency", "1")[0] == 0

    path.write_text("- {kind: mail.send, concurrency: 3}\n- {kind: report.build, rate: 10/s, burst: 3}\n")
    assert run("limits", "apply", "-f", str(path))[1] == \
        "updated: mail.send\nunchanged: report.build\n0 created, 1 updated, 1 unchanged, 0 deleted\n"
    assert run("limits", "apply", "-f", str(path), "--prune")[1] == \
        "unchanged: mail.send\nunchanged: report.build\ndeleted: extra\n0 created, 0 updated, 2 unchanged, 1 deleted\n"
    assert [k for (k,) in db.execute("SELECT kind FROM skiplock.limits ORDER BY kind").fetchall()] == \
        ["mail.send", "report.build"]
    assert [(a, t, o) for _, a, t, o in audit(db)] == [("limit.apply", None, "ok"), ("limit.set", "extra", "ok"),
                                                       ("limit.apply", None, "ok"), ("limit.apply", None, "ok")]

    before = db.execute("SELECT kind, concurrency, updated_at FROM skiplock.limits ORDER BY kind").fetchall()
    # the second entry is bad: the first is not applied either
    path.write_text("- {kind: mail.send, concurrency: 9}\n- {kind: report.build, rate: 0/s}\n")
    assert run("limits", "apply", "-f", str(path), "--prune") == \
        (1, "", f"skiplock limits: {path}: limits[1] (report.build): rate '0/s': the count must be a positive "
                "integer\n")
    assert db.execute("SELECT kind, concurrency, updated_at FROM skiplock.limits ORDER BY kind").fetchall() == before
    assert len(audit(db)) == 4


def test_as_a_real_process(db_url, db):
    done = skiplock("limits", "set", "k", "--concurrency", "4", url=db_url)
    assert (done.returncode, done.stdout, done.stderr) == (0, "created: k (concurrency 4)\n", "")
    bad = skiplock("limits", "set", "k", "--rate", "0/s", url=db_url)
    assert (bad.returncode, bad.stdout) == (1, "")
    assert bad.stderr == "skiplock limits: rate '0/s': the count must be a positive integer\n"
    assert db.execute("SELECT kind, concurrency, rate_count FROM skiplock.limits").fetchall() == [("k", 4, None)]
