# Every target works from a fresh clone: the virtual environment and the control-plane
# binaries are created on first use and reused afterwards.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
# The package directory is called operator/, which would shadow the standard library's
# `operator` module for any Python started from the repository root.
export PYTHONSAFEPATH := 1

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PKG_SOURCES := $(shell find operator -name '*.py' 2>/dev/null)

.PHONY: help dev test test-unit test-integration lint bench demo crds clean

help:
	@echo "make test     - unit, property, scenario and integration tests (sets everything up)"
	@echo "make demo     - local control plane, simulated GPU nodes, the operator and sample pods"
	@echo "make lint     - ruff, mypy --strict, import-linter"
	@echo "make bench    - scheduling latency and topology selection figures"

-include hack/control-plane.mk

$(BIN)/.deps: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip setuptools wheel
	$(BIN)/python -m pip install --quiet -e '.[test,lint]' --config-settings editable_mode=strict
	touch $@

# A strict editable install links each module by name, so new modules need a re-link.
$(BIN)/.linked: $(BIN)/.deps $(PKG_SOURCES)
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e . \
		--config-settings editable_mode=strict
	touch $@

dev: $(BIN)/.linked

test: dev control-plane-bins
	VGPU_REQUIRE_CONTROL_PLANE=1 VGPU_CONTROL_PLANE_BIN_DIR=$(CONTROL_PLANE_BIN_DIR) \
		$(BIN)/pytest

test-unit: dev
	$(BIN)/pytest -m 'not integration'

test-integration: dev control-plane-bins
	VGPU_REQUIRE_CONTROL_PLANE=1 VGPU_CONTROL_PLANE_BIN_DIR=$(CONTROL_PLANE_BIN_DIR) \
		$(BIN)/pytest -m integration

lint: dev
	$(BIN)/ruff check operator tests
	$(BIN)/ruff format --check operator tests
	$(BIN)/mypy -p vgpu_operator
	$(BIN)/lint-imports

bench: dev
	$(BIN)/python tests/bench/run.py

demo: dev control-plane-bins
	VGPU_CONTROL_PLANE_BIN_DIR=$(CONTROL_PLANE_BIN_DIR) $(BIN)/vgpu-operator demo

crds: dev
	$(BIN)/vgpu-operator crds --output crds

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis

# kubelet's device-plugin API: Python code generated from the vendored api.proto.
.PHONY: deviceplugin-api
deviceplugin-api: dev
	$(BIN)/python hack/gen-deviceplugin-api.py
