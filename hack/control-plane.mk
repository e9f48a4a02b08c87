# Test control plane binaries (kube-apiserver, etcd, kwok, kube-scheduler,
# kube-controller-manager) and the test tools kubectl and promtool. Included by the main Makefile.
#
#   make control-plane-bins   build them once (slow the first time) and print their directory
#
# They are built from the Go module proxy into ${VGPU_CACHE_DIR:-$HOME/.cache/vgpu-operator}/bin/
# <component>-<version>/ and reused later; $(CONTROL_PLANE_BIN_DIR) holds symlinks to all five.
# If $KUBEBUILDER_ASSETS contains kube-apiserver and etcd, those are used (the others are
# still built).
# Versions: hack/control-plane/versions.env. Needs Go >= 1.26 (PATH, /usr/local/go/bin or $GO).

CONTROL_PLANE_BUILD := hack/control-plane/build.sh
CONTROL_PLANE_BIN_DIR := $(shell $(CONTROL_PLANE_BUILD) --print-dir)
# For recipes that run the tests (vgpu_operator.testing.controlplane reads it).
export VGPU_CONTROL_PLANE_BIN_DIR := $(CONTROL_PLANE_BIN_DIR)

.PHONY: control-plane-bins control-plane-bench-bins
control-plane-bins:
	@$(CONTROL_PLANE_BUILD)

# The same plus toxiproxy-server, for `make bench` only.
control-plane-bench-bins:
	@$(CONTROL_PLANE_BUILD) --bench

# kubelet's device manager (k8s.io/kubernetes at the same version) as a harness for the agent's
# device plugin (hack/deviceplugin-conformance); cached per version and source hash. Built after
# the control plane it shares Go's build cache with, so only its own packages compile then.
DEVICEPLUGIN_CONFORMANCE := $(shell $(CONTROL_PLANE_BUILD) --print-path deviceplugin-conformance)
# tests/integration/test_deviceplugin_conformance.py runs it.
export VGPU_DEVICEPLUGIN_CONFORMANCE := $(DEVICEPLUGIN_CONFORMANCE)

.PHONY: deviceplugin-conformance
deviceplugin-conformance: control-plane-bins
	@$(CONTROL_PLANE_BUILD) deviceplugin-conformance

# The Prometheus server (promtool's release) and helm, for the dashboard's and the chart's
# tests only (tests/integration/test_dashboard.py, test_chart.py); linked into
# $(CONTROL_PLANE_BIN_DIR) beside the others. `make demo` never builds them.
.PHONY: observability-tools
observability-tools: control-plane-bins
	@$(CONTROL_PLANE_BUILD) observability

# kubelet's DRA manager and plugin watcher (k8s.io/kubernetes at the same version) with the CDI
# reference library, as a harness for the agent's DRA plugin (hack/dra-conformance); cached per
# version and source hash, built after the control plane like the one above.
DRA_CONFORMANCE := $(shell $(CONTROL_PLANE_BUILD) --print-path dra-conformance)
# tests/integration/test_dra_conformance.py runs it.
export VGPU_DRA_CONFORMANCE := $(DRA_CONFORMANCE)

.PHONY: dra-conformance
dra-conformance: control-plane-bins
	@$(CONTROL_PLANE_BUILD) dra-conformance

# Kueue's controller manager (KUEUE_VERSION, sigs.k8s.io/kueue/cmd/kueue) and its CRDs, for the
# Kueue tests only (tests/integration/test_kueue.py; docs/kueue.md); linked into
# $(CONTROL_PLANE_BIN_DIR) as kueue and kueue-crd. `make test` builds it, `make demo` does not.
.PHONY: kueue
kueue: control-plane-bins
	@$(CONTROL_PLANE_BUILD) kueue

# Karpenter's controller with its KWOK cloud provider (KARPENTER_VERSION,
# sigs.k8s.io/karpenter/kwok) and its CRDs, for the autoscaling tests only
# (tests/integration/test_autoscaling.py; docs/autoscaling.md); linked into
# $(CONTROL_PLANE_BIN_DIR) as karpenter and karpenter-crd. `make test` builds it, `make demo`
# does not.
.PHONY: karpenter
karpenter: control-plane-bins
	@$(CONTROL_PLANE_BUILD) karpenter
