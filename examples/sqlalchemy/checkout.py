"""Placing an order with SQLAlchemy 2: the order, its receipt task and the stock update in one
Session transaction.

The engine uses the psycopg (3) dialect, `postgresql+psycopg://...`; the psycopg connection under
the session's transaction is `session.connection().connection.driver_connection`, which
skiplock.enqueue writes into.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import CheckConstraint, Engine, ForeignKey, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import skiplock


class Base(DeclarativeBase):
    pass


class Stock(Base):
    __tablename__ = "stock"
    __table_args__ = (CheckConstraint("available >= 0"),)
    item: Mapped[str] = mapped_column(primary_key=True)
    available: Mapped[int]


class Order(Base):
    __tablename__ = "orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    item: Mapped[str] = mapped_column(ForeignKey("stock.item"))
    quantity: Mapped[int]
    reference: Mapped[str | None] = mapped_column(unique=True)
    receipt_sent_at: Mapped[datetime | None]


class OutOfStock(Exception):
    pass


def place_order(engine: Engine, item: str, quantity: int) -> tuple[int, uuid.UUID]:
    """Returns (order id, receipt task id); raises OutOfStock, leaving neither."""
    try:
        with Session(engine) as session, session.begin():  # commits at the end, rolls back on an exception
            order = Order(item=item, quantity=quantity)
            session.add(order)
            session.flush()  # the INSERT runs now, so the order has its id
            order_id = order.id
            driver_conn = session.connection().connection.driver_connection
            task_id = skiplock.enqueue(driver_conn, "shop.send_receipt", {"order_id": order_id})
            session.execute(update(Stock).where(Stock.item == item).values(available=Stock.available - quantity))
    except IntegrityError as exc:
        # the stock's CHECK (or no such item): the order and its task were rolled back together
        raise OutOfStock(f"not enough {item} in stock") from exc
    return order_id, task_id
