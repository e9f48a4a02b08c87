"""The engine allocating ResourceClaims, beside the real kube-scheduler (issue 26).

One control plane of its own: kube-apiserver, kube-scheduler, kube-controller-manager's
resource claim controller (templates become claims, claims of finished pods are released)
and garbage collector, KWOK nodes on the DRA path with an agent each publishing its
ResourceSlice, and the operator. Pods naming the operator's scheduler are allocated by the
engine (its policies, the claims' selectors); pods naming no scheduler by kube-scheduler,
on the same slices. Every test ends with a recount of every claim: no card over-committed.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
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
    exactly,
    fresh_namespace,
    node_slice,
    scheduling_news,
)
from integration.test_agent import wait_for

from vgpu_operator.devices import dra
from vgpu_operator.devices.quantity import parse_quantity
from vgpu_operator.handlers.app import WEBHOOK_ID
from vgpu_operator.handlers.runtime import OperatorThread
from vgpu_operator.testing.binaries import Binaries
from vgpu_operator.testing.controlplane import AdminRequestError, ControlPlane

pytestmark = pytest.mark.integration

NODES = ("dra-one", "dra-two")  # l40s-pcie-4 each: four 46068 MiB cards
SPLIT = 4
SCHEDULER = "vgpu-dra-engine"
CLAIMS = f"{RESOURCE}/resourceclaims"


@pytest.fixture(scope="module")
def plane(
    control_plane_binaries: Binaries, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    work = tmp_path_factory.mktemp("dra-engine")
    machines = dict.fromkeys(NODES, "l40s-pcie-4")
    with dra_plane(control_plane_binaries, work, machines, split=SPLIT) as cp:
        yield cp


@pytest.fixture(scope="module")
def operator(plane: ControlPlane) -> Iterator[OperatorThread]:
    policies = "  gpuSchedulerPolicy: binpack\n  nodeSchedulerPolicy: binpack\n"
    with dra_operator(plane, "vgpu-dra-engine-config", SCHEDULER, policies) as running:
        yield running


@pytest.fixture(autouse=True)
def no_card_over_committed(plane: ControlPlane) -> Iterator[None]:
    yield
    assert over_committed(plane) == []


def over_committed(plane: ControlPlane) -> list[str]:
    """Every device whose claims, all of them, consume more than its slice publishes."""
    claims = plane.get(CLAIMS)["items"]
    totals = dra.recount(claims)
    problems = []
    for node in NODES:
        found = node_slice(plane, node)
        assert found is not None
        for device in found["spec"]["devices"]:
            used = totals.get((node, device["name"]))
            if used is None:
                continue
            capacity = {k: parse_quantity(v["value"]) for k, v in device["capacity"].items()}
            if (
                used.memory_bytes > capacity[dra.MEMORY]
                or used.cores > capacity[dra.CORES]
                or used.shares > capacity[dra.SHARES]
            ):
                problems.append(f"{node}/{device['name']}: {used}")
    return problems


def template(
    plane: ControlPlane,
    namespace: str,
    name: str,
    capacity: dict[str, str] | None,
    *,
    selector: str | None = None,
    count: int = 1,
) -> None:
    asked = exactly(capacity, selector=selector, count=count)
    create_claim_template(plane, namespace, name, asked)


def pod(
    plane: ControlPlane,
    namespace: str,
    name: str,
    *,
    template_name: str | None = None,
    claim_name: str | None = None,
    ours: bool = True,
    node: str | None = None,
) -> None:
    scheduler = SCHEDULER if ours else None
    body = claim_pod(name, claim=claim_name, template=template_name, scheduler=scheduler, node=node)
    plane.create(f"/api/v1/namespaces/{namespace}/pods", body)


def claim_of(plane: ControlPlane, namespace: str, name: str) -> dict[str, Any] | None:
    """The pod's claim, once the pod is bound."""
    obj = plane.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    if not obj["spec"].get("nodeName"):
        return None
    statuses = obj.get("status", {}).get("resourceClaimStatuses") or []
    claim = statuses[0]["resourceClaimName"] if statuses else None
    if claim is None:
        entries = obj["spec"]["resourceClaims"]
        claim = entries[0].get("resourceClaimName")
    return plane.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{claim}")


def results(claim: dict[str, Any]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = claim["status"]["allocation"]["devices"]["results"]
    return found


def pending_message(
    plane: ControlPlane, namespace: str, name: str, containing: str = ""
) -> str | None:
    """The pod's PodScheduled=False message, once it contains ``containing`` (the first
    attempt may still wait for its claim to be made)."""
    _, message = scheduling_news(plane, namespace, name)
    return message if message is not None and containing in message else None


def card(index: int) -> str:
    return f'device.attributes["{dra.DRIVER}"].index == {index}'


def test_the_engine_allocates_a_claim_and_binds_its_pod(
    plane: ControlPlane, operator: OperatorThread
) -> None:
    ns = fresh_namespace(plane)
    template(plane, ns, "quarter", {"memory": "10Gi", "cores": "25"})
    pod(plane, ns, "first", template_name="quarter")
    claim = wait_for("the engine's allocation", lambda: claim_of(plane, ns, "first"), 60)
    [result] = results(claim)
    assert result["driver"] == dra.DRIVER
    assert parse_quantity(result["consumedCapacity"]["memory"]) == 10 * 2**30
    assert parse_quantity(result["consumedCapacity"]["cores"]) == 25
    assert parse_quantity(result["consumedCapacity"]["shares"]) == 1
    assert uuid.UUID(result["shareID"])
    bound = plane.get(f"/api/v1/namespaces/{ns}/pods/first")
    assert bound["spec"]["nodeName"] == result["pool"]
    terms = claim["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"]
    assert terms[0]["matchFields"][0]["values"] == [result["pool"]]
    assert [r["uid"] for r in claim["status"]["reservedFor"]] == [bound["metadata"]["uid"]]
    assert "resource.kubernetes.io/delete-protection" in claim["metadata"]["finalizers"]
    # binpack (the ConfigMap's GPU and node policy): the next share goes on the same card.
    pod(plane, ns, "second", template_name="quarter")
    second = wait_for("the second allocation", lambda: claim_of(plane, ns, "second"), 60)
    [other] = results(second)
    assert (other["pool"], other["device"]) == (result["pool"], result["device"])
    assert other["shareID"] != result["shareID"]


def test_a_claim_shared_by_two_pods_is_allocated_once(
    plane: ControlPlane, operator: OperatorThread
) -> None:
    ns = fresh_namespace(plane)
    shared = {"deviceClassName": dra.SHARED_CLASS, "capacity": {"requests": {"memory": "2Gi"}}}
    create_claim(plane, ns, "shared", shared)
    pod(plane, ns, "a", claim_name="shared")
    first = wait_for("the shared claim", lambda: claim_of(plane, ns, "a"), 60)
    pod(plane, ns, "b", claim_name="shared")
    wait_for("the second pod", lambda: claim_of(plane, ns, "b"), 60)
    claim = plane.get(f"{RESOURCE}/namespaces/{ns}/resourceclaims/shared")
    assert results(claim) == results(first)  # not allocated again
    pods = {plane.get(f"/api/v1/namespaces/{ns}/pods/{p}")["metadata"]["uid"] for p in "ab"}
    assert {r["uid"] for r in claim["status"]["reservedFor"]} == pods
    nodes = {plane.get(f"/api/v1/namespaces/{ns}/pods/{p}")["spec"]["nodeName"] for p in "ab"}
    assert nodes == {results(claim)[0]["pool"]}


def test_kube_schedulers_allocations_are_counted(
    plane: ControlPlane, operator: OperatorThread
) -> None:
    ns = fresh_namespace(plane)
    # kube-scheduler takes 40 GiB of card 3 on dra-two; 10 GiB more does not fit there.
    template(plane, ns, "big", {"memory": "40Gi"}, selector=card(3))
    pod(plane, ns, "upstream", template_name="big", ours=False, node="dra-two")
    upstream = wait_for("kube-scheduler's allocation", lambda: claim_of(plane, ns, "upstream"), 60)
    template(plane, ns, "rest", {"memory": "10Gi"}, selector=card(3))
    pod(plane, ns, "ours", template_name="rest", node="dra-two")
    message = wait_for(
        "the engine to refuse",
        lambda: pending_message(plane, ns, "ours", "CardInsufficientMemory"),
        60,
    )
    assert "dra-one" not in message  # the node selector: "1 NodeSelectorMismatch"
    # 4 GiB does fit beside it (46068 MiB - 40 GiB = 5108 MiB), on the same card.
    template(plane, ns, "small", {"memory": "4Gi"}, selector=card(3))
    pod(plane, ns, "small", template_name="small", node="dra-two")
    claim = wait_for("the small share", lambda: claim_of(plane, ns, "small"), 60)
    assert (results(claim)[0]["pool"], results(claim)[0]["device"]) == (
        "dra-two",
        results(upstream)[0]["device"],
    )


def test_a_selector_the_engine_refuses_is_said_on_the_pod(
    plane: ControlPlane, operator: OperatorThread
) -> None:
    ns = fresh_namespace(plane)
    optional = f'device.attributes["{dra.DRIVER}"].?index.orValue(0) == 1'
    template(plane, ns, "odd", {"memory": "1Gi"}, selector=optional)
    pod(plane, ns, "odd", template_name="odd")
    wait_for("the refusal", lambda: pending_message(plane, ns, "odd", "does not parse here"), 60)


def cards_with_room(plane: ControlPlane, node: str, memory: int) -> int:
    """How many of the node's cards have ``memory`` bytes free, by every claim."""
    totals = dra.recount(plane.get(CLAIMS)["items"])
    found = node_slice(plane, node)
    assert found is not None
    room = 0
    for device in found["spec"]["devices"]:
        used = totals.get((node, device["name"]))
        free = parse_quantity(device["capacity"][dra.MEMORY]["value"]) - (
            used.memory_bytes if used else 0
        )
        shares = int(device["capacity"][dra.SHARES]["value"]) - (int(used.shares) if used else 0)
        room += free >= memory and shares > 0
    return room


@pytest.mark.parametrize("first", ["kube-scheduler", "engine"])
def test_both_allocators_at_once_never_over_commit_a_card(
    plane: ControlPlane, operator: OperatorThread, first: str
) -> None:
    """Pods for kube-scheduler and for the engine arrive together on the same cards (one
    node, 30 GiB each: two cannot share a card), in both orders: every card with room
    ends with one of them, none with two."""
    ns = fresh_namespace(plane)
    room = cards_with_room(plane, "dra-one", 30 * 2**30)
    assert room >= 2
    template(plane, ns, "third", {"memory": "30Gi"})
    pods = [(f"up-{i}", False) for i in range(room + 1)]
    pods += [(f"ours-{i}", True) for i in range(room + 1)]
    if first == "engine":
        pods.reverse()
    threads = [
        threading.Thread(
            target=pod,
            args=(plane, ns, name),
            kwargs={"template_name": "third", "ours": ours, "node": "dra-one"},
        )
        for name, ours in pods
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    def bound() -> list[str]:
        return [
            p["metadata"]["name"]
            for p in plane.get(f"/api/v1/namespaces/{ns}/pods")["items"]
            if p["spec"].get("nodeName")
        ]

    wait_for("every card with room to be taken", lambda: len(bound()) >= room or None, 90)
    time.sleep(3)  # anything still in flight lands
    assert over_committed(plane) == []
    placed = bound()
    assert len(placed) == room, placed
    for name in placed:
        assert claim_of(plane, ns, name) is not None
    for p in plane.get(f"/api/v1/namespaces/{ns}/pods")["items"]:
        plane.delete(f"/api/v1/namespaces/{ns}/pods/{p['metadata']['name']}")

    def released() -> bool | None:
        claims = plane.get(f"{RESOURCE}/namespaces/{ns}/resourceclaims")["items"]
        return True if not any((c.get("status") or {}).get("allocation") for c in claims) else None

    wait_for("the claims to be released", released, 60)


def test_a_restarted_operator_rebuilds_the_books_from_the_claims(
    plane: ControlPlane, operator: OperatorThread
) -> None:
    ns = fresh_namespace(plane)
    template(plane, ns, "most", {"memory": "40Gi"}, selector=card(2))
    pod(plane, ns, "held", template_name="most", node="dra-one")
    wait_for("the first claim", lambda: claim_of(plane, ns, "held"), 60)
    with dra_operator(plane, "vgpu-dra-engine-restart", f"{SCHEDULER}-2") as fresh:
        wait_for("the new operator's books", lambda: fresh.app.synced or None, 60)
        state = fresh.app.running.state
        assert state is not None
        holds = state.claim_holds()
        held = claim_of(plane, ns, "held")
        assert held is not None
        key = f"{ns}/{held['metadata']['name']}"
        assert holds.get(key) == "dra-one"
        template(plane, ns, "more", {"memory": "10Gi"}, selector=card(2))
        spec_pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "more"},
            "spec": {
                "schedulerName": f"{SCHEDULER}-2",
                "nodeSelector": {"kubernetes.io/hostname": "dra-one"},
                "containers": [
                    {"name": "main", "image": "cuda", "resources": {"claims": [{"name": "gpu"}]}}
                ],
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "more"}],
                "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}],
            },
        }
        plane.create(f"/api/v1/namespaces/{ns}/pods", spec_pod)
        wait_for(
            "the refusal",
            lambda: pending_message(plane, ns, "more", "CardInsufficientMemory"),
            60,
        )


def test_a_hami_style_pod_in_a_dra_namespace_becomes_a_claim(
    plane: ControlPlane, operator: OperatorThread, tmp_path: Path
) -> None:
    """The webhook of an operator whose device config puts the namespace on the DRA path:
    the pod's nvidia.com/gpu, gpumem and gpucores and its use-gputype annotation become a
    ResourceClaimTemplate's request; the pod is placed on a DRA node by the engine."""
    from integration.test_operator_webhook import WEBHOOKS, make_pki

    from vgpu_operator.control.options import WebhookOptions
    from vgpu_operator.testing.processes import free_port

    ns = fresh_namespace(plane)
    config_ns = f"{ns}-config"
    plane.ensure_namespace(config_ns)
    scheduler = f"{SCHEDULER}-webhook"
    extra = f"dra:\n  claimNamespaces: [{ns}]\n"
    env.put_config_map(plane, config_ns, f"scheduler:\n  schedulerName: {scheduler}\n{extra}")
    pki = make_pki(tmp_path)
    port = free_port()
    webhook = WebhookOptions(
        port=port, addr="127.0.0.1", certfile=pki.cert, pkeyfile=pki.key, cafile=pki.ca
    )
    hook_config = f"vgpu-dra-{ns}"
    options = env.options(plane, config_ns, webhook=webhook, inventory_timeout_s=None)
    with OperatorThread(options) as converting:
        # Until it has read its config, the webhook lets pods through unchanged (its
        # failurePolicy is Ignore): the pod is created once the operator holds its picture.
        wait_for("the operator's books", lambda: converting.app.synced or None, 60)
        env.register_pod_webhook(
            plane, hook_config, ns, f"https://127.0.0.1:{port}/{WEBHOOK_ID}", pki.ca.read_bytes()
        )
        try:
            hami_pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "hami", "annotations": {"nvidia.com/use-gputype": "l40s"}},
                "spec": {
                    "containers": [
                        {
                            "name": "main",
                            "image": "cuda",
                            "resources": {
                                "limits": {
                                    "nvidia.com/gpu": "1",
                                    "nvidia.com/gpumem": "8192",
                                    "nvidia.com/gpucores": "30",
                                }
                            },
                        }
                    ],
                    "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}],
                },
            }

            def created() -> dict[str, Any] | None:
                try:
                    return plane.create(f"/api/v1/namespaces/{ns}/pods", hami_pod)
                except AdminRequestError as exc:  # the webhook server may not answer yet
                    if exc.status == 409:
                        return plane.get(f"/api/v1/namespaces/{ns}/pods/hami")
                    return None

            made = wait_for("the webhook to admit the pod", created, 30)
            container = made["spec"]["containers"][0]
            assert container["resources"].get("limits", {}) == {}
            [entry] = made["spec"]["resourceClaims"]
            assert container["resources"]["claims"] == [{"name": entry["name"]}]
            assert made["spec"]["schedulerName"] == scheduler
            template_obj = plane.get(
                f"{RESOURCE}/namespaces/{ns}/resourceclaimtemplates/"
                f"{entry['resourceClaimTemplateName']}"
            )
            [request] = template_obj["spec"]["spec"]["devices"]["requests"]
            assert request["exactly"]["capacity"]["requests"] == {"memory": "8Gi", "cores": "30"}
            claim = wait_for("the engine's allocation", lambda: claim_of(plane, ns, "hami"), 60)
            [result] = results(claim)
            assert parse_quantity(result["consumedCapacity"]["memory"]) == 8192 * 2**20
            assert parse_quantity(result["consumedCapacity"]["cores"]) == 30
            assert claim["metadata"]["ownerReferences"][0]["name"] == "hami"
        finally:
            plane.delete(f"{WEBHOOKS}/{hook_config}")
