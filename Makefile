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

.PHONY: help dev test test-unit test-integration lint bench demo crds chart dashboard clean gpu-check gpu-check-prepare

help:
	@echo "make test     - unit, property, scenario and integration tests (sets everything up)"
	@echo "make demo     - local control plane, simulated GPU nodes, the operator and sample pods"
	@echo "make lint     - ruff, mypy --strict, import-linter, hack/check_structure.py"
	@echo "make bench    - micro-benchmarks, then the end-to-end benchmark (docs/benchmarks.md)"
	@echo "make deviceplugin-conformance - kubelet's device manager, the harness of the device-plugin tests"
	@echo "make gpu-check - the agent, its device plugin and HAMi-core on this machine's GPU (docs/hardware.md)"
	@echo "make gpu-check-prepare - fetch what gpu-check needs into .gpu-check/ (network; before going offline)"
	@echo "make dra-conformance - kubelet's DRA manager and the CDI library, the harness of the DRA tests"
	@echo "make kueue    - Kueue's controller manager and CRDs, for the Kueue tests (docs/kueue.md)"
	@echo "make karpenter - Karpenter with its KWOK provider and CRDs, for the autoscaling tests (docs/autoscaling.md)"

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

test: dev control-plane-bins deviceplugin-conformance observability-tools dra-conformance kueue karpenter
	VGPU_REQUIRE_CONTROL_PLANE=1 VGPU_CONTROL_PLANE_BIN_DIR=$(CONTROL_PLANE_BIN_DIR) \
		$(BIN)/pytest

test-unit: dev
	$(BIN)/pytest -m 'not integration'

test-integration: dev control-plane-bins deviceplugin-conformance observability-tools dra-conformance kueue karpenter
	VGPU_REQUIRE_CONTROL_PLANE=1 VGPU_CONTROL_PLANE_BIN_DIR=$(CONTROL_PLANE_BIN_DIR) \
		$(BIN)/pytest -m integration

lint: dev
	$(BIN)/ruff check operator tests
	$(BIN)/ruff format --check operator tests
	$(BIN)/mypy -p vgpu_operator
	$(BIN)/mypy tests/bench/e2e
	$(BIN)/lint-imports
	$(BIN)/ruff check hack/gpu-check
	$(BIN)/ruff format --check hack/gpu-check
	$(BIN)/mypy hack/gpu-check/gpu_check
	$(BIN)/ruff check hack/check_structure.py
	$(BIN)/ruff format --check hack/check_structure.py
	$(BIN)/mypy --strict hack/check_structure.py
	$(BIN)/python hack/check_structure.py

# The benchmark's extra (matplotlib for its plots), installed on first use only.
$(BIN)/.bench-deps: $(BIN)/.deps
	$(BIN)/python -m pip install --quiet -e '.[test,lint,bench]' --config-settings editable_mode=strict
	touch $@

# BENCH_NODES (default 1000), BENCH_SCALE (0.1 for a quick run), BENCH_REPEATS (3) and
# BENCH_BURST (pods per repeated burst), BENCH_5000=1 for the 5,000-node run, BENCH_BIG=15000
# (BENCH_BIG_BURST), BENCH_ONLY=dra, BENCH_FAULTS=0 to skip the fault runs; see
# tests/bench/e2e/README.md.
# BENCH_FGD=0 skips the replays of Alibaba's GPU trace (fetched from GitHub at bench time);
# BENCH_FGD_SEEDS (default 42-51, FGD's) and BENCH_FGD_LISTS (default: the default list;
# "all" for FGD's seventeen) choose what the replay runs.
bench: dev control-plane-bench-bins $(BIN)/.bench-deps
	$(BIN)/python tests/bench/run.py
	if [ "$${BENCH_FGD:-1}" != 0 ]; then \
		$(BIN)/python tests/bench/bench_fgd_replay.py --seeds $${BENCH_FGD_SEEDS:-42-51} \
			--lists $${BENCH_FGD_LISTS:-default} && \
		$(BIN)/python tests/bench/bench_fgd_churn.py && \
		$(BIN)/python tests/bench/fgd_plots.py --replay .bench/fgd.json --churn .bench/fgd-churn.json; \
	fi
	$(BIN)/python tests/bench/bench_dra_churn_engine.py
	VGPU_CONTROL_PLANE_BIN_DIR=$(CONTROL_PLANE_BIN_DIR) $(BIN)/python tests/bench/run_e2e.py \
		--docs docs/benchmarks.md

demo: dev control-plane-bins
	VGPU_CONTROL_PLANE_BIN_DIR=$(CONTROL_PLANE_BIN_DIR) $(BIN)/vgpu-operator demo

crds: dev
	$(BIN)/vgpu-operator crds --output crds

# charts/vgpu-operator/ from manifests/ and crds/ (hack/sync-chart.py); run after changing them.
chart: dev
	$(BIN)/python hack/sync-chart.py

# The Grafana dashboard (charts/vgpu-operator/dashboards/), built by hack/dashboard.py.
dashboard: dev
	$(BIN)/python hack/dashboard.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis

# kubelet's device-plugin API: Python code generated from the vendored api.proto.
.PHONY: deviceplugin-api
deviceplugin-api: dev
	$(BIN)/python hack/gen-deviceplugin-api.py

# The hardware check (docs/hardware.md). It needs no network and no `make dev`: run it on a
# GPU machine after `make gpu-check-prepare` here. GPU_CHECK_ARGS passes options, e.g.
# `make gpu-check GPU_CHECK_ARGS="--backend sim:a100-mig"` for a simulated machine.
gpu-check:
	hack/gpu-check/run.sh $(GPU_CHECK_ARGS)

gpu-check-prepare:
	hack/gpu-check/prepare.sh
