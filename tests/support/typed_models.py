"""Pydantic models of the typed-payload tests, apart from any @task: importing them registers no
kind (tests/support/typed_handlers.py declares the kinds)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class Address(BaseModel):
    city: str
    zip: str = Field(pattern=r"^[0-9]{5}$")


class Order(BaseModel):
    order_id: int
    qty: int = 1
    address: Address | None = None
    tags: list[str] = []
