"""Task handlers for the test suite. Each execution is recorded in public.executions through its
own connection (outside any task transaction), so tests count real executions, including those
whose outcome a fence later refused."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import psycopg

from skiplock import Fail, Retry, Step, task

_local = threading.local()


def _conn() -> psycopg.Connection:
    conn = getattr(_local, "conn", None)
    url = os.environ["SKIPLOCK_DATABASE_URL"]
    if conn is not None and getattr(_local, "url", None) != url:  # an in-process test's own database
        conn.close()
        conn = None
    _local.url = url
    if conn is None or conn.closed:
        # behind a transaction pooler a handler's own connection must not prepare either
        never_prepare = os.environ.get("SKIPLOCK_DATABASE_POOLER") == "transaction"
        conn = _local.conn = psycopg.connect(os.environ["SKIPLOCK_DATABASE_URL"], autocommit=True,
                                             **({"prepare_threshold": None} if never_prepare else {}))
    return conn


def record(ctx, note: str = "") -> None:
    _conn().execute(
        "INSERT INTO public.executions (task_id, pid, attempt, note) VALUES (%s, %s, %s, %s)",
        (ctx.task_id, os.getpid(), ctx.attempt, note),
    )


@task("t.noop")
def noop(ctx, payload):
    return None


@task("t.record")
def record_and_sleep(ctx, payload):
    """Records the execution, then sleeps payload['sleep'] seconds (cooperatively if asked)."""
    record(ctx)
    seconds = float(payload.get("sleep", 0))
    if payload.get("cooperative"):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if ctx.cancel_requested:
                return {"stopped_early": True}
            time.sleep(0.01)
    else:
        time.sleep(seconds)
    return {"slept": seconds}


@task("t.fail_until", max_attempts=5, retry_base=0.05, retry_cap=0.2)
def fail_until(ctx, payload):
    """Raises until attempt payload['ok_at']."""
    record(ctx)
    if ctx.attempt < int(payload["ok_at"]):
        raise RuntimeError(f"boom on attempt {ctx.attempt}")
    return {"attempt": ctx.attempt}


@task("t.always_fails", max_attempts=3, retry_base=0.01, retry_cap=0.05)
def always_fails(ctx, payload):
    record(ctx)
    raise ValueError("always")


@task("t.fail_permanently")
def fail_permanently(ctx, payload):
    record(ctx)
    raise Fail("bad input: no such customer")


@task("t.retry_later")
def retry_later(ctx, payload):
    record(ctx)
    if ctx.attempt == 1:
        raise Retry(delay=float(payload.get("delay", 0.2)))
    return "second time lucky"


@task("t.steps")
def steps(ctx, payload):
    """Processes payload['n'] steps, one per run, checkpointing the cursor."""
    record(ctx, note=str(ctx.cursor))
    done = (ctx.cursor or 0) + 1
    if done < int(payload["n"]):
        return Step(cursor=done, progress=done / int(payload["n"]), message=f"step {done}")
    return {"steps": done}


@task("t.transactional")
def transactional(ctx, payload):
    """Writes a business row in ctx.transaction(), then sleeps (to lose the lease if asked)."""
    record(ctx)
    with ctx.transaction() as conn:
        conn.execute("INSERT INTO public.ledger (task_id, amount) VALUES (%s, %s)",
                     (ctx.task_id, payload.get("amount", 100)))
        time.sleep(float(payload.get("sleep", 0)))
    return {"charged": payload.get("amount", 100)}


@task("t.timeout", timeout=0.3, max_attempts=1)
def times_out(ctx, payload):
    record(ctx)
    end = time.monotonic() + float(payload.get("sleep", 5))
    while time.monotonic() < end:
        if payload.get("cooperative") and ctx.cancel_requested:
            raise TimeoutError("stopped at the timeout")
        time.sleep(0.01)
    return "finished"


@task("t.async")
async def async_handler(ctx, payload):
    await asyncio.sleep(float(payload.get("sleep", 0.01)))
    return {"async": True, "attempt": ctx.attempt}


@task("t.unserializable")
def unserializable(ctx, payload):
    return {"when": object()}


@task("t.cancellable")
def cancellable(ctx, payload):
    """Works until cancelled, then stops by raising: a cancelled task ends 'cancelled'."""
    record(ctx)
    end = time.monotonic() + float(payload.get("sleep", 30))
    while time.monotonic() < end:
        if ctx.cancel_requested:
            raise Retry(message="stopping: cancel requested")
        time.sleep(0.01)
    return "not cancelled"


@task("t.whoami")
def whoami(ctx, payload):
    """Like t.record, but the result names the process that ran it (to tell whose outcome won)."""
    record(ctx)
    seconds = float(payload.get("sleep", 0))
    time.sleep(seconds)
    return {"pid": os.getpid(), "attempt": ctx.attempt, "slept": seconds}


@task("t.nul")
def nul(ctx, payload):
    """Returns or raises text with a NUL character, which Postgres text/jsonb cannot store."""
    if payload.get("raise"):
        raise RuntimeError("bad\x00byte")
    return {"text": "a\x00b"}


@task("t.span")
def span(ctx, payload):
    """Records 'start', sleeps payload['sleep'] seconds, records 'end': each execution's interval,
    so tests can count executions that overlapped."""
    record(ctx, note="start")
    time.sleep(float(payload.get("sleep", 0)))
    record(ctx, note="end")
    return None


def _executions_so_far(ctx) -> int:
    return _conn().execute("SELECT count(*) FROM public.executions WHERE task_id = %s",
                           (ctx.task_id,)).fetchone()[0]


@task("t.kill_own_process")
def kill_own_process(ctx, payload):
    """Records the execution, then ends its own worker process: `os._exit` (no cleanup, no
    outcome written) or a segfault through ctypes (payload['how'] == 'segfault')."""
    record(ctx)
    if payload.get("how") == "segfault":
        import ctypes
        ctypes.string_at(0)  # reads address 0: SIGSEGV
    os._exit(3)


@task("t.hold_gil")
def hold_gil(ctx, payload):
    """On its first execution, sleeps payload['seconds'] inside one C call that keeps the GIL
    (libc's sleep through ctypes.PyDLL, which does not release it): no other thread of the worker,
    the keeper's heartbeats included, runs meanwhile. Later executions return at once."""
    first = _executions_so_far(ctx) == 0
    record(ctx)
    if first:
        import ctypes
        ctypes.PyDLL(None).sleep(int(payload["seconds"]))
    return {"pid": os.getpid(), "held_gil": first}


@task("t.parents")
def parents_seen(ctx, payload):
    """Records the execution, and returns what ctx.parents() shows: how many parents, their
    states, and the sum of their results' `n`."""
    record(ctx)
    parents = ctx.parents()
    return {"parents": len(parents), "states": sorted({p.state for p in parents}),
            "sum": sum((p.result or {}).get("n", 0) for p in parents), "pid": os.getpid()}


@task("t.value")
def value(ctx, payload):
    """Records the execution and returns {'n': payload['n']} (a parent whose result is read)."""
    record(ctx)
    if payload.get("sleep"):
        time.sleep(float(payload["sleep"]))
    return {"n": payload.get("n", 0)}


@task("t.spawn")
def spawn(ctx, payload):
    """Creates payload['n'] children (t.noop, each depending on the one before: siblings), then on
    its first execution sleeps payload['sleep'] seconds; later executions return at once. The
    children commit with this run's completion, or never."""
    first = _executions_so_far(ctx) == 0
    record(ctx)
    previous = None
    for i in range(int(payload["n"])):
        previous = ctx.enqueue("t.noop", {"child": i, "pid": os.getpid()},
                               depends_on=[previous] if previous else None)
    if first:
        time.sleep(float(payload.get("sleep", 0)))
    return {"pid": os.getpid()}


@task("t.fan")
def fan(ctx, payload):
    """Enqueues payload['n'] t.noop children that depend on this task, one ctx.enqueue each (or in
    one ctx.enqueue_many with payload['many']); they commit with this run's completion."""
    n = int(payload["n"])
    if payload.get("many"):
        ctx.enqueue_many("t.noop", [{"child": i} for i in range(n)], depends_on=[ctx.task_id])
    else:
        for i in range(n):
            ctx.enqueue("t.noop", {"child": i}, depends_on=[ctx.task_id])
    return {"children": n}


@task("t.note", queue="notes")
def note(ctx, payload: dict) -> dict:
    """Records the execution with its payload (as JSON, keys sorted) in the note."""
    import json

    record(ctx, json.dumps(payload, sort_keys=True))
    return payload


@task("t.enqueue_note")
def enqueue_note(ctx, payload: dict) -> str:
    """Enqueues one t.note without naming a queue: it goes to the queue t.note declares."""
    return str(ctx.enqueue("t.note", {"from": str(ctx.task_id)}))


@task("t.nap")
def nap(ctx, payload):
    """Sleeps payload['sleep'] seconds and touches no database (a drain that an outage's own
    lines can be told apart from)."""
    time.sleep(float(payload.get("sleep", 0)))
