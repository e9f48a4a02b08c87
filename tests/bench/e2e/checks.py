"""After each run: every pod bound or pending with a reason, and no card over-committed,
recounted from the API server's pods against the inventories' cards."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from e2e.api import Json
from vgpu_operator.testing import pod_allocation


@dataclass
class Check:
    pods: int = 0
    bound: int = 0
    pending_with_reason: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        head = (
            f"{self.pods} pods: {self.bound} bound, "
            f"{self.pending_with_reason} pending with a reason"
        )
        if self.ok:
            return head + "; no card over-committed"
        return head + f"; {len(self.problems)} problems: " + "; ".join(self.problems[:5])


def scheduled_condition(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled":
            return dict(condition)
    return None


def _gpu_request(pod: Mapping[str, Any]) -> int:
    total = 0
    for container in (pod.get("spec") or {}).get("containers") or []:
        limits = (container.get("resources") or {}).get("limits") or {}
        total += int(limits.get("nvidia.com/gpu", 0))
    return total


def recount(
    pods: Sequence[Json],
    cards: Mapping[str, tuple[str, int, int, int]],
    gpus_per_node: Mapping[str, int],
) -> Check:
    """``cards``: uuid -> (node, memory MiB, cores, split count). Pods the operator bound
    are recounted by card from their allocation annotations; pods bound by anyone else
    (kube-scheduler, the ceiling) by ``nvidia.com/gpu`` per node."""
    check = Check()
    used: dict[str, list[int]] = {}
    per_node: dict[str, int] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            continue
        check.pods += 1
        name = f"{meta.get('namespace')}/{meta.get('name')}"
        node = (pod.get("spec") or {}).get("nodeName")
        if not node:
            condition = scheduled_condition(pod)
            if condition and condition.get("status") == "False" and condition.get("message"):
                check.pending_with_reason += 1
            else:
                check.problems.append(f"{name} pending without a reason")
            continue
        check.bound += 1
        allocation = pod_allocation.nvidia_devices(pod)
        if not allocation:
            per_node[node] = per_node.get(node, 0) + _gpu_request(pod)
            continue
        for uuid, memory, cores in allocation:
            card = cards.get(uuid)
            if card is None:
                check.problems.append(f"{name} holds unknown card {uuid}")
                continue
            if card[0] != node:
                check.problems.append(f"{name} on {node} holds {uuid} of {card[0]}")
            total = used.setdefault(uuid, [0, 0, 0])
            total[0] += memory
            total[1] += cores
            total[2] += 1
    for uuid, (memory, cores, shares) in used.items():
        _node, memory_limit, core_limit, split = cards[uuid]
        if memory > memory_limit or cores > core_limit or shares > split:
            check.problems.append(
                f"{uuid} over-committed: {memory}/{memory_limit} MiB, {cores}/{core_limit} "
                f"cores, {shares}/{split} shares"
            )
    # Whole cards counted by kube-scheduler-style placements share the node with ours.
    for node, wanted in per_node.items():
        ours = sum(1 for uuid, (n, *_rest) in cards.items() if n == node and uuid in used)
        if wanted + ours > gpus_per_node.get(node, 0):
            check.problems.append(
                f"node {node}: {wanted} + {ours} cards of {gpus_per_node.get(node, 0)}"
            )
    return check
