"""Property-based fuzzing of the API from its own OpenAPI document (schemathesis), through the
real WSGI app against real Postgres: with an admin token no request gets a 5xx; without a token
every route except the probes, /metrics and the document answers 401. Bounded (few examples per
operation, no example database) so it stays a few seconds."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from skiplock.api.app import close_app, create_app
from tests.integration.test_api import TOKENS, api_settings

PUBLIC = {"/", "/v1/", "/healthz", "/readyz", "/metrics", "/v1/openapi.json"}


def fuzz(app, check, *, headers: dict, max_examples: int) -> int:
    """Run `check(case, response)` on generated requests for every operation; returns how many
    operations were fuzzed."""
    loaded = schemathesis.openapi.from_wsgi("/v1/openapi.json", app)
    operations = [result.ok() for result in loaded.get_all_operations()]
    for operation in operations:
        @given(case=operation.as_strategy())
        @settings(max_examples=max_examples, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        def run(case):
            check(case, case.call(headers=headers))

        run()
    return len(operations)


@pytest.fixture
def app(db_url):
    app = create_app(api_settings(db_url))
    yield app
    close_app(app)


def test_no_5xx_with_an_admin_token(app):
    def check(case, response):
        assert response.status_code < 500, (case.method, case.formatted_path, response.text[:500])

    fuzzed = fuzz(app, check, headers={"Authorization": f"Bearer {TOKENS['admin']}"}, max_examples=12)
    # every route but the document itself, which schemathesis leaves out
    assert fuzzed == len(list(app.url_map.iter_rules())) - 1


def test_without_a_token_only_the_probes_answer(app):
    def check(case, response):
        if case.operation.path in PUBLIC:
            assert response.status_code < 500
        else:
            assert response.status_code == 401, (case.method, case.formatted_path, response.text[:300])
            assert response.json()["error"]["code"] == "auth.unauthorized"

    fuzz(app, check, headers={}, max_examples=4)
