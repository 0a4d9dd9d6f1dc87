# The one entry point: CI and hooks call these targets, never their own commands.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install run dev test test-fast lint check-deploy bench clean task-clients

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
	$(BIN)/ruff check worker tests benchmarks deploy
	$(BIN)/ruff format --check worker tests benchmarks deploy
	$(BIN)/mypy

# The dashboard and alerting rules under deploy/: promtool's checks and unit tests of the alerts, and
# every metric they name is one the worker or the gateway exports. promtool comes from Debian's
# prometheus package, unpacked into the venv when it is not on PATH (installing the package would start
# a Prometheus server).
PROMTOOL := $(or $(shell command -v promtool),$(VENV)/tools/promtool)

check-deploy: install $(PROMTOOL)
	$(PROMTOOL) check rules deploy/prometheus/toolworker-alerts.yml
	$(PROMTOOL) test rules deploy/prometheus/toolworker-alerts.test.yml
	$(BIN)/python deploy/check.py --promtool $(PROMTOOL)

$(VENV)/tools/promtool:
	rm -rf $(VENV)/tools/deb && mkdir -p $(VENV)/tools/deb
	cd $(VENV)/tools/deb && { apt-get download prometheus || { apt-get update -qq && apt-get download prometheus; }; }
	dpkg-deb -x $(VENV)/tools/deb/prometheus_*.deb $(VENV)/tools/deb/root
	cp $(VENV)/tools/deb/root/usr/bin/promtool $@
	rm -rf $(VENV)/tools/deb

# A real OpenID Provider for the gateway's OAuth tests (tests/support/oidc_server.mjs): oidc-provider from
# npm, into the venv's own folder. The 8.x line runs on Node 20 (9.x asks for Node 22).
OIDC_PROVIDER := $(VENV)/node/node_modules/oidc-provider/package.json

$(OIDC_PROVIDER):
	npm install --prefix $(VENV)/node --no-audit --no-fund --loglevel=error oidc-provider@8

# Real MCP task clients for tests/test_mcp_tasks.py, each in a virtual environment of its own under the
# venv (their `mcp` versions differ from ours): FastMCP 4's SEP-2663 client (4.1.2: later 4.1.x want a
# certifi the registry lacks) and the `mcp` SDK 1.x's experimental 2025-11-25 task API (1.30, the last).
TASK_CLIENTS := $(VENV)/task-clients
FASTMCP_TASKS := $(TASK_CLIENTS)/fastmcp4/.installed
MCP_V1 := $(TASK_CLIENTS)/mcp1/.installed

task-clients: $(FASTMCP_TASKS) $(MCP_V1)

$(FASTMCP_TASKS):
	rm -rf $(TASK_CLIENTS)/fastmcp4 && $(PYTHON) -m venv $(TASK_CLIENTS)/fastmcp4
	$(TASK_CLIENTS)/fastmcp4/bin/python -m pip install --quiet 'fastmcp[tasks]==4.1.2'
	touch $@

$(MCP_V1):
	rm -rf $(TASK_CLIENTS)/mcp1 && $(PYTHON) -m venv $(TASK_CLIENTS)/mcp1
	$(TASK_CLIENTS)/mcp1/bin/python -m pip install --quiet 'mcp==1.30.*'
	touch $@

test: install lint check-deploy $(OIDC_PROVIDER) task-clients
	$(BIN)/pytest

test-fast: install
	$(BIN)/pytest -m "not integration"

bench: install
	$(BIN)/python -m benchmarks.run

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
