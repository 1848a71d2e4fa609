# The two commands of the README: `make dev` and `make test`. Both work on a fresh machine.
# `make check` is the inner loop: the fast part of the suite, under 4 minutes on a quiet 2-core machine (3 m 30 s measured).
# Every install comes from uv.lock, pinned with hashes (`make lock` refreshes it): .venv starts with
# uv and pip from requirements/bootstrap.txt, then `uv sync` makes it exactly one of these sets:
# `dev` the package and the embedded Postgres, `test` also the test extras (Helm, Kubernetes'
# schemas, hypothesis, mkdocs, ...), `bench` also the peers measured. Each target first checks that
# the lock still matches pyproject.toml (scripts/lock check: one line when it does not).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
UV     := $(VENV)/bin/uv
DEV_STAMP   := $(VENV)/.installed-dev
TEST_STAMP  := $(VENV)/.installed-test
BENCH_STAMP := $(VENV)/.installed-bench
export UV_PROJECT_ENVIRONMENT := $(abspath $(VENV))
# the machine's Python, never one uv would download
export UV_PYTHON_DOWNLOADS := never
SYNC := $(UV) sync --frozen --quiet --group tools --group build
# Django 6's task framework (skiplock.contrib.django) needs Python >= 3.12, and .venv is the
# machine's python3 (3.11 here): tests/django run in a venv of their own, the same test set from
# the same lock on pyenv's 3.12 (or PYTHON312=/path/to/python3.12)
PYTHON312 ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python3 $(shell pyenv root 2>/dev/null)/versions/3.12*/bin/python3) $(shell command -v python3.12))
DJANGO_VENV := .venv-django
DJANGO_STAMP := $(DJANGO_VENV)/.installed-test
AXE_STAMP   := tests/browser/node_modules/.installed

.PHONY: dev test check bench tools clean lock lock-check

$(UV):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --require-hashes --no-deps -r requirements/bootstrap.txt

lock-check: | $(UV)
	@UV=$(UV) scripts/lock check

## lock: resolve pyproject.toml again at the newest releases into uv.lock and its exports
lock: | $(UV)
	UV=$(UV) scripts/lock refresh

$(DEV_STAMP): pyproject.toml uv.lock | lock-check
	$(SYNC) --extra dev
	touch $@

# the test set includes dev's, so a venv made by `make test` serves `make dev` as it is
$(TEST_STAMP): pyproject.toml uv.lock | lock-check
	$(SYNC) --extra dev --extra test
	touch $@ $(DEV_STAMP)

$(BENCH_STAMP): pyproject.toml uv.lock | lock-check
	$(SYNC) --extra dev --extra test --extra bench
	touch $@ $(DEV_STAMP) $(TEST_STAMP)

$(DJANGO_STAMP): pyproject.toml uv.lock | lock-check
	@test -n "$(PYTHON312)" || { echo "tests/django need Python 3.12 for Django 6: install it (pyenv install 3.12) or set PYTHON312=/path/to/python3.12" >&2; exit 1; }
	UV_PROJECT_ENVIRONMENT=$(abspath $(DJANGO_VENV)) $(SYNC) --python $(PYTHON312) --extra dev --extra test
	touch $@

## dev: embedded Postgres (unless SKIPLOCK_DATABASE_URL is set), migrations, worker, demo workload
dev: lock-check $(DEV_STAMP)
	$(VENV)/bin/skiplock dev

## test: the whole suite against a real Postgres (found or started; see tests/pgcluster.py), on
## several cores (pytest-xdist: -n and --dist in pyproject.toml's addopts), slowest tests listed;
## then tests/django (Django 6's task framework) on Python 3.12, in .venv-django
test: lock-check $(TEST_STAMP) $(DJANGO_STAMP) tools $(AXE_STAMP)
	$(PY) tests/pgcluster.py url >/dev/null || echo "no Postgres reachable: the suite starts a throwaway cluster"
	$(PY) -m pytest
	$(DJANGO_VENV)/bin/python -m pytest tests/django

## check: the inner loop, under 4 minutes on a quiet 2-core machine: unit, chart render and integration tests (no apt tools)
check: lock-check $(TEST_STAMP)
	$(PY) tests/pgcluster.py url >/dev/null || echo "no Postgres reachable: the suite starts a throwaway cluster"
	$(PY) -m pytest tests/unit tests/chart/test_render.py tests/integration

## chart: print charts/skiplock's manifests and NOTES as `helm install` would install them, rendered by
## Helm's own engine (no cluster, no helm binary); VALUES="a.yaml ..." and SET="key=value ..." add values
.PHONY: chart
chart: lock-check $(TEST_STAMP)
	@$(PY) scripts/render_chart.py $(addprefix -f ,$(VALUES)) $(addprefix --set ,$(SET))

## reliability: the database-fault scenarios of tests/reliability/ at full size (`make test` runs them CI-sized)
.PHONY: reliability
reliability: lock-check $(TEST_STAMP) tools
	SKIPLOCK_RELIABILITY=full $(PY) -m pytest tests/reliability

# axe-core for the console's browser tests, from the npm registry as tests/browser's lock pins it
$(AXE_STAMP): tests/browser/package.json tests/browser/package-lock.json
	npm ci --prefix tests/browser --no-audit --no-fund --silent
	touch $@

## tools: command-line tools and servers the tests call (scripts/install-test-tools lists them), and
## Citus for tests/distributed (scripts/install-citus)
tools:
	@scripts/install-test-tools
	@scripts/install-citus

## bench: side-by-side benchmark with PgQueuer, Procrastinate and a raw SKIP LOCKED loop, then the cost
## of flow control (a drain with and without limits), of a fan-in to its parents, and durable steps
## side by side with DBOS Transact's; reports only, each on a throwaway Postgres with
## default settings (autovacuum on) unless SKIPLOCK_TEST_DATABASE_URL names one
bench: lock-check $(BENCH_STAMP)
	$(PY) -m tests.benchmarks.run
	$(PY) -m tests.benchmarks.flow_control
	$(PY) -m tests.benchmarks.workflows
	$(PY) -m tests.benchmarks.durable

## soak: 30 minutes at 60 % of one worker's measured drain rate, on a Postgres of its own with the
## default settings (autovacuum on); a table per minute, exit 1 if throughput, p99 or size drift
## (tests/benchmarks/soak.py; a report, not a test: `make test` runs a short form)
.PHONY: soak
soak: lock-check $(DEV_STAMP)
	$(PY) -m tests.benchmarks.soak

## docs: rewrite the generated tables (scripts/gen_docs.py), then build the docs site into site/
.PHONY: docs
docs: lock-check $(TEST_STAMP)
	$(PY) scripts/gen_docs.py
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

clean:
	rm -rf $(VENV) $(DJANGO_VENV) .skiplock .pytest_cache site
