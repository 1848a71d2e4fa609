"""A FastAPI app that enqueues a skiplock task with asyncio, in a transaction its dependency manages.

POST /orders {"item": ..., "quantity": ...} writes the order, awaits skiplock.enqueue_async for its
receipt and takes the quantity from stock, all on one pooled psycopg AsyncConnection in one
transaction: the task exists if and only if the order does. Run it with `uvicorn app:app`;
DATABASE_URL names the database.
"""

from __future__ import annotations

import os
from contextlib import asynccontextmanager
from typing import Annotated

import psycopg
from fastapi import Depends, FastAPI, HTTPException, Request
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel, Field

import skiplock


@asynccontextmanager
async def lifespan(app: FastAPI):
    async with AsyncConnectionPool(os.environ["DATABASE_URL"], min_size=1, max_size=4, open=False) as pool:
        app.state.pool = pool
        yield


app = FastAPI(lifespan=lifespan)


async def transaction(request: Request):
    """The request's transaction: one pooled connection, committed when the endpoint returns and
    rolled back if it raises (an HTTPException included)."""
    async with request.app.state.pool.connection() as conn:
        yield conn


# scope="function": the dependency ends (commits) before the response is sent, so a client
# that got its 201 can count on the order and its task being there
Transaction = Annotated[psycopg.AsyncConnection, Depends(transaction, scope="function")]


class NewOrder(BaseModel):
    item: str
    quantity: int = Field(gt=0)


@app.post("/orders", status_code=201)
async def place_order(order: NewOrder, conn: Transaction):
    cursor = await conn.execute("INSERT INTO orders (item, quantity) VALUES (%s, %s) RETURNING id",
                                (order.item, order.quantity))
    order_id = (await cursor.fetchone())[0]
    task_id = await skiplock.enqueue_async(conn, "shop.send_receipt", {"order_id": order_id})
    try:
        await conn.execute("UPDATE stock SET available = available - %s WHERE item = %s",
                           (order.quantity, order.item))
    except psycopg.errors.CheckViolation:
        # raised through the dependency, which rolls the order and its task back together
        raise HTTPException(409, f"not enough {order.item} in stock") from None
    return {"order_id": order_id, "task_id": str(task_id)}
