"""A type checker sees a task handle's payload type: mypy (the lock's, run as a user would run it
on their code) reads the handler's signature through @skiplock.task and refuses an enqueue of the
wrong payload type or an unknown option, and accepts the right ones."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

USE = textwrap.dedent('''
    import pydantic
    import skiplock


    class Order(pydantic.BaseModel):
        qty: int


    class Invoice(pydantic.BaseModel):
        number: str


    @skiplock.task("t.order", payload=Order)
    def order(ctx: object, payload: Order) -> int:
        return payload.qty


    @skiplock.task("t.plain")
    async def plain(ctx: object, payload: dict) -> None:
        return None


    async def main() -> None:
        order.enqueue("postgresql://x", Order(qty=1))                      # fine
        order.enqueue("postgresql://x", {"qty": 1}, unique=skiplock.Unique(period=60))
        ids: list[skiplock.TaskId] = order.enqueue_many("postgresql://x", [Order(qty=2)])
        await plain.enqueue_async("postgresql://x", {"a": 1}, debounce=skiplock.Debounce("k", 1.0))
        total: int = order(None, Order(qty=3))                             # calling runs the handler
        reveal_type(order)
        order.enqueue("postgresql://x", Invoice(number="1"))               # error: wrong model
        order.enqueue("postgresql://x", Order(qty=1), priorty=3)           # error: no such option
        order.enqueue_many("postgresql://x", [Invoice(number="2")])        # error: wrong model
        await plain.enqueue_many_async("postgresql://x", [42])             # error: not a dict
        name: str = order(None, Order(qty=4))                              # error: returns an int
''')


def test_mypy_sees_the_payload_type_of_a_handle(tmp_path):
    source = tmp_path / "use_handles.py"
    source.write_text(USE)
    run = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "--cache-dir", str(tmp_path / "cache"),
                          "--python-executable", sys.executable, "--hide-error-context", "--no-pretty",
                          "--show-error-codes", str(source)], capture_output=True, text=True, timeout=300,
                         cwd=tmp_path)
    out = run.stdout
    assert 'Revealed type is "skiplock.handles.TaskHandle[use_handles.Order, int]"' in out, out
    found = [m.group(2) for m in re.finditer(r"use_handles\.py:(\d+): error: (.*)", out)]
    lines = [int(m.group(1)) for m in re.finditer(r"use_handles\.py:(\d+): error:", out)]
    expected = [n for n, line in enumerate(USE.splitlines(), 1) if "# error:" in line]
    assert lines == expected, out
    wrong_model, no_option, wrong_item, not_a_dict, wrong_result = found
    assert '"Invoice"' in wrong_model and "Order" in wrong_model
    assert '"priorty"' in no_option
    assert '"Invoice"' in wrong_item
    assert '"int"' in not_a_dict
    assert '"int"' in wrong_result and '"str"' in wrong_result
