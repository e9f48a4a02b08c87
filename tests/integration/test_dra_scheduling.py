"""The agent's DRA slices allocated by the real kube-scheduler (issue 25).

A control plane of its own (kube-scheduler would bind every default-scheduler pod of the
shared one): kube-apiserver, kube-scheduler, kube-controller-manager's resource claim
controller (a pod's ResourceClaimTemplates become claims) and garbage collector, KWOK nodes
labelled for the DRA
path, and an agent per node on a simulated machine publishing its ResourceSlice. Pods ask
for shares through ResourceClaimTemplates of the DeviceClasses in manifests/; what
kube-scheduler allocates is read back from the claims.
"""

from __future__ import annotations

from collections.abc import Iterator
from fractions import Fraction
from typing import Any

import pytest
from integration import operator_env as env
from integration.dra_env import (
    RESOURCE,
    SLICES,
    claim_pod,
    create_claim_template,
    dra_agent,
    dra_plane,
    exactly,
    fresh_namespace,
    node_slice,
    unschedulable_message,
)
from integration.test_agent import wait_for

from vgpu_operator.devices import dra
from vgpu_operator.devices.quantity import parse_quantity
from vgpu_operator.testing.binaries import Binaries
from vgpu_operator.testing.controlplane import ControlPlane

L40S = "node-l40s"  # l40s-pcie-4: four 46068 MiB cards
FAILING = "node-failing"  # h100-pcie-failing: card 2 raises XID 79
SPLIT = 4


@pytest.fixture(scope="module")
def cluster(
    control_plane_binaries: Binaries, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    """Its own control plane with kube-scheduler, the claim controller, two DRA nodes and
    their agents."""
    machines = {L40S: "l40s-pcie-4", FAILING: "h100-pcie-failing"}
    with dra_plane(
        control_plane_binaries, tmp_path_factory.mktemp("dra"), machines, split=SPLIT
    ) as plane:
        yield plane


def claim_template(
    plane: ControlPlane,
    namespace: str,
    name: str,
    capacity: dict[str, str] | None,
    *,
    selector: str | None = None,
    device_class: str = dra.SHARED_CLASS,
    tolerate_unhealthy: bool = False,
) -> None:
    asked = exactly(
        capacity,
        selector=selector,
        device_class=device_class,
        tolerate_unhealthy=tolerate_unhealthy,
    )
    create_claim_template(plane, namespace, name, asked)


def pod_with_template(
    plane: ControlPlane, namespace: str, name: str, template: str, node: str | None = None
) -> None:
    plane.create(
        f"/api/v1/namespaces/{namespace}/pods", claim_pod(name, template=template, node=node)
    )


def pod_claim(plane: ControlPlane, namespace: str, pod: str) -> dict[str, Any] | None:
    """The pod's generated claim, once kube-scheduler allocated it and bound the pod."""
    obj = plane.get(f"/api/v1/namespaces/{namespace}/pods/{pod}")
    if not obj["spec"].get("nodeName"):
        return None
    statuses = obj.get("status", {}).get("resourceClaimStatuses") or []
    if not statuses or not statuses[0].get("resourceClaimName"):
        return None
    return plane.get(
        f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{statuses[0]['resourceClaimName']}"
    )


def only_result(claim: dict[str, Any]) -> dict[str, Any]:
    results = claim["status"]["allocation"]["devices"]["results"]
    assert len(results) == 1, results
    result: dict[str, Any] = results[0]
    return result


def card_index(node: str, index: int) -> str:
    return f'device.attributes["{dra.DRIVER}"].index == {index}'


def test_each_node_publishes_one_pool_of_its_reported_cards(cluster: ControlPlane) -> None:
    found = node_slice(cluster, L40S)
    assert found is not None
    spec = found["spec"]
    assert spec["driver"] == dra.DRIVER
    assert spec["pool"]["name"] == L40S
    assert spec["pool"]["resourceSliceCount"] == 1
    inventory = cluster.get(f"{env.INVENTORIES}/{L40S}")
    reported = {d["uuid"].lower(): d for d in inventory["status"]["devices"]}
    assert {d["name"] for d in spec["devices"]} == set(reported)
    for device in spec["devices"]:
        card = reported[device["name"]]
        assert parse_quantity(device["capacity"]["memory"]["value"]) == card["memoryMiB"] * dra.MIB
        assert device["capacity"]["shares"]["value"] == str(SPLIT)
        assert device["allowMultipleAllocations"] is True
    owner = found["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"]) == (
        "DeviceInventory",
        L40S,
        inventory["metadata"]["uid"],
    )


def test_a_claim_for_10gib_and_a_quarter_is_allocated_and_bound(cluster: ControlPlane) -> None:
    ns = fresh_namespace(cluster)
    claim_template(cluster, ns, "quarter", {"memory": "10Gi", "cores": "25"})
    pod_with_template(cluster, ns, "train", "quarter")
    claim = wait_for(
        "kube-scheduler to allocate the claim", lambda: pod_claim(cluster, ns, "train"), 60
    )
    result = only_result(claim)
    assert result["driver"] == dra.DRIVER
    assert parse_quantity(result["consumedCapacity"]["memory"]) == 10 * 2**30
    assert parse_quantity(result["consumedCapacity"]["cores"]) == 25
    # The shares capacity: one per claim, by the request policy's default.
    assert parse_quantity(result["consumedCapacity"]["shares"]) == 1
    assert result.get("shareID")
    pod = cluster.get(f"/api/v1/namespaces/{ns}/pods/train")
    assert pod["spec"]["nodeName"] == result["pool"]


def test_two_claims_share_one_card(cluster: ControlPlane) -> None:
    ns = fresh_namespace(cluster)
    claim_template(
        cluster, ns, "card0", {"memory": "10Gi", "cores": "25"}, selector=card_index(L40S, 0)
    )
    for pod in ("first", "second"):
        pod_with_template(cluster, ns, pod, "card0", node=L40S)
    claims = [
        wait_for(f"{pod}'s claim", lambda p=pod: pod_claim(cluster, ns, p), 60)
        for pod in ("first", "second")
    ]
    results = [only_result(c) for c in claims]
    assert results[0]["device"] == results[1]["device"]
    assert results[0]["shareID"] != results[1]["shareID"]


def test_a_claim_larger_than_any_cards_remainder_waits_with_kube_schedulers_reason(
    cluster: ControlPlane,
) -> None:
    ns = fresh_namespace(cluster)
    # Card 1 of the L40S node: 46068 MiB; 40 GiB taken leaves less than the 10 GiB asked.
    claim_template(cluster, ns, "big", {"memory": "40Gi"}, selector=card_index(L40S, 1))
    claim_template(cluster, ns, "rest", {"memory": "10Gi"}, selector=card_index(L40S, 1))
    pod_with_template(cluster, ns, "big", "big", node=L40S)
    wait_for("the big claim", lambda: pod_claim(cluster, ns, "big"), 60)
    pod_with_template(cluster, ns, "rest", "rest", node=L40S)
    message = wait_for(
        "kube-scheduler to give up on the pod",
        lambda: unschedulable_message(cluster, ns, "rest"),
        60,
    )
    assert "cannot allocate all claims" in message
    assert cluster.get(f"/api/v1/namespaces/{ns}/pods/rest")["spec"].get("nodeName") is None


def test_a_tainted_card_is_not_chosen(cluster: ControlPlane) -> None:
    ns = fresh_namespace(cluster)
    sick = f'device.attributes["{dra.DRIVER}"].uuid == "GPU-9e4c7b10-6d2a-4f83-b5a1-0fa11ed00002"'
    found = node_slice(cluster, FAILING)
    assert found is not None
    tainted = [d["name"] for d in found["spec"]["devices"] if d.get("taints")]
    assert tainted == ["gpu-9e4c7b10-6d2a-4f83-b5a1-0fa11ed00002"]
    claim_template(cluster, ns, "sick", {"memory": "1Gi"}, selector=sick)
    pod_with_template(cluster, ns, "on-sick", "sick", node=FAILING)
    message = wait_for(
        "the pod on the sick card to wait",
        lambda: unschedulable_message(cluster, ns, "on-sick"),
        60,
    )
    assert "cannot allocate all claims" in message
    # The taint is what keeps it off: a request that tolerates it gets the card.
    claim_template(
        cluster, ns, "tolerant", {"memory": "1Gi"}, selector=sick, tolerate_unhealthy=True
    )
    pod_with_template(cluster, ns, "tolerant", "tolerant", node=FAILING)
    claim = wait_for("the tolerant pod's claim", lambda: pod_claim(cluster, ns, "tolerant"), 60)
    assert only_result(claim)["device"] == tainted[0]
    # Untargeted claims on that node land on the other cards.
    claim_template(cluster, ns, "any", {"memory": "1Gi"})
    for i in range(3):
        pod_with_template(cluster, ns, f"any-{i}", "any", node=FAILING)
    for i in range(3):
        got = wait_for(f"any-{i}'s claim", lambda i=i: pod_claim(cluster, ns, f"any-{i}"), 60)
        assert only_result(got)["device"] != tainted[0]


def test_a_recount_over_every_claim_shows_no_card_over_committed(cluster: ControlPlane) -> None:
    ns = fresh_namespace(cluster)
    # Twelve claims of 20 GiB on the L40S node's four 45 GiB cards: at most two fit on each.
    claim_template(cluster, ns, "twenty", {"memory": "20Gi", "cores": "10"})
    for i in range(12):
        pod_with_template(cluster, ns, f"p-{i}", "twenty", node=L40S)
    placed = 0
    for i in range(12):
        if wait_for(
            f"p-{i} to be placed or refused",
            lambda i=i: (
                pod_claim(cluster, ns, f"p-{i}") or unschedulable_message(cluster, ns, f"p-{i}")
            ),
            90,
        ) and pod_claim(cluster, ns, f"p-{i}"):
            placed += 1
    claims = cluster.request("GET", f"{RESOURCE}/resourceclaims")["items"]
    totals = dra.recount(claims)
    capacity = {}
    for node in (L40S, FAILING):
        found = node_slice(cluster, node)
        assert found is not None
        for device in found["spec"]["devices"]:
            capacity[(node, device["name"])] = device["capacity"]
    assert totals
    for key, used in totals.items():
        limit = capacity[key]
        assert used.memory_bytes <= parse_quantity(limit["memory"]["value"]), key
        assert used.cores <= parse_quantity(limit["cores"]["value"]), key
        assert used.shares <= Fraction(parse_quantity(limit["shares"]["value"])), key
    # Other tests hold part of the L40S cards too; whatever they hold, the cards filled up.
    assert placed < 12


def test_a_nodes_slice_goes_with_its_inventory(
    cluster: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Uninstalling deletes the CRD and with it every DeviceInventory; deleting a node
    deletes its inventory: either way the garbage collector removes the node's slice."""
    node = "node-going"
    cluster.create_fake_gpu_node(node, gpus=0, labels={dra.NODE_PATH_LABEL: dra.PATH_DRA})
    work = tmp_path_factory.mktemp("going")
    agent = dra_agent(node, "l40s-pcie-4", cluster.kubeconfig_path, work, split=SPLIT)
    try:
        wait_for(f"{node}'s slice", lambda: node_slice(cluster, node), timeout=60)
    finally:
        agent.stop()  # the agent is gone (its DaemonSet deleted)
    cluster.delete(f"{env.INVENTORIES}/{node}")

    def gone() -> bool:
        found = cluster.request("GET", f"{SLICES}?fieldSelector=spec.nodeName%3D{node}")
        return not found["items"]

    wait_for("the garbage collector to remove the slice", gone, timeout=60)
