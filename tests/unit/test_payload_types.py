"""Typed payloads without a database: what `@task(payload=Model)` registers, what enqueue stores
(payload_for_enqueue), what a handler gets or how its run fails (handler_payload), the one-line
validation messages, and that pydantic stays unloaded for untyped use (checked in fresh
interpreters, since this one has loaded it)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from pydantic import BaseModel, field_serializer

from skiplock import Fail, task
from skiplock.engine.errors import InvalidInput
from skiplock.engine.model import TaskDef
from skiplock.engine.payload_types import (ERRORS_SHOWN, TypedTaskDef, describe, handler_payload, json_schema,
                                           payload_for_enqueue, payload_model, payloads_for_enqueue)
from skiplock.engine.registry import REGISTRY, Registry
from tests.support.harness import ROOT
from tests.support.typed_models import Address, Order, pydantic_says


class Everything(BaseModel):
    note: str = "none"


class Unrelated(BaseModel):
    order_id: int


@pytest.fixture
def kinds():
    """Registers kinds in the process-wide registry (enqueue's) for one test, then forgets them."""
    defs, models = dict(REGISTRY._defs), dict(REGISTRY.payload_models)

    def define(kind: str, model=None, **options):
        def handler(ctx, payload):
            return payload

        handler.__qualname__ = f"handler_of_{kind}"  # each kind its own function
        return task(kind, payload=model, **options)(handler)

    yield define
    REGISTRY._defs.clear(), REGISTRY._defs.update(defs)
    REGISTRY.payload_models.clear(), REGISTRY.payload_models.update(models)


def test_a_typed_kind_is_registered_with_its_model_and_an_untyped_one_without(kinds):
    kinds("unit.typed", Order, max_attempts=4)
    kinds("unit.plain")
    typed, plain = REGISTRY.get("unit.typed"), REGISTRY.get("unit.plain")
    assert isinstance(typed, TypedTaskDef) and typed.payload_model is Order and typed.max_attempts == 4
    assert type(plain) is TaskDef
    assert (payload_model("unit.typed"), payload_model("unit.plain"), payload_model("unit.unknown")) == \
        (Order, None, None)
    assert json_schema(typed) == Order.model_json_schema() and json_schema(plain) is None


def test_a_kind_redefined_without_its_model_is_untyped_again(kinds):
    registry = Registry()

    def handler(ctx, payload):
        return payload

    task("unit.redefined", payload=Order, registry=registry)(handler)
    assert registry.payload_models == {"unit.redefined": Order}
    task("unit.redefined", registry=registry)(handler)  # the same function: a module imported twice
    assert registry.payload_models == {} and type(registry.get("unit.redefined")) is TaskDef


@pytest.mark.parametrize("model", [dict, Order(order_id=1), "Order", int])
def test_payload_must_be_a_model_class(model):
    with pytest.raises(InvalidInput) as refused:
        task("unit.bad_model", payload=model, registry=Registry())
    assert str(refused.value).startswith("task unit.bad_model: payload= must be a pydantic model class")


def test_enqueue_stores_the_validated_json_form_with_defaults(kinds):
    kinds("unit.typed", Order)
    full = {"order_id": 7, "qty": 1, "address": None, "tags": []}
    assert payload_for_enqueue("unit.typed", {"order_id": "7"}) == full  # coerced, defaults filled in
    assert payload_for_enqueue("unit.typed", Order(order_id=7)) == full
    with_address = payload_for_enqueue("unit.typed", Order(order_id=8, address=Address(city="Oslo", zip="01500")))
    assert with_address["address"] == {"city": "Oslo", "zip": "01500"}
    assert json.loads(json.dumps(with_address)) == with_address  # plain JSON, ready to encode


def test_no_payload_is_an_empty_object_for_a_model_of_defaults(kinds):
    kinds("unit.defaults", Everything)
    assert payload_for_enqueue("unit.defaults", None) == {"note": "none"}
    assert handler_payload(REGISTRY.get("unit.defaults"), None) == Everything()


MIXED = {"order_id": 1, "tags": ["a", 2], "address": {"zip": "1"}}


# the words after each location are pydantic's (pydantic_says); the rest of each line is ours
@pytest.mark.parametrize("payload, message", [
    ({"qty": 2}, lambda: "payload of unit.typed: 1 validation error for Order: order_id: "
                         f"{pydantic_says(Order, {'qty': 2}, 'order_id')}"),
    ({"order_id": "x"}, lambda: "payload of unit.typed: 1 validation error for Order: order_id: "
                                f"{pydantic_says(Order, {'order_id': 'x'}, 'order_id')} (input: 'x')"),
    (MIXED, lambda: "payload of unit.typed: 3 validation errors for Order: "
                    f"address.city: {pydantic_says(Order, MIXED, 'address', 'city')}; "
                    f"address.zip: {pydantic_says(Order, MIXED, 'address', 'zip')} (input: '1'); "
                    f"tags[1]: {pydantic_says(Order, MIXED, 'tags', 1)} (input: 2)"),
    ([1, 2], lambda: f"payload of unit.typed: 1 validation error for Order: (payload): "
                     f"{pydantic_says(Order, [1, 2])} (input: [1, 2])"),
    (Unrelated(order_id=3), lambda: "payload of unit.typed: 1 validation error for Order: (payload): "
                                    f"{pydantic_says(Order, Unrelated(order_id=3))} (input: Unrelated(order_id=3))"),
], ids=["missing", "not-an-integer", "three-at-once", "not-an-object", "another-model"])
def test_enqueue_refuses_a_payload_its_model_refuses_in_one_line(kinds, payload, message):
    kinds("unit.typed", Order)
    with pytest.raises(InvalidInput) as refused:
        payload_for_enqueue("unit.typed", payload)
    assert str(refused.value) == message()


def test_an_instance_built_without_validation_is_checked_too(kinds):
    kinds("unit.typed", Order)
    with pytest.raises(InvalidInput) as refused:
        payload_for_enqueue("unit.typed", Order.model_construct(order_id="not a number"))
    assert str(refused.value) == ("payload of unit.typed: 1 validation error for Order: order_id: "
                                  f"{pydantic_says(Order, {'order_id': 'not a number'}, 'order_id')} "
                                  "(input: 'not a number')")


def test_a_form_the_model_refuses_at_run_is_refused_at_enqueue(kinds):
    """What is stored must validate when the worker reads it back: a serializer that writes a form
    its own field refuses is an enqueue error, not a task failed later."""

    class Lossy(BaseModel):
        count: int

        @field_serializer("count")
        def as_words(self, value: int) -> str:
            return f"{value} items"

    kinds("unit.lossy", Lossy)
    with pytest.raises(InvalidInput) as refused:
        payload_for_enqueue("unit.lossy", {"count": 3})
    assert str(refused.value).endswith(f"count: {pydantic_says(Lossy, {'count': '3 items'}, 'count')} "
                                       "(input: '3 items')")


def test_long_messages_stay_bounded_and_on_one_line(kinds):
    class Many(BaseModel):
        values: list[int]

    kinds("unit.many", Many)
    with pytest.raises(InvalidInput) as refused:
        payload_for_enqueue("unit.many", {"values": ["x\ny" * 100] * 50})
    text = str(refused.value)
    assert "\n" not in text and text.endswith(f"and {50 - ERRORS_SHOWN} more")
    assert text.count(pydantic_says(Many, {"values": ["x"]}, "values", 0)) == ERRORS_SHOWN and len(text) < 2000


def test_untyped_kinds_pass_payloads_through_and_dump_model_instances(kinds):
    kinds("unit.plain")
    payload = {"anything": [1, "two"]}
    assert payload_for_enqueue("unit.plain", payload) is payload
    assert payload_for_enqueue("unit.unknown", None) is None
    assert payload_for_enqueue("unit.plain", Order(order_id=1, tags=["a"])) == \
        {"order_id": 1, "qty": 1, "address": None, "tags": ["a"]}


def test_enqueue_many_validates_each_payload_and_names_the_refused_one(kinds):
    kinds("unit.typed", Order)
    kinds("unit.plain")
    assert payloads_for_enqueue("unit.typed", [{"order_id": "1"}, Order(order_id=2)]) == \
        [{"order_id": 1, "qty": 1, "address": None, "tags": []}, {"order_id": 2, "qty": 1, "address": None, "tags": []}]
    with pytest.raises(InvalidInput) as refused:
        payloads_for_enqueue("unit.typed", [{"order_id": 1}, {"order_id": 2}, {"qty": 3}])
    assert str(refused.value) == ("payloads[2] of unit.typed: 1 validation error for Order: order_id: "
                                  f"{pydantic_says(Order, {'qty': 3}, 'order_id')}")
    plain = [{"a": 1}, None]
    assert payloads_for_enqueue("unit.plain", plain) == plain
    assert payloads_for_enqueue("unit.plain", [Order(order_id=5), {"a": 1}]) == \
        [{"order_id": 5, "qty": 1, "address": None, "tags": []}, {"a": 1}]


def test_the_handler_gets_a_model_instance_or_the_run_fails(kinds):
    kinds("unit.typed", Order)
    definition = REGISTRY.get("unit.typed")
    order = handler_payload(definition, {"order_id": "5", "address": {"city": "Oslo", "zip": "01500"}})
    assert order == Order(order_id=5, address=Address(city="Oslo", zip="01500"))
    with pytest.raises(Fail) as failed:
        handler_payload(definition, {"order_id": 5, "qty": "many"})
    assert str(failed.value) == ("payload of unit.typed: 1 validation error for Order: qty: "
                                 f"{pydantic_says(Order, {'order_id': 5, 'qty': 'many'}, 'qty')} (input: 'many')")


def test_describe_names_the_model_and_each_location():
    with pytest.raises(Exception) as caught:
        Order.model_validate({})
    assert describe(caught.value) == f"1 validation error for Order: order_id: {pydantic_says(Order, {}, 'order_id')}"


def _run_fresh(code: str) -> dict:
    """Run `code` in a new interpreter from the repository root; it prints one JSON line."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_untyped_use_never_imports_pydantic():
    """`import skiplock`, untyped kinds, their enqueue path and the worker's and the API's modules
    leave pydantic unloaded: it is an optional extra."""
    seen = _run_fresh("""
        import json, sys
        import skiplock
        after_import = "pydantic" in sys.modules
        from skiplock.engine.payload_types import payload_for_enqueue
        from skiplock.worker.worker import Worker
        from skiplock.worker.executor import Executor
        from skiplock.api.app import create_app
        from skiplock.api import kinds
        import tests.support.pydantic_probe

        @skiplock.task("fresh.plain")
        def plain(ctx, payload):
            return payload

        from skiplock.engine.payload_types import payloads_for_enqueue
        many = [{"b": 2}]
        assert payloads_for_enqueue("fresh.plain", many) is many
        stored = payload_for_enqueue("fresh.plain", {"a": 1}), payload_for_enqueue("fresh.unknown", None)
        print(json.dumps({"after_import": after_import, "stored": stored, "at_end": "pydantic" in sys.modules}))
    """)
    assert seen == {"after_import": False, "stored": [{"a": 1}, None], "at_end": False}


def test_a_typed_kind_loads_pydantic_only_through_its_model():
    seen = _run_fresh("""
        import json, sys
        import tests.support.typed_handlers
        from skiplock.engine.payload_types import payload_for_enqueue
        print(json.dumps({"loaded": "pydantic" in sys.modules,
                          "stored": payload_for_enqueue("typed.order", {"order_id": "3"})}))
    """)
    assert seen == {"loaded": True, "stored": {"order_id": 3, "qty": 1, "address": None, "tags": []}}
