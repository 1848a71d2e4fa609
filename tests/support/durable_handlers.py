"""Handlers of durable execution for the test suite (kinds d.*). Side effects outside the
database are recorded in public.executions (tests/support/handlers.py's record), one row per
call of a step's function, with the step's name as the note."""

from __future__ import annotations

import os
import time

from skiplock import task

from .handlers import _conn, record


def _effect(ctx, name):
    record(ctx, name)
    return {"step": name, "attempt": ctx.attempt}


def _slow_effect(ctx, name, seconds=0.0, raise_on_first_attempt=False):
    result = _effect(ctx, name)
    if seconds:
        time.sleep(seconds)  # a kill here repeats the call: its record is not written yet
    if raise_on_first_attempt and ctx.attempt == 1:
        raise RuntimeError(f"{name} failed on attempt 1")
    return result


@task("d.steps", max_attempts=5, retry_base=0.05, retry_cap=0.2)
def steps(ctx, payload):
    """payload: {"steps": n, "fail_at": i (raise after step i, on the first attempt),
    "raise_in": i (step i's function raises on the first attempt), "step_sleep": seconds inside
    each step's function}."""
    results = []
    for i in range(payload.get("steps", 3)):
        results.append(ctx.step(f"s{i}", _slow_effect, ctx, f"s{i}", payload.get("step_sleep", 0),
                                payload.get("raise_in") == i))
        if payload.get("fail_at") == i and ctx.attempt == 1:
            raise RuntimeError(f"after step {i}")
    return {"results": results}


def _insert_row(conn, ctx, step, pause=0.0):
    """A step_transaction's function: one row of public.step_rows, on the step's transaction;
    its call is recorded outside it (so a test sees calls whose row rolled back)."""
    record(ctx, f"row{step}")
    inserted = conn.execute("INSERT INTO public.step_rows (task_id, step) VALUES (%s, %s)",
                            (ctx.task_id, step)).rowcount
    if pause:
        time.sleep(pause)  # a kill here finds the row written and its record not yet committed
    return inserted


@task("d.rows", max_attempts=5, retry_base=0.05, retry_cap=0.2)
def rows(ctx, payload):
    """payload["steps"] step_transactions, each inserting one row into public.step_rows;
    payload["sleep_in_step"] seconds inside each (after its insert), payload["sleep_between"]
    after each."""
    for i in range(payload.get("steps", 5)):
        ctx.step_transaction(f"row{i}", _insert_row, ctx, i, payload.get("sleep_in_step", 0))
        if payload.get("sleep_between"):
            time.sleep(payload["sleep_between"])
    return {"rows": payload.get("steps", 5)}


@task("d.sleep")
def sleeper(ctx, payload):
    ctx.step("before", _effect, ctx, "before")
    ctx.sleep(payload.get("seconds", 1))
    ctx.step("after", _effect, ctx, "after")
    return {"slept": payload.get("seconds", 1)}


@task("d.signal")
def signal_waiter(ctx, payload):
    """Waits for the signal payload["name"]; records 'returned' (its time is the handler's
    return, on the database's clock) before returning what it got."""
    got = ctx.wait_for_signal(payload["name"], timeout=payload.get("timeout"))
    record(ctx, "returned")
    return {"got": got}


def _first_call(ctx, note: str) -> bool:
    """Records a call noted `note`; True if it is the task's first."""
    record(ctx, note)
    return _conn().execute("SELECT count(*) FROM public.executions WHERE task_id = %s AND note = %s",
                           (ctx.task_id, note)).fetchone()[0] == 1


def _spawn(ctx, payload):
    first = _first_call(ctx, "spawn")
    ids = [ctx.enqueue("d.child", {"i": i, "fail": i in payload.get("fail", []), "sleep": payload.get("child_sleep")})
           for i in range(payload.get("children", 3))]
    if first and payload.get("spawn_sleep"):
        time.sleep(payload["spawn_sleep"])  # a kill here: neither the record nor the children commit
    return ids


@task("d.parent")
def parent(ctx, payload):
    """Spawns payload["children"] d.child in a step and waits for them; records 'resumed' once
    they are all final. The first spawn and the first resumed run then linger payload["spawn_sleep"]
    and payload["linger"] seconds (a test kills them there)."""
    ids = ctx.step("spawn", _spawn, ctx, payload)
    outcomes = ctx.wait_for_tasks(ids)
    if _first_call(ctx, "resumed") and payload.get("linger"):
        time.sleep(payload["linger"])
    return {"states": sorted(o.state for o in outcomes), "n": len(outcomes)}


@task("d.child", max_attempts=1)
def child(ctx, payload):
    if payload.get("sleep"):
        time.sleep(payload["sleep"])
    if payload.get("fail"):
        raise RuntimeError("child failed")
    return {"i": payload["i"]}


@task("d.async")
async def async_steps(ctx, payload):
    a = await ctx.step("a", lambda: 1)
    await ctx.sleep(payload.get("seconds", 0.2))

    async def b():
        return a + 1
    return {"b": await ctx.step("b", b)}


@task("d.changed")
def changed(ctx, payload):
    """The order of its steps follows payload["order"], read from a table between runs."""
    order = _conn().execute("SELECT note FROM public.executions WHERE note LIKE 'order:%%' "
                            "ORDER BY at DESC LIMIT 1").fetchone()
    names = (order[0][6:] if order else payload["order"]).split(",")
    for name in names:
        ctx.step(name, lambda: name)
        if name == payload.get("pause_after"):
            ctx.sleep(0.1)
    return names


@task("d.bad", max_attempts=3)
def bad(ctx, payload):
    """One bad durable call, chosen by payload["case"]."""
    case = payload["case"]
    if case == "empty name":
        ctx.step("", lambda: 1)
    elif case == "long name":
        ctx.step("x" * 201, lambda: 1)
    elif case == "not json":
        ctx.step("s", lambda: {1, 2})
    elif case == "too large":
        ctx.step("s", lambda: "x" * 2000)
    elif case == "negative sleep":
        ctx.sleep(-1)
    elif case == "naive sleep_until":
        import datetime as dt
        ctx.sleep_until(dt.datetime(2030, 1, 1))
    elif case == "signal name":
        ctx.wait_for_signal("")
    elif case == "too many":
        for i in range(10):
            ctx.step("s", lambda: i)
    elif case == "nested":
        ctx.step("outer", lambda: ctx.step("inner", lambda: 1))
    return "unreachable"


@task("d.spawn_then_fail", max_attempts=2, retry_base=0.01, retry_cap=0.02)
def spawn_then_fail(ctx, payload):
    """A step that enqueues a child and then raises on the first attempt: no child may survive
    that attempt; the second attempt's step and child commit together."""
    def spawn():
        child_id = ctx.enqueue("t.noop", {"from": ctx.attempt})
        if ctx.attempt == 1:
            raise RuntimeError("after the enqueue")
        return child_id
    return {"child": ctx.step("spawn", spawn)}


@task("d.self_child", max_attempts=1)
def self_child(ctx, payload):
    """A child that depends on the running task, enqueued outside a step (in the run's own
    transaction, which then holds the task's row), then a step."""
    ctx.enqueue("t.noop", {}, depends_on=[ctx.task_id])
    return {"step": ctx.step("after", lambda: 1)}


@task("d.children_outside_a_step")
def children_outside_a_step(ctx, payload):
    """Enqueues its children outside a step: each run makes new ones."""
    ids = [ctx.enqueue("d.child", {"i": i}) for i in range(2)]
    return {"n": len(ctx.wait_for_tasks(ids))}


# ---- for tests/reliability/test_durable_faults.py: real worker processes ------------------------

def _finished(ctx) -> bool:
    return _conn().execute("SELECT state IN ('completed', 'failed', 'cancelled') FROM skiplock.tasks "
                           "WHERE id = %s", (ctx.task_id,)).fetchone()[0]


def _charge(conn, ctx, hold):
    """The zombie's step: one row on the step's transaction; on its first call it then holds
    until the task is final (another worker finished it) or `hold` seconds passed."""
    first = _first_call(ctx, "charge")
    conn.execute("INSERT INTO public.step_rows (task_id, step) VALUES (%s, 0)", (ctx.task_id,))
    end = time.monotonic() + hold
    while first and time.monotonic() < end and not _finished(ctx):
        time.sleep(0.05)
    return {"pid": os.getpid()}


@task("d.zombie", max_attempts=1)
def zombie(ctx, payload):
    """A charge (step_transaction, held on its first call: payload["hold"] seconds at most),
    a shipment (step_transaction) and a notice (step)."""
    charged = ctx.step_transaction("charge", _charge, ctx, payload.get("hold", 30))
    shipped = ctx.step_transaction("ship", lambda conn: {"pid": os.getpid(), "rows": conn.execute(
        "INSERT INTO public.step_rows (task_id, step) VALUES (%s, 1)", (ctx.task_id,)).rowcount})
    noticed = ctx.step("notify", _effect, ctx, "notify")
    return {"charge": charged, "ship": shipped, "notify": noticed, "pid": os.getpid()}


@task("d.deployed")
def deployed(ctx, payload):
    """Steps named by DURABLE_STEP_ORDER ("a,b,c"), this process's version of the handler; a
    durable sleep of payload["pause"] seconds after payload["pause_after"]."""
    names = os.environ.get("DURABLE_STEP_ORDER", "a,b,c").split(",")
    for name in names:
        ctx.step(name, _effect, ctx, name)
        if name == payload.get("pause_after"):
            ctx.sleep(payload.get("pause", 1))
    return names


@task("d.plan", max_attempts=5, retry_base=0.05, retry_cap=0.2)
def plan(ctx, payload):
    """Runs payload["ops"] in order, each [op, argument]: ["step", name] (ctx.step recording its
    call), ["tx", name] (a step_transaction inserting one row, step = its position), ["sleep",
    seconds], ["signal", name]; payload["work"] seconds inside each step's function."""
    work = payload.get("work", 0)
    got = []
    for position, (op, arg) in enumerate(payload["ops"], 1):
        if op == "step":
            got.append(ctx.step(arg, _slow_effect, ctx, arg, work))
        elif op == "tx":
            got.append(ctx.step_transaction(arg, _insert_row, ctx, position, work))
        elif op == "sleep":
            ctx.sleep(arg)
        elif op == "signal":
            got.append(ctx.wait_for_signal(arg))
    return {"got": got}
