"""Generated DRA clusters for preemption's property tests: up to 8 DRA nodes of one or two
cards, bound pods holding allocated claims (some shared by two pods), priorities, start
times, a PodDisruptionBudget; and a model of what fits, kept apart from the engine (its
cards, claims and holders as plain numbers), with the exhaustive search for the best
victims by kube-scheduler's criteria."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field
from typing import Any

from vgpu_operator.config import DeviceConfig
from vgpu_operator.devices import dra
from vgpu_operator.scheduling.cycle.cluster import ClusterState

MEMORY_MIB = 10240
CORES = 100
SHARES = 4
PREEMPTOR_PRIORITY = 5
_OFFSET = 2**31
Json = dict[str, Any]


@dataclass
class ModelClaim:
    name: str
    node: str
    card: str
    memory_mib: int
    cores: int
    holders: list[str]  # pod names


@dataclass
class ModelPod:
    name: str
    node: str
    priority: int
    start: int
    protected: bool


@dataclass
class Case:
    nodes: dict[str, list[str]] = field(default_factory=dict)  # node -> card device names
    claims: dict[str, ModelClaim] = field(default_factory=dict)
    pods: dict[str, ModelPod] = field(default_factory=dict)
    allowed: int = 0  # the budget's disruptions allowed (pods labelled protected)
    want_memory_mib: int = 0
    want_cores: int = 0

    # --- the model ---------------------------------------------------------------------
    def free(self, card: str, node: str, gone: frozenset[str]) -> tuple[int, int, int]:
        """What the card has free once the pods ``gone`` left (claims of which every
        holder left are released)."""
        memory, cores, shares = MEMORY_MIB, CORES, SHARES
        for claim in self.claims.values():
            if claim.node != node or claim.card != card:
                continue
            if claim.holders and set(claim.holders) <= gone:
                continue
            memory -= claim.memory_mib
            cores -= claim.cores
            shares -= 1
        return memory, cores, shares

    def fits(self, node: str, gone: frozenset[str]) -> bool:
        for card in self.nodes[node]:
            memory, cores, shares = self.free(card, node, gone)
            if memory < self.want_memory_mib or cores < self.want_cores or shares < 1:
                continue
            if cores == 0 and self.want_cores == 0:
                continue  # HAMi: a card whose cores are all taken takes no more pods
            return True
        return False

    def key(self, victims: frozenset[str]) -> tuple[int, int, int, int]:
        """kube-scheduler's order of candidates (fewer is better): budget violations,
        the most important victim's priority, the sum of priorities, the count."""
        pods = [self.pods[v] for v in victims]
        covered = sum(p.protected for p in pods)
        violations = max(0, covered - self.allowed) if self.allowed >= 0 else 0
        top = max((p.priority for p in pods), default=-_OFFSET)
        return (violations, top, sum(p.priority + _OFFSET for p in pods), len(pods))

    def best(self) -> tuple[tuple[int, int, int, int], frozenset[str]] | None:
        """The exhaustive search: over every node and every set of lower-priority pods on
        it after which the preemptor fits, the best by ``key``."""
        found: tuple[tuple[int, int, int, int], frozenset[str]] | None = None
        for node in self.nodes:
            lower = [
                p.name
                for p in self.pods.values()
                if p.node == node and p.priority < PREEMPTOR_PRIORITY
            ]
            for size in range(1, len(lower) + 1):
                for chosen in itertools.combinations(lower, size):
                    gone = frozenset(chosen)
                    if not self.fits(node, gone):
                        continue
                    key = self.key(gone)
                    if found is None or key < found[0]:
                        found = (key, gone)
        return found

    def fits_anywhere(self) -> bool:
        return any(self.fits(node, frozenset()) for node in self.nodes)

    # --- as the API shows it --------------------------------------------------------------
    def engine(self) -> ClusterState:
        state = ClusterState(DeviceConfig())
        state.preemption_enabled = True
        for device_class in dra.device_classes():
            state.set_device_class(device_class)
        for node, cards in self.nodes.items():
            state.set_node(
                {"metadata": {"name": node, "labels": {dra.NODE_PATH_LABEL: dra.PATH_DRA}}}
            )
            shapes = [
                dra.CardShape(
                    card.upper(), i, "L40S", "NVIDIA-L40S", MEMORY_MIB, CORES, SHARES, "hami-core"
                )
                for i, card in enumerate(cards)
            ]
            state.set_slice(dra.slice_wire(node, shapes, 1, None))
        if self.allowed >= 0:
            state.set_budget(
                {
                    "metadata": {"namespace": "ns", "name": "protected"},
                    "spec": {"selector": {"matchLabels": {"tier": "protected"}}},
                    "status": {"disruptionsAllowed": self.allowed},
                }
            )
        for claim in self.claims.values():
            state.set_claim(claim_object(claim))
        for model_pod in self.pods.values():
            claim_name = next(c.name for c in self.claims.values() if model_pod.name in c.holders)
            state.set_pod(bound_pod(model_pod, claim_name))
        return state

    def preemptor(self, name: str = "urgent") -> tuple[Json, Json]:
        """The pending pod and its claim."""
        request = {"memory": f"{self.want_memory_mib}Mi", "cores": str(self.want_cores)}
        claim = {
            "metadata": {
                "namespace": "ns",
                "name": f"c-{name}",
                "uid": f"uid-c-{name}",
                "resourceVersion": "1",
            },
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {
                                "deviceClassName": dra.SHARED_CLASS,
                                "capacity": {"requests": request},
                            },
                        }
                    ]
                }
            },
        }
        pod = {
            "metadata": {"namespace": "ns", "name": name, "uid": f"uid-{name}"},
            "spec": {
                "priority": PREEMPTOR_PRIORITY,
                "containers": [{"name": "c", "resources": {"claims": [{"name": "gpu"}]}}],
                "resourceClaims": [{"name": "gpu", "resourceClaimName": f"c-{name}"}],
            },
        }
        return pod, claim


def claim_object(claim: ModelClaim) -> Json:
    selector = {"nodeSelectorTerms": [{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": [claim.node]}]}]}  # fmt: skip
    result = {
        "request": "gpu",
        "driver": dra.DRIVER,
        "pool": claim.node,
        "device": claim.card,
        "consumedCapacity": {
            "memory": f"{claim.memory_mib}Mi",
            "cores": str(claim.cores),
            "shares": "1",
        },
    }
    return {
        "metadata": {
            "namespace": "ns",
            "name": claim.name,
            "uid": f"uid-{claim.name}",
            "resourceVersion": "1",
        },
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": dra.SHARED_CLASS}}]
            }
        },
        "status": {
            "allocation": {"devices": {"results": [result]}, "nodeSelector": selector},
            "reservedFor": [
                {"resource": "pods", "name": h, "uid": f"uid-{h}"} for h in claim.holders
            ],
        },
    }


def bound_pod(pod: ModelPod, claim_name: str) -> Json:
    labels = {"tier": "protected"} if pod.protected else {"tier": "plain"}
    return {
        "metadata": {
            "namespace": "ns",
            "name": pod.name,
            "uid": f"uid-{pod.name}",
            "labels": labels,
        },
        "spec": {
            "nodeName": pod.node,
            "priority": pod.priority,
            "containers": [{"name": "c", "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}],
        },
        "status": {"phase": "Running", "startTime": f"2026-11-28T10:{pod.start:02d}:00Z"},
    }


def generate(rng: random.Random, max_nodes: int = 8) -> Case:
    """A cluster where the preemptor fits on no card as it is."""
    while True:
        case = _draw(rng, max_nodes)
        if not case.fits_anywhere():
            return case


def _draw(rng: random.Random, max_nodes: int) -> Case:
    case = Case()
    case.allowed = rng.choice([-1, 0, 1])  # -1: no budget at all
    pod_number = 0
    for n in range(rng.randint(1, max_nodes)):
        node = f"node-{n}"
        case.nodes[node] = [f"gpu-{n}-{c}" for c in range(rng.randint(1, 2))]
        for card in case.nodes[node]:
            memory_left, cores_left = MEMORY_MIB, CORES
            for _ in range(rng.randint(1, SHARES)):
                memory = rng.choice([1024, 2048, 3072, 4096, 6144])
                cores = rng.choice([0, 0, 10, 25, 50])
                if memory > memory_left or cores > cores_left:
                    break
                memory_left -= memory
                cores_left -= cores
                holders = []
                for _ in range(2 if rng.random() < 0.2 else 1):
                    pod_number += 1
                    name = f"p{pod_number}"
                    holders.append(name)
                    case.pods[name] = ModelPod(
                        name,
                        node,
                        rng.choice([0, 1, 2, 3, 5, 9]),
                        rng.randint(0, 59),
                        case.allowed >= 0 and rng.random() < 0.3,
                    )
                claim = ModelClaim(f"c{len(case.claims)}", node, card, memory, cores, holders)
                case.claims[claim.name] = claim
    case.want_memory_mib = rng.choice([2048, 4096, 6144, 8192])
    case.want_cores = rng.choice([0, 25, 50])
    return case
