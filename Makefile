# The two commands of the README: `make dev` and `make test`. Both work on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: dev test bench tools clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,test]'
	touch $(STAMP)

## dev: embedded Postgres (unless SKIPLOCK_DATABASE_URL is set), migrations, worker, demo workload
dev: $(STAMP)
	$(VENV)/bin/skiplock dev

## test: the whole suite against a real Postgres (found or started; see tests/pgcluster.py)
test: $(STAMP) tools
	$(PY) tests/pgcluster.py url >/dev/null || echo "no Postgres reachable: the suite starts a throwaway cluster"
	$(PY) -m pytest

## tools: command-line tools the tests call (promtool)
tools:
	@scripts/install-test-tools

## bench: side-by-side benchmark with PgQueuer, Procrastinate and a raw SKIP LOCKED loop (report only)
bench: $(STAMP)
	$(PY) -m pip install --quiet -r tests/benchmarks/requirements.txt
	$(PY) -m tests.benchmarks.run

clean:
	rm -rf $(VENV) .skiplock .pytest_cache
