# The one entry point: CI and hooks call these targets, never their own commands.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install run dev test test-fast lint bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: install
	$(BIN)/toolworker dev

dev: run

lint: install
	$(BIN)/ruff check worker tests
	$(BIN)/ruff format --check worker tests
	$(BIN)/mypy

test: install lint
	$(BIN)/pytest

test-fast: install
	$(BIN)/pytest -m "not integration"

bench: install
	$(BIN)/python -m benchmarks.run

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
