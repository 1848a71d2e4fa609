"""Handlers of durable execution for the test suite (kinds d.*). Side effects outside the
database are recorded in public.executions (tests/support/handlers.py's record), one row per
call of a step's function, with the step's name as the note."""

from __future__ import annotations

from skiplock import task

from .handlers import record


def _effect(ctx, name):
    record(ctx, name)
    return {"step": name, "attempt": ctx.attempt}


@task("d.steps", max_attempts=5, retry_base=0.05, retry_cap=0.2)
def steps(ctx, payload):
    """payload: {"steps": n, "fail_at": i (raise after step i, on the first attempt)}."""
    results = []
    for i in range(payload.get("steps", 3)):
        results.append(ctx.step(f"s{i}", _effect, ctx, f"s{i}"))
        if payload.get("fail_at") == i and ctx.attempt == 1:
            raise RuntimeError(f"after step {i}")
    return {"results": results}


@task("d.rows", max_attempts=5, retry_base=0.05, retry_cap=0.2)
def rows(ctx, payload):
    """payload["steps"] step_transactions, each inserting one row into public.step_rows."""
    for i in range(payload.get("steps", 5)):
        ctx.step_transaction(f"row{i}", lambda conn, i=i: conn.execute(
            "INSERT INTO public.step_rows (task_id, step) VALUES (%s, %s)", (ctx.task_id, i)).rowcount)
        if payload.get("sleep_between"):
            import time
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
    got = ctx.wait_for_signal(payload["name"], timeout=payload.get("timeout"))
    return {"got": got}


@task("d.parent")
def parent(ctx, payload):
    ids = ctx.step("spawn", lambda: [ctx.enqueue("d.child", {"i": i, "fail": i in payload.get("fail", [])})
                                     for i in range(payload.get("children", 3))])
    outcomes = ctx.wait_for_tasks(ids)
    record(ctx, "resumed")
    return {"states": sorted(o.state for o in outcomes), "n": len(outcomes)}


@task("d.child", max_attempts=1)
def child(ctx, payload):
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
    from .handlers import _conn
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
