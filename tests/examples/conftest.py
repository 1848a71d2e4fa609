"""Fixtures of the recipes' tests: a migrated database with the example shop's tables, and app servers."""

from __future__ import annotations

import pytest

from tests.examples import shop as shop_mod


@pytest.fixture
def shop(db):
    """The test's database (skiplock migrated) with the shop's tables and stock: an autocommit connection."""
    shop_mod.create_shop(db)
    return db


@pytest.fixture
def servers(tmp_path):
    group = shop_mod.AppServers(tmp_path)
    yield group
    group.stop_all()
