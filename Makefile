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

.PHONY: demo test test-long lint typecheck pytest lock clean

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
	$(BIN)/python -m pytest -q

test: lint typecheck pytest

# The fault-injection and fuzz suites at full size; figures go to fault-report.json.
test-long: $(STAMP)
	$(BIN)/python -m pytest -q tests/faults --long --fault-report fault-report.json

# Re-resolve pyproject.toml's test extra from the package index and rewrite the pins.
lock: | $(BIN)/python
	$(BIN)/python .ci/lock.py --extras test --output $(CONSTRAINTS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
