"""`skiplock enqueue --unique*` and `--debounce-*` on real Postgres, through the command's main():
a duplicate or a merge prints the existing task's id and says so on stderr (exit 0); bad input is
one line on stderr, exit 1, nothing written."""

from __future__ import annotations

import pytest

from tests.integration.test_cli_limits import run  # noqa: F401 (fixture)

TASKS = "SELECT count(*) FROM skiplock.tasks"


def test_unique_flags(run, db):
    code, first, err = run("enqueue", "report", "--payload", '{"day": 1, "x": 1}', "--unique-key", "day",
                           "--unique-period", "3600")
    assert (code, err) == (0, "")
    code, again, err = run("enqueue", "report", "--payload", '{"day": 1, "x": 2}', "--unique-key", "day",
                           "--unique-period", "3600")
    assert (code, again) == (0, first) and "an existing task" in err
    code, other, err = run("enqueue", "report", "--payload", '{"day": 2}', "--unique-key", "day")
    assert (code, err) == (0, "") and other != first
    assert run("enqueue", "report", "--unique")[0] == 0
    states = db.execute("SELECT unique_states FROM skiplock.tasks WHERE id = %s", (first.strip(),)).fetchone()[0]
    assert states == ["waiting", "queued", "running", "cancelling"]
    code, out, err = run("enqueue", "report", "--unique-states", "waiting,queued,running,cancelling,completed")
    assert code == 0


def test_debounce_flags(run, db):
    code, first, err = run("enqueue", "digest", "--payload", '{"n": 1}', "--debounce-key", "u1",
                           "--debounce-delay", "30", "--debounce-max-wait", "60")
    assert (code, err) == (0, "")
    code, again, err = run("enqueue", "digest", "--payload", '{"n": 2}', "--debounce-key", "u1",
                           "--debounce-delay", "30")
    assert (code, again) == (0, first) and "merged" in err
    assert db.execute("SELECT payload FROM skiplock.tasks").fetchall() == [({"n": 2},)]


@pytest.mark.parametrize("args,message", [
    (("--unique-states", "queued"), "unique states must include waiting, queued, running, cancelling"),
    (("--unique-by-payload", "--unique-key", "a"), "unique: give by_payload or payload_keys, not both"),
    (("--unique-period", "0"), "unique period 0.0: must be a number of seconds > 0"),
    (("--debounce-key", "k"), "--debounce-key needs --debounce-delay SECONDS"),
    (("--debounce-delay", "1"), "--debounce-delay and --debounce-max-wait need --debounce-key"),
    (("--debounce-key", "k", "--debounce-delay", "1", "--idempotency-key", "i"),
     "debounce does not combine with an idempotency key"),
    (("--unique", "--debounce-key", "k", "--debounce-delay", "1"), "give unique or debounce, not both"),
])
def test_bad_options_are_one_line_and_write_nothing(run, db, args, message):
    code, out, err = run("enqueue", "report", *args)
    assert code == 1 and out == "" and err.startswith("skiplock enqueue: ") and message in err
    assert err.count("\n") == 1
    assert db.execute(TASKS).fetchone()[0] == 0
