"""A PodGroup's own ResourceClaim on the live API server (issue 47 item 3, the
DRAWorkloadResourceClaims gate): kube-controller-manager makes the group's claim from its
template and names it in every member's status; the operator allocates it once, for the
group, reserves it for the PodGroup and binds every member to its node; once the PodGroup
and its members are gone, kube-controller-manager releases the claim and the books give
its share back.

One control plane of its own: kube-apiserver and kube-controller-manager with the gate
(``testing/controlplane.py``, ``WORKLOAD_FEATURE_GATES``; its claim controller, garbage
collector and PodGroup protection controller), KWOK, one DRA node with its
agent's slice (four 46068 MiB L40S cards), and the operator.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from integration.dra_env import (
    CLAIM_CONTROLLERS,
    RESOURCE,
    claim_pod,
    create_claim_template,
    dra_operator,
    dra_plane,
    fresh_namespace,
)
from integration.test_agent import wait_for

from vgpu_operator.devices import dra
from vgpu_operator.handlers.runtime import OperatorThread
from vgpu_operator.scheduling.books import group_claims
from vgpu_operator.scheduling.gangs import gangs
from vgpu_operator.testing.binaries import Binaries
from vgpu_operator.testing.controlplane import AdminRequestError, ControlPlane

pytestmark = pytest.mark.integration

NODE = "dra-group-claims"
SCHEDULER = "vgpu-dra-group-claims"


@pytest.fixture(scope="module")
def plane(
    control_plane_binaries: Binaries, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    work = tmp_path_factory.mktemp("dra-group-claims")
    # The PodGroup protection controller lets a PodGroup go once its members have.
    controllers = (*CLAIM_CONTROLLERS, "podgroup-protection-controller")
    with dra_plane(
        control_plane_binaries, work, {NODE: "l40s-pcie-4"}, split=4, controllers=controllers
    ) as cp:
        yield cp


@pytest.fixture(scope="module")
def operator(plane: ControlPlane) -> Iterator[OperatorThread]:
    with dra_operator(plane, "vgpu-dra-group-claims-config", SCHEDULER) as running:
        yield running


def _get(plane: ControlPlane, path: str) -> dict[str, Any] | None:
    try:
        return plane.get(path)
    except AdminRequestError as exc:
        if exc.status == 404:
            return None
        raise


def _group_claim(plane: ControlPlane, ns: str) -> str | None:
    group = _get(plane, f"/apis/{gangs.API_VERSION}/namespaces/{ns}/podgroups/train") or {}
    for status in (group.get("status") or {}).get("resourceClaimStatuses") or ():
        if status.get("name") == "gpu" and status.get("resourceClaimName"):
            return str(status["resourceClaimName"])
    return None


def _bound(plane: ControlPlane, ns: str, name: str) -> str | None:
    pod = _get(plane, f"/api/v1/namespaces/{ns}/pods/{name}") or {}
    return (pod.get("spec") or {}).get("nodeName")


def test_the_groups_claim_is_allocated_once_for_the_group_and_released_with_it(
    plane: ControlPlane, operator: OperatorThread
) -> None:
    ns = fresh_namespace(plane, "group-claims")
    exactly = {"deviceClassName": dra.SHARED_CLASS, "capacity": {"requests": {"memory": "20Gi"}}}
    create_claim_template(plane, ns, "half", exactly)
    plane.create(
        f"/apis/{gangs.API_VERSION}/namespaces/{ns}/podgroups",
        {
            "apiVersion": gangs.API_VERSION,
            "kind": "PodGroup",
            "metadata": {"name": "train"},
            "spec": {
                "schedulingPolicy": {"gang": {"minCount": 2}},
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "half"}],
            },
        },
    )
    claim_name = wait_for("the group's claim", lambda: _group_claim(plane, ns), 60)
    for name in ("w0", "w1"):
        body = claim_pod(name, template="half", scheduler=SCHEDULER)
        body["spec"]["schedulingGroup"] = {"podGroupName": "train"}
        plane.create(f"/api/v1/namespaces/{ns}/pods", body)
    for name in ("w0", "w1"):
        assert wait_for(f"{name} bound", lambda n=name: _bound(plane, ns, n), 60) == NODE
        pod = plane.get(f"/api/v1/namespaces/{ns}/pods/{name}")
        (status,) = pod["status"]["resourceClaimStatuses"]
        assert status["resourceClaimName"] == claim_name  # the group's, not a claim of its own
    claims = plane.get(f"{RESOURCE}/namespaces/{ns}/resourceclaims")["items"]
    assert [c["metadata"]["name"] for c in claims] == [claim_name]
    (claim,) = claims
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert result["consumedCapacity"]["memory"] == "20Gi"  # once, for both members
    group = plane.get(f"/apis/{gangs.API_VERSION}/namespaces/{ns}/podgroups/train")
    assert claim["status"]["reservedFor"] == [
        {
            "apiGroup": group_claims.API_GROUP,
            "resource": group_claims.RESOURCE,
            "name": "train",
            "uid": group["metadata"]["uid"],
        }
    ]
    # The group ends: its members and the PodGroup go, kube-controller-manager releases
    # the claim (and the garbage collector deletes it with its owner), and the share is
    # free again in the operator's books.
    for name in ("w0", "w1"):
        plane.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}?gracePeriodSeconds=0")
    plane.delete(f"/apis/{gangs.API_VERSION}/namespaces/{ns}/podgroups/train")

    def released() -> bool:
        left = _get(plane, f"{RESOURCE}/namespaces/{ns}/resourceclaims/{claim_name}")
        return left is None or not (left.get("status") or {}).get("allocation")

    wait_for("the group's claim released", released, 60)
    state = operator.app.running.state  # the engine the operator decides with
    wait_for("the share back in the books", lambda: not state.holds_claim(f"{ns}/{claim_name}"), 30)
