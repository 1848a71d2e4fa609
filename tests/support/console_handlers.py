"""The task the console's browser test fails and then resumes: its first execution ends in a
permanent failure, every later one completes (executions are counted in public.executions)."""

from __future__ import annotations

from skiplock import Fail, task
from tests.support.handlers import _conn, record


@task("console.fail_first", max_attempts=1)
def fail_first(ctx, payload):
    record(ctx)
    runs = _conn().execute("SELECT count(*) FROM public.executions WHERE task_id = %s", (ctx.task_id,)).fetchone()[0]
    if runs == 1:
        raise Fail("first run fails on purpose")
    return {"runs": runs}


@task("console.crash", max_attempts=1)
def crash(ctx, payload):
    """Fails for good with a traceback of several frames and a message of two lines."""
    def parse(text):
        return int(text)

    try:
        parse(payload.get("text", "not a number"))
    except ValueError as exc:
        raise RuntimeError("could not read the order\nline two of the message") from exc
