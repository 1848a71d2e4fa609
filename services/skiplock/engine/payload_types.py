"""Typed payloads: `@task("kind", payload=SomeModel)` with a pydantic model.

All of skiplock's knowledge of pydantic lives here. pydantic is an optional extra
(`skiplock[pydantic]`): nothing here imports it until a model is given, so `import skiplock`, an
enqueue of an untyped kind and a worker without typed kinds never load it. Where a check needs
pydantic's classes, it reads them from sys.modules: if pydantic is not loaded, no model and no
model instance can exist in the process.

A typed kind's payload is checked twice, at each end:
  enqueue - payload_for_enqueue() (also the API's, per submitted task; payloads_for_enqueue()
            for enqueue_many): in a process that imported the kind's definition, a model instance
            or a dict is validated and stored in its validated JSON form (defaults filled in), or
            refused with InvalidInput, and nothing is written;
  run     - handler_payload(): the worker validates the stored payload into a model instance for
            the handler. A payload that does not validate (enqueued raw, by a process that did not
            import the definition, or before the model changed) fails the task at once (Fail):
            retrying cannot change a stored payload, so a schema change never retries forever.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

from .errors import InvalidInput
from .model import Fail, TaskDef

# a validation message lists at most this many of the errors (a payload can hold thousands)
ERRORS_SHOWN = 10
# ... and shows at most this many characters of each offending input
INPUT_SHOWN = 60

# kind -> pydantic model of this process's typed kinds: REGISTRY's (registry.py), enqueue's one lookup
MODELS: dict[str, type] = {}
_MODULES = sys.modules


@dataclasses.dataclass(frozen=True)
class TypedTaskDef(TaskDef):
    """A kind whose handler takes an instance of `payload_model` (a pydantic BaseModel class)."""

    payload_model: type | None = None


def check_model(kind: str, model: Any) -> type:
    """`model` if it is a pydantic model class; else InvalidInput naming the kind."""
    pydantic = sys.modules.get("pydantic")
    if pydantic is None or not isinstance(model, type) or not issubclass(model, pydantic.BaseModel):
        raise InvalidInput(f"task {kind}: payload= must be a pydantic model class (a subclass of "
                           f"pydantic.BaseModel), not {model!r}")
    return model


def payload_model(kind: str) -> type | None:
    """The model of `kind` as registered in this process, or None (unknown or untyped)."""
    return MODELS.get(kind)


def payload_for_enqueue(kind: str, payload: Any) -> Any:
    """The payload to encode and store for a task of `kind`.

    A kind registered in this process with a model takes a model instance or a dict (None counts
    as an empty object, so a model whose fields all have defaults needs no payload) and stores its
    validated JSON form: `model_dump(mode="json")`, defaults filled in. That form is validated
    again, so what is stored is what the worker will accept (a strict model that refuses its own
    JSON form is refused here, not at run). InvalidInput("payload of <kind>: ...") when it does
    not validate. Any other kind's payload is returned as it is, except that a pydantic model
    instance is dumped to its JSON form.
    """
    model = MODELS.get(kind)  # an untyped kind's whole cost is this lookup and the next
    if model is not None:
        return _validated_json(kind, model, payload)
    pydantic = _MODULES.get("pydantic")  # not loaded: the payload cannot be a model instance
    if pydantic is not None and isinstance(payload, pydantic.BaseModel):
        return payload.model_dump(mode="json")
    return payload


def payloads_for_enqueue(kind: str, payloads: list) -> list:
    """payload_for_enqueue for each of enqueue_many's payloads; a refusal names the payload's index
    (`payloads[3] of <kind>: ...`). Untyped kinds cost one lookup for the whole list while
    pydantic is not loaded: the list itself is returned."""
    model = MODELS.get(kind)
    if model is not None:
        return [_validated_json(kind, model, payload, f"payloads[{i}] of {kind}")
                for i, payload in enumerate(payloads)]
    pydantic = _MODULES.get("pydantic")
    if pydantic is None:
        return payloads
    base = pydantic.BaseModel
    return [payload.model_dump(mode="json") if isinstance(payload, base) else payload for payload in payloads]


def _validated_json(kind: str, model: type, payload: Any, which: str | None = None) -> Any:
    from pydantic import ValidationError

    which = which or f"payload of {kind}"
    try:
        instance = payload if isinstance(payload, model) else model.model_validate(_given(payload))
        # no serializer warning: a value the model refuses is refused just below, as an error
        dumped = instance.model_dump(mode="json", warnings=False)
        model.model_validate(dumped)
    except ValidationError as exc:
        raise InvalidInput(f"{which}: {describe(exc)}") from None
    except (TypeError, ValueError) as exc:  # a field pydantic cannot dump to JSON
        raise InvalidInput(f"{which}: {type(exc).__name__}: {exc}") from None
    return dumped


def handler_payload(definition: TypedTaskDef, payload: Any) -> Any:
    """The stored `payload` as an instance of the kind's model, for its handler; Fail with the
    validation message when it does not validate (the task fails at once, without retry)."""
    from pydantic import ValidationError

    try:
        return definition.payload_model.model_validate(_given(payload))
    except ValidationError as exc:
        raise Fail(f"payload of {definition.kind}: {describe(exc)}") from None


def json_schema(definition: TaskDef) -> dict | None:
    """The JSON Schema of a kind's payload (pydantic's, for validation), or None if untyped."""
    if not isinstance(definition, TypedTaskDef):
        return None
    return definition.payload_model.model_json_schema()


def describe(exc: Any) -> str:
    """A pydantic ValidationError on one line: `2 validation errors for Order: qty: Input should
    be a valid integer (input: 'x'); address.zip: Field required`."""
    errors = exc.errors(include_url=False)
    parts = []
    for error in errors[:ERRORS_SHOWN]:
        text = f"{_location(error['loc'])}: {error['msg']}"
        if error["type"] != "missing":  # "Field required" has no input worth showing
            shown = repr(error.get("input"))
            text += f" (input: {shown if len(shown) <= INPUT_SHOWN else shown[:INPUT_SHOWN - 3] + '...'})"
        parts.append(text)
    if len(errors) > ERRORS_SHOWN:
        parts.append(f"and {len(errors) - ERRORS_SHOWN} more")
    count = exc.error_count()
    head = f"{count} validation error{'' if count == 1 else 's'} for {exc.title}"
    return " ".join(f"{head}: {'; '.join(parts)}".split())  # one line, whatever the messages hold


def _location(loc: tuple) -> str:
    """('items', 0, 'qty') -> items[0].qty; () -> (payload)"""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(payload)"


def _given(payload: Any) -> Any:
    return {} if payload is None else payload
