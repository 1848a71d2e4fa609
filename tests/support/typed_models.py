"""Pydantic models of the typed-payload tests, apart from any @task: importing them registers no
kind (tests/support/typed_handlers.py declares the kinds)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, ValidationError


class Address(BaseModel):
    city: str
    zip: str = Field(pattern=r"^[0-9]{5}$")


class Order(BaseModel):
    order_id: int
    qty: int = 1
    address: Address | None = None
    tags: list[str] = []


def pydantic_says(model: type[BaseModel], data: Any, *loc: str | int) -> str:
    """pydantic's own words for the error at `loc` when `model` validates `data`, read from the
    installed pydantic itself. The tests compare skiplock's framing of a validation error (kind,
    count, model, location, input) exactly and take the words from here: they are pydantic's, and
    a release may reword them."""
    try:
        model.model_validate(data)
    except ValidationError as exc:
        messages = {tuple(error["loc"]): error["msg"] for error in exc.errors()}
        assert loc in messages, f"{model.__name__} refuses {data!r}, but not at {loc}: {messages}"
        return messages[loc]
    raise AssertionError(f"{model.__name__} accepts {data!r}")
