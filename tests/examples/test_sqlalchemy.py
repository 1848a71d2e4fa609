"""examples/sqlalchemy: a real SQLAlchemy 2 engine (postgresql+psycopg) and ORM session, a real
worker, the test's database."""

from __future__ import annotations

import importlib.util
import sys

import psycopg
import pytest
from sqlalchemy import URL, create_engine

from tests.examples import shop as shop_mod


@pytest.fixture
def checkout():
    """examples/sqlalchemy/checkout.py, imported by its path (examples/ is not a package)."""
    spec = importlib.util.spec_from_file_location("example_sqlalchemy_checkout",
                                                  shop_mod.EXAMPLES / "sqlalchemy" / "checkout.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # the mapped classes' annotations are resolved in it by name
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


@pytest.fixture
def engine(db_url):
    params = psycopg.conninfo.conninfo_to_dict(db_url)
    engine = create_engine(URL.create("postgresql+psycopg", username=params.get("user"),
                                      password=params.get("password"), host=params.get("host"),
                                      port=params.get("port"), database=params["dbname"]))
    yield engine
    engine.dispose()


def test_an_order_commits_with_its_task_and_a_refused_one_leaves_neither(shop, db_url, processes, checkout, engine):
    shop_mod.start_worker(processes, db_url, "sqlalchemy")

    def place(quantity: int):
        try:
            return checkout.place_order(engine, "widget", quantity)[1]
        except checkout.OutOfStock:
            return None

    shop_mod.check_order_flow(shop, place)
