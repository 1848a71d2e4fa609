"""Property-based fuzzing of the API from its own OpenAPI document (schemathesis), through the
real WSGI app against real Postgres: with an admin token no request gets a 5xx; without a token
every route except the probes, /metrics and the document answers 401. Bounded (few examples per
operation, no example database) so it stays a few seconds."""

from __future__ import annotations

import re

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from skiplock.api.app import close_app, create_app
from tests.integration.test_api import TOKENS, api_settings

PUBLIC = {"/", "/v1/", "/healthz", "/readyz", "/metrics", "/v1/openapi.json"}


def fuzz(app, check, *, headers: dict, max_examples: int) -> dict[tuple[str, str], int]:
    """Run `check(case, response)` on generated requests for every operation; returns how many
    requests each operation (method, path) got."""
    loaded = schemathesis.openapi.from_wsgi("/v1/openapi.json", app)
    operations = [result.ok() for result in loaded.get_all_operations()]
    sent: dict[tuple[str, str], int] = {}
    for operation in operations:
        sent[(operation.method.upper(), operation.path)] = 0

        @given(case=operation.as_strategy())
        @settings(max_examples=max_examples, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        def run(case):
            sent[(case.operation.method.upper(), case.operation.path)] += 1
            check(case, case.call(headers=headers))

        run()
    return sent


def documented_operations(app) -> set[tuple[str, str]]:
    """(method, path) of every operation in the API's own OpenAPI document."""
    with app.test_client() as client:
        document = client.get("/v1/openapi.json").get_json()
    methods = {"get", "put", "post", "delete", "patch", "head", "options"}
    return {(method.upper(), path) for path, item in document["paths"].items() for method in item if method in methods}


def routed_operations(app) -> set[tuple[str, str]]:
    """(method, path) of every route the app serves, in OpenAPI's path syntax."""
    return {(method, re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", rule.rule))
            for rule in app.url_map.iter_rules() for method in rule.methods - {"HEAD", "OPTIONS"}}


def assert_every_operation_fuzzed(app, sent: dict[tuple[str, str], int]) -> None:
    """Every documented operation got requests. Whether schemathesis fuzzes the document it loaded
    from is its own choice (the releases differ), so only that one may be missing."""
    documented = documented_operations(app)
    assert documented == routed_operations(app), "the document and the routes differ"
    assert set(sent) <= documented
    assert documented - set(sent) <= {("GET", "/v1/openapi.json")}, sorted(documented - set(sent))
    assert all(sent.values()), sorted(key for key, count in sent.items() if not count)


@pytest.fixture
def app(db_url):
    # the fuzzer sends wrong tokens by the hundred from one address: the throttle (tested in
    # tests/acceptance/test_auth_throttle.py) would answer 429 where these tests check each route's 401
    app = create_app(api_settings(db_url, api_max_auth_failures=0))
    yield app
    close_app(app)


def test_no_5xx_with_an_admin_token(app):
    def check(case, response):
        assert response.status_code < 500, (case.method, case.formatted_path, response.text[:500])

    sent = fuzz(app, check, headers={"Authorization": f"Bearer {TOKENS['admin']}"}, max_examples=12)
    assert_every_operation_fuzzed(app, sent)


def test_without_a_token_only_the_probes_answer(app):
    def check(case, response):
        if case.operation.path in PUBLIC:
            assert response.status_code < 500
        else:
            assert response.status_code == 401, (case.method, case.formatted_path, response.text[:300])
            assert response.json()["error"]["code"] == "auth.unauthorized"

    assert_every_operation_fuzzed(app, fuzz(app, check, headers={}, max_examples=4))
