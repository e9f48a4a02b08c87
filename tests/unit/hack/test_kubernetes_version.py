"""The control plane's Kubernetes version (``K8S_VERSION`` in hack/control-plane/versions.env)
and what moves with it (issue 47 item 8).

Kubernetes v1.38 (due 2026-12-16) brings the Workload API to GA and DRA preemption
(KEP-5690) to beta. The Go module proxy serves ``k8s.io/kubernetes`` up to v1.38.0-beta.0
here, no v1.38 release: the control plane stays on v1.37 (never a pre-release), and these
tests name what has to change with the move, so that changing the version alone fails
until each is done.
"""

from __future__ import annotations

import re
from pathlib import Path

from vgpu_operator.kube import pod_groups
from vgpu_operator.scheduling.gangs import gangs
from vgpu_operator.testing import controlplane

ROOT = Path(__file__).resolve().parents[3]
VERSIONS = ROOT / "hack" / "control-plane" / "versions.env"


def _version() -> str:
    for line in VERSIONS.read_text().splitlines():
        if line.startswith("K8S_VERSION="):
            return line.split("=", 1)[1].strip().strip('"')
    raise AssertionError("versions.env sets no K8S_VERSION")


def _minor() -> int:
    match = re.fullmatch(r"v1\.(\d+)\.\d+", _version())
    assert match is not None, f"K8S_VERSION {_version()} is not a release (vX.Y.Z)"
    return int(match.group(1))


def test_the_control_plane_runs_a_release_never_a_pre_release() -> None:
    assert re.fullmatch(r"v\d+\.\d+\.\d+", _version()), (
        f"K8S_VERSION={_version()}: the tests, the demo and the bench run released "
        "Kubernetes only (v1.38 is served as v1.38.0-beta.0 only: stay on v1.37)"
    )


#: What v1.38 changes, and where the project says it (each line is checked below).
V138 = {
    "Workload API GA: PodGroup and Workload served as scheduling.k8s.io/v1": (
        gangs.API_VERSION,
        pod_groups.POD_GROUPS,
        controlplane.WORKLOAD_RUNTIME_CONFIG,
    ),
    "GenericWorkload GA: the gate is on by default (and locked)": (
        controlplane.WORKLOAD_FEATURE_GATES,
    ),
}


def test_what_moves_with_v1_38_is_named_and_consistent_with_the_version() -> None:
    group_version = "scheduling.k8s.io/v1" if _minor() >= 38 else "scheduling.k8s.io/v1beta1"
    assert gangs.API_VERSION == group_version, next(iter(V138))
    assert pod_groups.POD_GROUPS == f"/apis/{group_version}/podgroups"
    assert controlplane.WORKLOAD_RUNTIME_CONFIG == f"{group_version}=true"
    gates = controlplane.WORKLOAD_FEATURE_GATES
    if _minor() >= 38:
        assert "GenericWorkload" not in gates, list(V138)[1]
    else:
        assert "GenericWorkload=true" in gates


def test_the_docs_say_how_upstream_preempts_for_claims_at_this_version() -> None:
    """DRA preemption (KEP-5690): none in kube-scheduler 1.37, beta in 1.38. At the move
    the comparison in docs/dra-engine.md is measured again (``bench_dra_preemption``
    against kube-scheduler's own), and "ahead of upstream" becomes "better than
    upstream's"."""
    text = (ROOT / "docs" / "dra-engine.md").read_text()
    if _minor() >= 38:
        assert "Upstream has no DRA preemption yet" not in text
    else:
        assert "Upstream has no DRA preemption yet (KEP-5690" in text
        assert "v1.38 is not served yet" in text
