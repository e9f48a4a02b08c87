"""MIG on the DRA path, on the live API server with the real kube-scheduler (issue 39):
the agent of a node with a card in MIG mode publishes it as partitionable devices (a
counters slice and a slice of profile placements beside the share devices' slice), the
API server keeps the counters, and kube-scheduler's allocator, honouring them, never
gives two instances that overlap on the card. Then the operator's engine allocates a MIG
claim beside kube-scheduler's instances (by its MIG rules, never overlapping them) and
the node's driver prepares it as kubelet would."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from integration import operator_env as env
from integration.dra_env import (
    RESOURCE,
    SLICES,
    claim_pod,
    create_claim_template,
    dra_operator,
    dra_plane,
    fresh_namespace,
    unschedulable_message,
)
from integration.test_agent import AgentThread, wait_for
from integration.test_dra_alternatives import prepared_by_driver

from vgpu_operator.agent.sim_machine import resolve_machine_path
from vgpu_operator.devices import dra, dra_mig
from vgpu_operator.handlers.runtime import OperatorThread
from vgpu_operator.testing.binaries import Binaries
from vgpu_operator.testing.controlplane import ControlPlane

NODE = "node-a100-mig"  # a100-mig with no instance: card 0 in MIG mode (A100 40GB), card 1 shared
#: The bundled a100-mig as it is: card 0 holds a 3g, a 2g and a 1g before its agent starts.
BUSY = "node-a100-mig-busy"
SCHEDULER = "vgpu-dra-mig"
#: The node's agent (its DRA driver), while the module's control plane runs.
AGENTS: list[AgentThread] = []


def _mig_class(cp: ControlPlane) -> None:
    # manifests/dra-deviceclasses.yaml, installed by the fixture, holds the MIG class.
    assert cp.get(f"{RESOURCE}/deviceclasses/{dra_mig.MIG_CLASS}")


@pytest.fixture(scope="module")
def cluster(
    control_plane_binaries: Binaries, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    work = tmp_path_factory.mktemp("dra-mig")
    clear = yaml.safe_load(resolve_machine_path("a100-mig").read_text())
    clear["gpus"][0]["migInstances"] = []
    (work / "a100-mig-clear.yaml").write_text(yaml.safe_dump(clear))
    with dra_plane(
        control_plane_binaries,
        work,
        {NODE: str(work / "a100-mig-clear.yaml"), BUSY: "a100-mig"},
        split=4,
        before_scheduler=_mig_class,
        agents_out=AGENTS,
    ) as plane:
        yield plane


@pytest.fixture(scope="module")
def operator(cluster: ControlPlane) -> Iterator[OperatorThread]:
    with dra_operator(cluster, "vgpu-dra-mig-config", SCHEDULER) as running:
        yield running


def pool(cluster: ControlPlane, node: str = NODE) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.request(
        "GET", f"{SLICES}?fieldSelector=spec.nodeName%3D{node}"
    )["items"]
    return items if len(items) == 3 else []


def profile_pod(
    cluster: ControlPlane,
    ns: str,
    name: str,
    profile: str,
    scheduler: str | None = None,
    node: str = NODE,
) -> None:
    selector = f'device.attributes["{dra.DRIVER}"].profile == "{profile}"'
    create_claim_template(
        cluster,
        ns,
        name,
        {"deviceClassName": dra_mig.MIG_CLASS, "selectors": [{"cel": {"expression": selector}}]},
    )
    cluster.create(
        f"/api/v1/namespaces/{ns}/pods",
        claim_pod(name, template=name, scheduler=scheduler, node=node),
    )


def allocated_device(cluster: ControlPlane, ns: str, pod: str) -> str | None:
    obj = cluster.get(f"/api/v1/namespaces/{ns}/pods/{pod}")
    statuses = obj.get("status", {}).get("resourceClaimStatuses") or []
    if not obj["spec"].get("nodeName") or not statuses:
        return None
    claim = cluster.get(
        f"{RESOURCE}/namespaces/{ns}/resourceclaims/{statuses[0]['resourceClaimName']}"
    )
    allocation = (claim.get("status") or {}).get("allocation")
    if allocation is None:
        return None
    (result,) = allocation["devices"]["results"]
    return str(result["device"])


def earlier_namespace(cluster: ControlPlane) -> str:
    """The namespace of the tests before (``mig-...``): the later tests go on from there."""
    return next(
        n["metadata"]["name"]
        for n in cluster.get("/api/v1/namespaces")["items"]
        if n["metadata"]["name"].startswith("mig")
    )


def test_the_mig_card_is_published_as_counters_and_placements(cluster: ControlPlane) -> None:
    slices = wait_for("the node's three slices", lambda: pool(cluster), timeout=60)
    by_name = {s["metadata"]["name"]: s["spec"] for s in slices}
    counters = by_name[dra_mig.counters_slice_name(NODE)]["sharedCounters"]
    assert len(counters) == 1  # one MIG card
    assert counters[0]["counters"]["compute-slices"]["value"] == "7"
    devices = by_name[dra_mig.mig_slice_name(NODE, 0)]["devices"]
    assert len(devices) == 14
    assert all(d["consumesCounters"][0]["counterSet"] == counters[0]["name"] for d in devices)
    assert {s["pool"]["resourceSliceCount"] for s in by_name.values()} == {3}
    # The shared card is still its one device; the MIG card is not offered as shares.
    assert len(by_name[dra.slice_name(NODE)]["devices"]) == 1


def test_kube_scheduler_never_gives_overlapping_instances(cluster: ControlPlane) -> None:
    wait_for("the node's three slices", lambda: pool(cluster), timeout=60)
    ns = fresh_namespace(cluster, "mig")
    profile_pod(cluster, ns, "four", "4g.20gb")
    four = wait_for("the 4g instance", lambda: allocated_device(cluster, ns, "four"), 60)
    assert four.endswith("-mig-4g-20gb-0")
    profile_pod(cluster, ns, "three", "3g.20gb")
    three = wait_for("the 3g instance", lambda: allocated_device(cluster, ns, "three"), 60)
    assert three.endswith("-mig-3g-20gb-4")  # 3g at 0 overlaps the 4g: only 4 is left
    # Every memory slice is now held: no 1g fits, whatever its start.
    profile_pod(cluster, ns, "one", "1g.5gb")
    wait_for("the 1g pod to be refused", lambda: unschedulable_message(cluster, ns, "one"), 60)
    assert allocated_device(cluster, ns, "one") is None


def claim_of(cluster: ControlPlane, ns: str, pod: str) -> dict[str, Any]:
    obj = cluster.get(f"/api/v1/namespaces/{ns}/pods/{pod}")
    name = obj["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    return cluster.get(f"{RESOURCE}/namespaces/{ns}/resourceclaims/{name}")


def test_the_engine_places_a_mig_claim_beside_kube_schedulers_and_the_driver_prepares_it(
    cluster: ControlPlane, operator: OperatorThread
) -> None:
    # After the test above: kube-scheduler's 4g at 0 and 3g at 4 hold the card; the 1g
    # pod waits. Both go but the 4g: memory slices 4 to 7 are free again.
    ns = earlier_namespace(cluster)
    for pod in ("three", "one"):
        cluster.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{pod}?gracePeriodSeconds=0")

    def freed() -> bool:
        claims = cluster.get(f"{RESOURCE}/namespaces/{ns}/resourceclaims")["items"]
        held = [c for c in claims if (c.get("status") or {}).get("allocation")]
        return len(held) == 1

    wait_for("the 3g instance released", freed, 60)
    profile_pod(cluster, ns, "engine-one", "1g.5gb", scheduler=SCHEDULER)
    one = wait_for("the engine's 1g", lambda: allocated_device(cluster, ns, "engine-one"), 60)
    assert one.endswith("-mig-1g-5gb-6")  # v2.10: 1g from the highest start; 0-3 are held
    profile_pod(cluster, ns, "engine-two", "2g.10gb", scheduler=SCHEDULER)
    two = wait_for("the engine's 2g", lambda: allocated_device(cluster, ns, "engine-two"), 60)
    assert two.endswith("-mig-2g-10gb-4")  # the only 2g left beside the 4g and the 1g
    # Nothing is left for a 3g: the engine says so on the pod, and allocates nothing.
    profile_pod(cluster, ns, "engine-three", "3g.20gb", scheduler=SCHEDULER)

    # (Its first word may be that the claim controller has not made its claim yet.)
    def refused() -> str | None:
        message = unschedulable_message(cluster, ns, "engine-three")
        return message if message and "does not exist yet" not in message else None

    message = wait_for("the 3g refused", refused, 60)
    assert "CardMigTopologyInfeasible" in message
    claim = claim_of(cluster, ns, "engine-one")
    assert "consumedCapacity" not in claim["status"]["allocation"]["devices"]["results"][0]
    assert prepared_by_driver(AGENTS[0], claim) == ""
    # The engine's instances go: their counters come back, and the waiting 3g is placed
    # (at 4: the 4g still holds 0 to 3) without being created again.
    for pod in ("engine-one", "engine-two"):
        cluster.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{pod}?gracePeriodSeconds=0")
    three = wait_for("the 3g placed", lambda: allocated_device(cluster, ns, "engine-three"), 90)
    assert three.endswith("-mig-3g-20gb-4")


def test_a_mig_pod_of_higher_priority_evicts_the_instances_in_its_way(
    cluster: ControlPlane, operator: OperatorThread
) -> None:
    # After the test above: kube-scheduler's 4g at 0 and the engine's 3g at 4 hold the
    # card, both pods of priority 0. A 7g of priority 1000 needs the card whole: both go,
    # and once the claim controller has released their claims the 7g is allocated.
    ns = earlier_namespace(cluster)
    cluster.create(
        "/apis/scheduling.k8s.io/v1/priorityclasses",
        {"apiVersion": "scheduling.k8s.io/v1", "metadata": {"name": "mig-urgent"}, "value": 1000},
    )
    selector = f'device.attributes["{dra.DRIVER}"].profile == "7g.40gb"'
    create_claim_template(
        cluster,
        ns,
        "urgent",
        {"deviceClassName": dra_mig.MIG_CLASS, "selectors": [{"cel": {"expression": selector}}]},
    )
    body = claim_pod("urgent", template="urgent", scheduler=SCHEDULER, node=NODE)
    body["spec"]["priorityClassName"] = "mig-urgent"
    cluster.create(f"/api/v1/namespaces/{ns}/pods", body)

    def gone() -> bool:
        names = {
            p["metadata"]["name"] for p in cluster.get(f"/api/v1/namespaces/{ns}/pods")["items"]
        }
        return not names & {"four", "engine-three"}

    wait_for("the 4g and the 3g pods evicted", gone, 90)
    seven = wait_for("the 7g placed", lambda: allocated_device(cluster, ns, "urgent"), 90)
    assert seven.endswith("-mig-7g-40gb-0")


def test_instances_made_before_the_agent_started_are_taken_out_of_the_counters(
    cluster: ControlPlane,
) -> None:
    """Issue 47 item 7: the busy node's card runs a 3g at 4, a 2g at 0 and a 1g at 2,
    made before its agent started (no claim holds them). The agent reads their placements
    from NVML into the inventory and publishes the card's counters without their slices:
    memory slice 3 and one compute slice are left, so kube-scheduler's allocator gives a
    1g at 3 and no second instance, where counting the card empty would have overlapped."""
    slices = wait_for("the busy node's slices", lambda: pool(cluster, BUSY), timeout=60)
    by_name = {s["metadata"]["name"]: s["spec"] for s in slices}
    (counter_set,) = by_name[dra_mig.counters_slice_name(BUSY)]["sharedCounters"]
    values = {name: c["value"] for name, c in counter_set["counters"].items()}
    assert values["compute-slices"] == "1"
    free = sorted(n for n, v in values.items() if n.startswith("memory-slice") and v == "1")
    assert free == ["memory-slice-3"]
    inventory = cluster.get(f"{env.INVENTORIES}/{BUSY}")
    (card,) = [d for d in inventory["status"]["devices"] if d.get("mode") == "mig"]
    placements = {
        m["profile"]: (m["placementStart"], m["placementSize"]) for m in card["migInstances"]
    }
    assert placements == {"3g.20gb": (4, 4), "2g.10gb": (0, 2), "1g.5gb": (2, 1)}
    ns = fresh_namespace(cluster, "mig-busy")
    profile_pod(cluster, ns, "small", "1g.5gb", node=BUSY)
    small = wait_for("the 1g instance", lambda: allocated_device(cluster, ns, "small"), 60)
    assert small.endswith("-mig-1g-5gb-3")
    profile_pod(cluster, ns, "more", "1g.5gb", node=BUSY)
    wait_for("the second 1g to be refused", lambda: unschedulable_message(cluster, ns, "more"), 60)
    assert allocated_device(cluster, ns, "more") is None
