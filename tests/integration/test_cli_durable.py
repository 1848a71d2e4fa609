"""`skiplock tasks steps`, `skiplock signals send|list` and what `skiplock tasks list` shows of a
waiting task, on real Postgres with tasks suspended by a real worker's run: what each prints
(a table, or with `-o json` the API's answer), what a send writes (the signal, the wake-up, its
audit row with the actor cli:<os user>), and bad input as one line on stderr, exit 1, with
nothing written. Run through the command's main() in this process, and once as a real
`skiplock` process."""

from __future__ import annotations

import json

import pytest

from tests.acceptance.test_cli import skiplock
from tests.integration.test_cli_limits import ACTOR, audit, run  # noqa: F401 (fixture)
from tests.integration.test_durable import worker  # noqa: F401 (fixture)
from tests.support.suspended import suspend_one_of_each

SIGNALS = "SELECT count(*) FROM skiplock.signals"


def test_tasks_steps_prints_the_log_and_tasks_list_the_reasons(run, worker, db_url, db):
    ids = suspend_one_of_each(worker, db_url, db)
    code, out, err = run("tasks", "steps", ids["sleep"])
    assert (code, err) == (0, "")
    header, first, second = [line.split() for line in out.splitlines()]
    assert header == ["POS", "STEP", "TYPE", "ATTEMPT", "RUN", "RECORDED", "(UTC)", "RESULT"]
    assert first[:4] == ["1", "a", "step", "1"] and first[-1] == "1"
    assert second[:4] == ["2", "sleep", "sleep", "1"] and second[-1].startswith('{"until":"')
    code, out, _ = run("tasks", "steps", ids["sleep"], "--limit", "1")
    assert out.splitlines()[-1] == "more: --after 1"
    body = json.loads(run("tasks", "steps", ids["sleep"], "--after", "1", "-o", "json")[1])
    assert [s["name"] for s in body["steps"]] == ["sleep"] and body["next_after"] is None
    assert run("tasks", "steps", ids["parents"]) == (0, "no steps\n", "")

    listed = {line.split()[0]: line for line in run("tasks", "list", "--state", "waiting")[1].splitlines()[1:]}
    assert "waiting (sleeping until 20" in listed[ids["sleep"]]
    assert "waiting (waiting for signal order-1.confirmed (timeout 20" in listed[ids["signal"]]
    assert "waiting (waiting for 2 tasks)" in listed[ids["tasks"]]
    assert "waiting (waiting for 1 parent)" in listed[ids["parents"]]
    shown = json.loads(run("tasks", "show", ids["tasks"], "-o", "json")[1])
    assert shown["waiting_for"] == {"reason": "tasks", "count": 2}


def test_signals_send_wakes_its_waiter_once_is_audited_and_listed(run, worker, db_url, db):
    ids = suspend_one_of_each(worker, db_url, db)
    assert run("signals", "send", "order-1.confirmed", "--payload", '{"by": "warehouse"}') == \
        (0, "sent: order-1.confirmed (woken 1)\n", "")
    assert db.execute("SELECT state FROM skiplock.tasks WHERE id = %s", (ids["signal"],)).fetchone() == ("queued",)
    assert run("signals", "send", "order-1.confirmed") == \
        (0, "already sent: order-1.confirmed (unchanged, woken 0)\n", "")
    assert json.loads(run("signals", "send", "bare", "-o", "json")[1]) == {"name": "bare", "created": True, "woken": 0}
    assert audit(db) == [(ACTOR, "signal.send", "order-1.confirmed", "ok")] * 2 + [(ACTOR, "signal.send", "bare", "ok")]
    assert db.execute("SELECT name, payload FROM skiplock.signals ORDER BY name").fetchall() == \
        [("bare", None), ("order-1.confirmed", {"by": "warehouse"})]

    code, out, err = run("signals", "list")
    assert (code, err) == (0, "")
    rows = [line.split() for line in out.splitlines()]
    assert rows[0] == ["NAME", "SENT", "AT", "(UTC)", "PAYLOAD"]
    assert [r[0] for r in rows[1:]] == ["bare", "order-1.confirmed"]
    assert rows[2][-1] == '{"by":"warehouse"}'
    code, out, _ = run("signals", "list", "--limit", "1")
    cursor = out.splitlines()[-1].removeprefix("more: --cursor ")
    body = json.loads(run("signals", "list", "--limit", "1", "--cursor", cursor, "-o", "json")[1])
    assert [s["name"] for s in body["signals"]] == ["order-1.confirmed"] and body["next_cursor"] is None
    assert run("signals", "list", "--prefix", "nothing-") == (0, "no signals\n", "")


@pytest.mark.parametrize("args,message", [
    (("send", ""), "skiplock signals: signal name must be 1-200 characters (got 0)\n"),
    (("send", "n" * 201), "skiplock signals: signal name must be 1-200 characters (got 201)\n"),
    (("send", "ok", "--payload", "{nope"), "skiplock signals: --payload is not valid JSON: Expecting property name "
                                           "enclosed in double quotes: line 1 column 2 (char 1)\n"),
    (("send", "ok", "--payload", '"\\u0000"'), "skiplock signals: signal payload contains a NUL character (\\u0000), "
                                              "which Postgres jsonb cannot store\n"),
    (("list", "--limit", "0"), "skiplock signals: --limit 0: must be in [1, 500]\n"),
    (("list", "--cursor", "bm9wZQ"), "skiplock signals: cursor: not a next_cursor of GET /v1/signals\n"),
])
def test_bad_signal_input_is_one_line_and_writes_nothing(run, db, args, message):
    assert run("signals", *args) == (1, "", message)
    assert db.execute(SIGNALS).fetchone()[0] == 0 and audit(db) == []


def test_bad_steps_input_is_one_line(run):
    assert run("tasks", "steps", "nope") == (1, "", "skiplock tasks: id 'nope': not a UUID\n")
    missing = "00000000-0000-7000-8000-000000000001"
    code, out, err = run("tasks", "steps", missing)
    assert (code, out) == (1, "") and err == f"skiplock tasks: task {missing} not found\n", err


def test_a_real_process_sends_a_signal(db_url, db):
    done = skiplock("signals", "send", "from-a-process", "--payload", "[1, 2]", url=db_url)
    assert (done.returncode, done.stdout, done.stderr) == (0, "sent: from-a-process (woken 0)\n", "")
    assert db.execute("SELECT payload FROM skiplock.signals").fetchall() == [([1, 2],)]
