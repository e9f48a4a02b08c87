"""The same whole-GPU gangs given to two schedulers on twin node groups (issue 36): once to
kube-scheduler (its gang plugin on, ``GenericWorkload``) and once to the operator, each in
its own namespace on its own identical KWOK nodes with ``nvidia.com/gpu`` capacity. Used by
``test_gangs_side_by_side.py`` (the same groups end up bound) and by
``tests/bench/bench_gangs_side_by_side.py`` (gang pods per second of each).

Imported as ``integration.gang_twin``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from integration import operator_env as env

from vgpu_operator.scheduling.gangs import gangs
from vgpu_operator.testing.controlplane import ControlPlane

Json = dict[str, Any]
KUBE_SCHEDULER = "default-scheduler"


@dataclass(frozen=True)
class Twin:
    """One side: the namespace its PodGroups and pods live in, the scheduler its pods name,
    the node group (``env.TEST_LABEL``) its pods select, and whether its nodes carry our
    DeviceInventory (the operator's) or only ``nvidia.com/gpu`` capacity (kube-scheduler's)."""

    namespace: str
    scheduler: str
    node_group: str
    inventory: bool


@dataclass(frozen=True)
class Gang:
    name: str
    min_count: int
    members: int


def groups_path(namespace: str) -> str:
    return f"/apis/{gangs.API_VERSION}/namespaces/{namespace}/podgroups"


def make_nodes(cp: ControlPlane, twin: Twin, nodes: int, gpus: int) -> list[str]:
    """``nodes`` KWOK nodes of ``gpus`` whole GPUs each (the same capacity on both sides)."""
    made = []
    for i in range(nodes):
        name = f"{twin.node_group}-{i}"
        env.gpu_node(
            cp,
            name,
            env.cards(name, gpus),
            group=twin.node_group,
            inventory=twin.inventory,
        )
        made.append(name)
    return made


def member(twin: Twin, gang: str, index: int) -> Json:
    """A member asking one whole GPU: ``nvidia.com/gpu: 1`` and nothing else (the operator
    gives it a whole card: no memory or cores asked means all of them)."""
    pod = env.gpu_pod(
        twin.namespace,
        f"{gang}-{index}",
        scheduler=twin.scheduler,
        group=twin.node_group,
    )
    pod["spec"]["schedulingGroup"] = {"podGroupName": gang}
    return pod


def create_gangs(cp: ControlPlane, twin: Twin, wanted: Iterable[Gang]) -> None:
    """Each gang's PodGroup, then its members."""
    for gang in wanted:
        cp.create(
            groups_path(twin.namespace),
            {
                "apiVersion": gangs.API_VERSION,
                "kind": "PodGroup",
                "metadata": {"name": gang.name},
                "spec": {"schedulingPolicy": {"gang": {"minCount": gang.min_count}}},
            },
        )
        for i in range(gang.members):
            env.create_pod(cp, member(twin, gang.name, i))


def pods_by_gang(cp: ControlPlane, namespace: str) -> dict[str, list[Json]]:
    out: dict[str, list[Json]] = {}
    for pod in env.list_pods(cp, namespace):
        group = ((pod.get("spec") or {}).get("schedulingGroup") or {}).get("podGroupName")
        if group:
            out.setdefault(str(group), []).append(pod)
    return out


def bound_count(pods: Sequence[Mapping[str, Any]]) -> int:
    return sum(1 for p in pods if (p.get("spec") or {}).get("nodeName"))


def outcome(cp: ControlPlane, namespace: str) -> dict[str, int]:
    """gang name -> how many of its members are bound."""
    return {name: bound_count(pods) for name, pods in pods_by_gang(cp, namespace).items()}


def waiting_marked(cp: ControlPlane, namespace: str, gang: str) -> bool:
    """Every member of ``gang`` unbound with ``PodScheduled=False`` (the scheduler tried it
    and said why)."""
    pods = pods_by_gang(cp, namespace).get(gang, [])
    if not pods:
        return False
    for pod in pods:
        if (pod.get("spec") or {}).get("nodeName"):
            return False
        cond = env.condition(pod) or {}
        if cond.get("status") != "False":
            return False
    return True
