# Every target that runs code first makes .venv from pyproject.toml (once, and again when
# pyproject.toml changes), so a fresh clone needs nothing but Python 3.10+.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/delayq serve --url sqlite:///delayq.db

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples scripts
	$(BIN)/ruff format --check src tests benchmarks examples scripts
	$(BIN)/python scripts/unasync.py --check
	$(BIN)/mypy --strict src

bench: $(STAMP)
	$(BIN)/python benchmarks/inproc.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
