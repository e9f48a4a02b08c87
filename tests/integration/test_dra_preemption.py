"""Preemption on the DRA path against a real API server (issue 35): a high-priority pod
whose claim fits nowhere evicts the low-priority pod whose claim's share stands in its
way, and its own claim is allocated and the pod bound only after the victim is gone and
its claim released (by kube-controller-manager's claim controller).

One control plane of its own: kube-apiserver, KWOK (its pod-delete stage removes an
evicted pod as a kubelet would), kube-controller-manager's claim controller and garbage
collector, one KWOK node on the DRA path with its agent's slice (four 46068 MiB L40S
cards), and the operator. Priorities come from PriorityClasses.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from integration import operator_env as env
from integration.dra_env import (
    RESOURCE,
    claim_pod,
    create_claim,
    create_claim_template,
    dra_operator,
    dra_plane,
    fresh_namespace,
    node_slice,
)
from integration.test_agent import wait_for

from vgpu_operator.devices import dra
from vgpu_operator.devices.quantity import parse_quantity
from vgpu_operator.handlers.runtime import OperatorThread
from vgpu_operator.scheduling.gangs import gangs
from vgpu_operator.testing.binaries import Binaries
from vgpu_operator.testing.controlplane import AdminRequestError, ControlPlane

pytestmark = pytest.mark.integration

NODE = "dra-preempt"
SCHEDULER = "vgpu-dra-preempt"
PRIORITY_CLASSES = "/apis/scheduling.k8s.io/v1/priorityclasses"
CLASSES = {"batch": 10, "keep": 100, "urgent": 10000}


@pytest.fixture(scope="module")
def plane(
    control_plane_binaries: Binaries, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    work = tmp_path_factory.mktemp("dra-preempt")
    with dra_plane(control_plane_binaries, work, {NODE: "l40s-pcie-4"}, split=4) as cp:
        for name, value in CLASSES.items():
            cp.create(
                PRIORITY_CLASSES,
                {"apiVersion": "scheduling.k8s.io/v1", "metadata": {"name": name}, "value": value},
            )
        yield cp


@pytest.fixture(scope="module")
def operator(plane: ControlPlane) -> Iterator[OperatorThread]:
    with dra_operator(plane, "vgpu-dra-preempt-config", SCHEDULER) as running:
        yield running


def template(plane: ControlPlane, namespace: str, name: str, memory: str) -> None:
    exactly = {"deviceClassName": dra.SHARED_CLASS, "capacity": {"requests": {"memory": memory}}}
    create_claim_template(plane, namespace, name, exactly)


def create(
    plane: ControlPlane,
    namespace: str,
    name: str,
    template_name: str | None,
    priority: str,
    claim_name: str | None = None,
) -> None:
    body = claim_pod(name, template=template_name, claim=claim_name, scheduler=SCHEDULER)
    body["spec"]["priorityClassName"] = priority
    plane.create(f"/api/v1/namespaces/{namespace}/pods", body)


def get_pod(plane: ControlPlane, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        return plane.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    except AdminRequestError as exc:
        if exc.status == 404:
            return None
        raise


def claim_of(plane: ControlPlane, namespace: str, name: str) -> dict[str, Any] | None:
    """The bound pod's claim (None until the pod is bound)."""
    obj = get_pod(plane, namespace, name)
    if obj is None or not obj["spec"].get("nodeName"):
        return None
    [status] = obj["status"]["resourceClaimStatuses"]
    claim: dict[str, Any] = plane.get(
        f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{status['resourceClaimName']}"
    )
    return claim


def device_of(claim: dict[str, Any]) -> str:
    [result] = claim["status"]["allocation"]["devices"]["results"]
    return str(result["device"])


def claims_in(plane: ControlPlane, namespace: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = plane.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaims")[
        "items"
    ]
    return items


def over_committed(plane: ControlPlane) -> list[str]:
    """Every device whose allocated claims, all of them, consume more than it publishes."""
    totals = dra.recount(plane.get(f"{RESOURCE}/resourceclaims")["items"])
    found = node_slice(plane, NODE)
    assert found is not None
    problems = []
    for device in found["spec"]["devices"]:
        used = totals.get((NODE, device["name"]))
        memory = parse_quantity(device["capacity"][dra.MEMORY]["value"])
        if used is not None and used.memory_bytes > memory:
            problems.append(f"{device['name']}: {used}")
    return problems


def reasons_of(plane: ControlPlane, namespace: str, name: str) -> set[str]:
    return {str(e["reason"]) for e in env.events_for(plane, namespace, name)}


@pytest.fixture
def ns(plane: ControlPlane) -> Iterator[str]:
    """A namespace of the test's own; its pods are deleted after it, and the test waits
    until their claims hold nothing (the next test has the node's cards to itself)."""
    namespace = fresh_namespace(plane, "dra-preempt")
    yield namespace
    for obj in plane.get(f"/api/v1/namespaces/{namespace}/pods")["items"]:
        plane.delete(f"/api/v1/namespaces/{namespace}/pods/{obj['metadata']['name']}")

    def released() -> bool:
        return not any(c.get("status", {}).get("allocation") for c in claims_in(plane, namespace))

    wait_for("the test's claims to be released", released, 60)


def three_cards_kept(plane: ControlPlane, ns: str) -> None:
    """The templates ``most-of-a-card`` (40 GiB) and ``half-a-card`` (20 GiB), and three
    pods worth keeping holding 40 GiB of three cards."""
    template(plane, ns, "most-of-a-card", "40Gi")
    template(plane, ns, "half-a-card", "20Gi")
    for name in ("keep-a", "keep-b", "keep-c"):
        create(plane, ns, name, "most-of-a-card", "keep")
        wait_for(f"{name}'s claim", lambda n=name: claim_of(plane, ns, n), 60)


def test_a_high_priority_claim_evicts_the_low_one_in_its_way_and_is_bound_after(
    plane: ControlPlane, operator: OperatorThread, ns: str
) -> None:
    # Every card holds 40 GiB of 45 GiB: three pods worth keeping and one batch pod.
    three_cards_kept(plane, ns)
    create(plane, ns, "batch", "most-of-a-card", "batch")
    batch_claim = wait_for("batch's claim", lambda: claim_of(plane, ns, "batch"), 60)
    batch_device = device_of(batch_claim)
    batch_uid = wait_for("batch", lambda: get_pod(plane, ns, "batch"))["metadata"]["uid"]

    # 20 GiB fit on no card: the batch pod (the least important) makes room.
    create(plane, ns, "urgent", "half-a-card", "urgent")
    wait_for("batch to be gone", lambda: get_pod(plane, ns, "batch") is None, 60)
    urgent_claim = wait_for("urgent's claim", lambda: claim_of(plane, ns, "urgent"), 60)
    assert device_of(urgent_claim) == batch_device  # the freed share, on the victim's card
    assert (
        parse_quantity(
            urgent_claim["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"][
                "memory"
            ]
        )
        == 20 * 2**30
    )
    for name in ("keep-a", "keep-b", "keep-c"):
        kept = get_pod(plane, ns, name)
        assert kept is not None
        assert kept["spec"].get("nodeName") == NODE
    # The victim's claim no longer holds anything that the urgent pod's is counted beside.
    for claim in claims_in(plane, ns):
        reserved = {r["uid"] for r in claim.get("status", {}).get("reservedFor") or ()}
        assert batch_uid not in reserved
    assert over_committed(plane) == []
    urgent = get_pod(plane, ns, "urgent")
    assert urgent is not None
    assert urgent["spec"]["nodeName"] == NODE
    wait_for("the Preempting event", lambda: "Preempting" in reasons_of(plane, ns, "urgent"), 30)
    assert "Preempted" in reasons_of(plane, ns, "batch")


def test_an_equal_priority_pod_evicts_nobody_and_waits(
    plane: ControlPlane, operator: OperatorThread, ns: str
) -> None:
    template(plane, ns, "all-of-a-card", "44Gi")
    names = [f"keep-{i}" for i in range(4)]
    for name in names:
        create(plane, ns, name, "all-of-a-card", "keep")
        wait_for(f"{name}'s claim", lambda n=name: claim_of(plane, ns, n), 60)
    create(plane, ns, "peer", "all-of-a-card", "keep")

    def refused() -> str | None:
        obj = get_pod(plane, ns, "peer")
        for condition in (obj or {}).get("status", {}).get("conditions") or []:
            if condition["type"] == "PodScheduled" and condition.get("status") == "False":
                return str(condition.get("message") or "") or None
        return None

    wait_for("peer's PodScheduled=False", refused, 60)
    for name in names:
        assert get_pod(plane, ns, name) is not None
    assert "Preempting" not in reasons_of(plane, ns, "peer")


def test_a_claim_shared_by_two_low_pods_is_released_once_both_are_evicted(
    plane: ControlPlane, operator: OperatorThread, ns: str
) -> None:
    three_cards_kept(plane, ns)
    # The fourth card: one claim of 40 GiB shared by two batch pods.
    shared = {"deviceClassName": dra.SHARED_CLASS, "capacity": {"requests": {"memory": "40Gi"}}}
    create_claim(plane, ns, "pair", shared)
    path = f"{RESOURCE}/namespaces/{ns}/resourceclaims/pair"
    for name in ("batch-1", "batch-2"):
        create(plane, ns, name, None, "batch", claim_name="pair")
        wait_for(
            f"{name} bound",
            lambda n=name: (get_pod(plane, ns, n) or {}).get("spec", {}).get("nodeName"),
            60,
        )
    pair = plane.get(path)
    assert len(pair["status"]["reservedFor"]) == 2
    pair_device = device_of(pair)

    create(plane, ns, "urgent", "half-a-card", "urgent")
    for name in ("batch-1", "batch-2"):
        wait_for(f"{name} to be gone", lambda n=name: get_pod(plane, ns, n) is None, 60)
    urgent_claim = wait_for("urgent's claim", lambda: claim_of(plane, ns, "urgent"), 60)
    assert device_of(urgent_claim) == pair_device
    released = plane.get(path)
    assert not released.get("status", {}).get("allocation"), "released by the claim controller"
    for name in ("keep-a", "keep-b", "keep-c"):
        kept = get_pod(plane, ns, name)
        assert kept is not None
        assert kept["spec"].get("nodeName") == NODE
    assert over_committed(plane) == []


def _pod_group(plane: ControlPlane, ns: str, name: str, priority_class: str) -> dict[str, Any]:
    body = {
        "apiVersion": gangs.API_VERSION,
        "kind": "PodGroup",
        "metadata": {"name": name},
        "spec": {
            "schedulingPolicy": {"gang": {"minCount": 1}},
            "priorityClassName": priority_class,
        },
    }
    made: dict[str, Any] = plane.create(
        f"/apis/{gangs.API_VERSION}/namespaces/{ns}/podgroups", body
    )
    return made


def test_a_pod_group_naming_a_class_its_namespace_may_not_use_preempts_nobody(
    plane: ControlPlane, operator: OperatorThread, ns: str
) -> None:
    """Issue 44 item 2 on the DRA dialect: the namespace may run no ``urgent`` pod, a
    PodGroup naming ``urgent`` is admitted all the same (priority 10000), and its member of
    class ``batch`` (10) preempts nobody: members preempt with the lower of the group's and
    their own priority. The same member in a group of its own class (``keep``, 100) does."""
    env.no_pods_of_class(plane, ns, "no-urgent", "urgent")
    template(plane, ns, "all-of-a-card", "44Gi")
    template(plane, ns, "half-a-card", "20Gi")
    names = [f"low-{i}" for i in range(4)]
    for name in names:
        create(plane, ns, name, "all-of-a-card", "batch")
        wait_for(f"{name}'s claim", lambda n=name: claim_of(plane, ns, n), 60)
    lifted = _pod_group(plane, ns, "lifted", "urgent")
    assert lifted["spec"]["priority"] == CLASSES["urgent"]
    body = claim_pod("member", template="half-a-card", scheduler=SCHEDULER)
    body["spec"].update(priorityClassName="batch", schedulingGroup={"podGroupName": "lifted"})
    plane.create(f"/api/v1/namespaces/{ns}/pods", body)

    def told() -> str | None:
        obj = get_pod(plane, ns, "member")
        for condition in (obj or {}).get("status", {}).get("conditions") or []:
            if condition["type"] == "PodScheduled" and condition.get("status") == "False":
                return str(condition.get("message") or "") or None
        return None

    message = wait_for("the member's PodScheduled=False", told, 60)
    assert f"pod group {ns}/lifted" in message
    assert "preempted" not in message
    for name in names:
        kept = get_pod(plane, ns, name)
        assert kept is not None
        assert not kept["metadata"].get("deletionTimestamp")
    assert "Preempting" not in reasons_of(plane, ns, "member")
    # The same shape in a group whose class the member's own priority reaches preempts.
    _pod_group(plane, ns, "fair", "keep")
    body = claim_pod("fair-member", template="half-a-card", scheduler=SCHEDULER)
    body["spec"].update(priorityClassName="keep", schedulingGroup={"podGroupName": "fair"})
    plane.create(f"/api/v1/namespaces/{ns}/pods", body)
    wait_for("one low pod to go", lambda: sum(get_pod(plane, ns, n) is None for n in names), 60)
    wait_for("fair-member's claim", lambda: claim_of(plane, ns, "fair-member"), 60)
    assert over_committed(plane) == []


def test_an_urgent_claim_evicts_an_all_group_whole_and_binds(
    plane: ControlPlane, operator: OperatorThread, ns: str
) -> None:
    """Issue 47 item 1 / issue 44 item 3 on the DRA dialect: two ``batch`` members of a
    ``disruptionMode: all`` gang hold a whole card each, two ``keep`` pods the other two;
    the urgent pod's claim fits once one card frees: the group (of lower priority than the
    ``keep`` pods) goes whole, both members, and the urgent pod is bound after."""
    template(plane, ns, "all-of-a-card", "44Gi")
    template(plane, ns, "half-a-card", "20Gi")
    for name in ("keep-a", "keep-b"):
        create(plane, ns, name, "all-of-a-card", "keep")
        wait_for(f"{name}'s claim", lambda n=name: claim_of(plane, ns, n), 60)
    group = {
        "apiVersion": gangs.API_VERSION,
        "kind": "PodGroup",
        "metadata": {"name": "whole"},
        "spec": {"schedulingPolicy": {"gang": {"minCount": 2}}, "disruptionMode": {"all": {}}},
    }
    plane.create(f"/apis/{gangs.API_VERSION}/namespaces/{ns}/podgroups", group)
    members = ("w0", "w1")
    for name in members:
        body = claim_pod(name, template="all-of-a-card", scheduler=SCHEDULER)
        body["spec"].update(priorityClassName="batch", schedulingGroup={"podGroupName": "whole"})
        plane.create(f"/api/v1/namespaces/{ns}/pods", body)
    for name in members:
        wait_for(f"{name}'s claim", lambda n=name: claim_of(plane, ns, n), 60)

    create(plane, ns, "urgent", "half-a-card", "urgent")
    for name in members:
        wait_for(f"{name} to be gone", lambda n=name: get_pod(plane, ns, n) is None, 60)
    wait_for("urgent's claim", lambda: claim_of(plane, ns, "urgent"), 60)
    for name in ("keep-a", "keep-b"):
        kept = get_pod(plane, ns, name)
        assert kept is not None
        assert not kept["metadata"].get("deletionTimestamp")
    assert over_committed(plane) == []
    wait_for("the Preempting event", lambda: "Preempting" in reasons_of(plane, ns, "urgent"), 30)
    for name in members:
        wait_for(f"{name}'s Event", lambda n=name: "Preempted" in reasons_of(plane, ns, n), 30)
