# Every target that runs code first makes .venv from pyproject.toml (once, and again when
# pyproject.toml changes), so a fresh clone needs nothing but Python 3.10+. `make run`
# installs only what serving needs; the other targets add the development tools.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
SERVE_STAMP := $(VENV)/.serve-installed
STAMP  := $(VENV)/.installed
# The npm packages of the contract test (tests/contract/package-lock.json).
CONTRACT := tests/contract
CONTRACT_STAMP := $(CONTRACT)/node_modules/.delayq-installed
HOST   ?= 127.0.0.1
PORT   ?= 8080

.PHONY: run docs test test-redis-low test-serve-low lint bench mutate mutants clean contract-deps

$(BIN)/python:
	@echo "make: creating $(VENV) (first run only)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(SERVE_STAMP): pyproject.toml | $(BIN)/python
	@echo "make: installing delayq with its server into $(VENV)"
	$(BIN)/python -m pip install --progress-bar off -e '.[serve]'
	$(BIN)/python -c "import delayq.server"
	touch $(SERVE_STAMP)

$(STAMP): pyproject.toml | $(BIN)/python
	@echo "make: installing delayq with its development tools into $(VENV)"
	$(BIN)/python -m pip install --progress-bar off -e '.[dev]'
	$(BIN)/python -c "import delayq.server, pytest, mypy"
	touch $(STAMP) $(SERVE_STAMP)

run: $(SERVE_STAMP)
	$(BIN)/delayq serve --url sqlite:///delayq.db --host $(HOST) --port $(PORT)

# The documentation site (mkdocs.yml), built strictly (a broken link or reference
# fails) into site/: open site/index.html, no server needed.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

# Without npm the contract test is skipped (and fails when $$CI is set).
$(CONTRACT_STAMP): $(CONTRACT)/package-lock.json
	@if command -v npm >/dev/null; then \
	  echo "make: installing $(CONTRACT)'s npm packages (npm ci)"; \
	  npm ci --prefix $(CONTRACT) --no-audit --no-fund --loglevel=error && touch $@; \
	else \
	  echo "make: npm is missing, so tests/contract is skipped (Node.js 20.19+ brings it)"; \
	fi

contract-deps: $(CONTRACT_STAMP)

# The suite runs in TEST_JOBS processes (pytest-xdist), each test file in one of them, so
# a file's module fixtures (a private cluster, a server) start once, the longest files
# first (tests/conftest.py; xdist's own order, most tests first, is turned off);
# TEST_JOBS=0 runs it in this process. Four, even on two cores: most of a test's time
# is spent waiting (a server, a subprocess, a lease or a deadline), so while one process
# waits another computes. The 25 slowest tests are listed at the end: the suite must stay under 15
# minutes.
TEST_JOBS ?= 4

test: $(STAMP) $(CONTRACT_STAMP)
	$(BIN)/python -m pytest -n $(TEST_JOBS) --dist loadfile --no-loadscope-reorder \
	  --durations=25 $(PYTEST_ARGS)

# The Redis suites against the lowest redis-py of pyproject.toml's range (REDIS_LOW), in
# a venv of their own inside .venv (made once, again when pyproject.toml changes).
REDIS_LOW  := 6.2.0
LOW_VENV   := $(VENV)/redis-low
LOW_STAMP  := $(LOW_VENV)/.installed-$(REDIS_LOW)

$(LOW_STAMP): pyproject.toml
	@echo "make: installing delayq with redis-py $(REDIS_LOW) into $(LOW_VENV)"
	$(PYTHON) -m venv $(LOW_VENV)
	$(LOW_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(LOW_VENV)/bin/python -m pip install --progress-bar off -e '.[dev]' 'redis[hiredis]==$(REDIS_LOW)'
	touch $(LOW_STAMP)

test-redis-low: $(LOW_STAMP)
	DELAYQ_REQUIRE=redis $(LOW_VENV)/bin/python -m pytest -q -n $(TEST_JOBS) --dist loadfile \
	  tests/conformance -k redis tests/backends/test_redis*.py $(PYTEST_ARGS)

# The server's suites against the lowest FastAPI, Starlette, uvicorn and httptools of
# pyproject.toml's ranges (the server subclasses and calls into their internals), in a
# venv of their own inside .venv (made once, again when pyproject.toml changes).
SERVE_LOW       := fastapi==0.110.1 starlette==0.37.2 uvicorn==0.29.0 httptools==0.6.0
SERVE_LOW_VENV  := $(VENV)/serve-low
SERVE_LOW_STAMP := $(SERVE_LOW_VENV)/.installed

$(SERVE_LOW_STAMP): pyproject.toml Makefile
	@echo "make: installing delayq with $(SERVE_LOW) into $(SERVE_LOW_VENV)"
	$(PYTHON) -m venv $(SERVE_LOW_VENV)
	$(SERVE_LOW_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(SERVE_LOW_VENV)/bin/python -m pip install --progress-bar off -e '.[dev]' $(SERVE_LOW)
	touch $(SERVE_LOW_STAMP)

test-serve-low: $(SERVE_LOW_STAMP)
	$(SERVE_LOW_VENV)/bin/python -m pytest -q -n $(TEST_JOBS) --dist loadfile \
	  tests/server tests/cli/test_serve*.py tests/e2e/test_dashboard_browser.py $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples scripts
	$(BIN)/ruff format --check src tests benchmarks examples scripts
	$(BIN)/python scripts/unasync.py --check
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/durable/test_twins.py
	$(BIN)/python scripts/private_access.py
	$(BIN)/python scripts/backend_names.py
	$(BIN)/mypy --strict src
	$(BIN)/lint-imports

bench: $(STAMP)
	$(BIN)/python benchmarks/inproc.py

# Mutation testing of the pure core ([tool.mutmut] in pyproject.toml; docs/testing.md):
# each mutant against the unit tests that call the mutated function, then the survivors.
# Not part of .ci/run (about half an hour on 2 busy cores). mutants/ keeps the results: a
# second run redoes only what changed.
# The stores' model tests run 30 examples per mutant (120 in the suite).
mutate: $(STAMP)
	DELAYQ_HYPOTHESIS_EXAMPLES=30 $(BIN)/mutmut run --max-children $(or $(MUTATE_JOBS),2)
	$(BIN)/mutmut results

# The bank of hand-written mutations of the I/O code (tests/mutations/bank.toml,
# docs/testing.md): each applied to a copy of src/, its tests run, one at a time. Not
# part of .ci/run (about six minutes on two cores). MUTANTS_ARGS="--only ID" runs one entry.
mutants: $(STAMP)
	$(BIN)/python scripts/mutants.py $(MUTANTS_ARGS)

clean:
	rm -rf $(VENV) site .pytest_cache .mypy_cache .ruff_cache mutants $(CONTRACT)/node_modules \
	  $(CONTRACT)/generated $(CONTRACT)/build
