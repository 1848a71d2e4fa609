"""A Flask app that enqueues a skiplock task in the request's own transaction.

POST /orders {"item": ..., "quantity": ...} writes the order, enqueues its receipt and takes the
quantity from stock, all on one pooled psycopg connection in one transaction: the task exists if
and only if the order does. Run it with `flask --app app run`; DATABASE_URL names the database.
"""

from __future__ import annotations

import os

import psycopg
from flask import Flask, jsonify, request
from psycopg_pool import ConnectionPool

import skiplock


def create_app(database_url: str | None = None) -> Flask:
    app = Flask(__name__)
    pool = ConnectionPool(database_url or os.environ["DATABASE_URL"], min_size=1, max_size=4, open=True)

    @app.post("/orders")
    def place_order():
        body = request.get_json()
        try:
            # the pool's connection block is one transaction: it commits when the block ends and
            # rolls back if anything in it raises, the enqueue included
            with pool.connection() as conn:
                order_id = conn.execute("INSERT INTO orders (item, quantity) VALUES (%s, %s) RETURNING id",
                                        (body["item"], body["quantity"])).fetchone()[0]
                task_id = skiplock.enqueue(conn, "shop.send_receipt", {"order_id": order_id})
                conn.execute("UPDATE stock SET available = available - %s WHERE item = %s",
                             (body["quantity"], body["item"]))
        except psycopg.errors.CheckViolation:
            # not enough in stock: the order and its receipt task were rolled back together
            return jsonify(error=f"not enough {body['item']} in stock"), 409
        return jsonify(order_id=order_id, task_id=str(task_id)), 201

    return app
