"""Generated clusters for preemption's property tests: up to 8 nodes of one or two cards,
DRA nodes with bound pods holding allocated claims (some shared by two pods), or nodes of
the annotation dialect with pods holding shares of their own; priorities, start times, a
PodDisruptionBudget, and (``generate_groups``) PodGroups of ``disruptionMode: all`` or
``single`` whose members may span nodes; and a model of what fits, kept apart from the
engine (its cards, claims and holders as plain numbers), with the exhaustive search for
the best victims by kube-scheduler's criteria, a whole group counted as every member."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field
from typing import Any

from builders import make_node, make_pod

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
    group: str | None = None


@dataclass
class ModelGroup:
    """A PodGroup: ``all`` (evicted whole or not at all) or ``single``, and the priority
    of the class it names (None: none)."""

    mode: str
    priority: int | None = None


@dataclass
class Case:
    nodes: dict[str, list[str]] = field(default_factory=dict)  # node -> card device names
    claims: dict[str, ModelClaim] = field(default_factory=dict)
    pods: dict[str, ModelPod] = field(default_factory=dict)
    allowed: int = 0  # the budget's disruptions allowed (pods labelled protected)
    want_memory_mib: int = 0
    want_cores: int = 0
    groups: dict[str, ModelGroup] = field(default_factory=dict)
    #: "claims" (DRA nodes) or "annotations" (HAMi's annotations; no shared claims).
    dialect: str = "claims"

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

    def priority(self, pod: ModelPod) -> int:
        """The pod's priority as a victim: a member's is the lower of its own and its
        group's class's."""
        group = self.groups.get(pod.group) if pod.group else None
        if group is None or group.priority is None:
            return pod.priority
        return min(pod.priority, group.priority)

    def whole(self, pod: ModelPod) -> bool:
        """Whether the pod goes only with its whole group."""
        group = self.groups.get(pod.group) if pod.group else None
        return pod.group is not None and (group is None or group.mode != "single")

    def key(self, victims: frozenset[str]) -> tuple[int, int, int, int]:
        """kube-scheduler's order of candidates (fewer is better): budget violations,
        the most important victim's priority, the sum of priorities, the count."""
        pods = [self.pods[v] for v in victims]
        covered = sum(p.protected for p in pods)
        violations = max(0, covered - self.allowed) if self.allowed >= 0 else 0
        top = max((self.priority(p) for p in pods), default=-_OFFSET)
        return (violations, top, sum(self.priority(p) + _OFFSET for p in pods), len(pods))

    def units(self, node: str) -> list[frozenset[str]]:
        """The victim sets of lower priority a preemptor on ``node`` may take: a pod of the
        node alone, or every member (on any node) of a whole group with one there."""
        out: list[frozenset[str]] = []
        seen: set[str] = set()
        for pod in self.pods.values():
            if pod.node != node:
                continue
            if not self.whole(pod):
                unit = frozenset({pod.name})
            elif pod.group in seen:
                continue
            else:
                seen.add(pod.group or "")
                unit = frozenset(p.name for p in self.pods.values() if p.group == pod.group)
            if max(self.priority(self.pods[n]) for n in unit) < PREEMPTOR_PRIORITY:
                out.append(unit)
        return out

    def best(self) -> tuple[tuple[int, int, int, int], frozenset[str]] | None:
        """The exhaustive search: over every node and every set of lower-priority victim
        sets (``units``) after which the preemptor fits there, the best by ``key``."""
        found: tuple[tuple[int, int, int, int], frozenset[str]] | None = None
        for node in self.nodes:
            lower = self.units(node)
            for size in range(1, len(lower) + 1):
                for chosen in itertools.combinations(lower, size):
                    gone = frozenset().union(*chosen)
                    if not self.fits(node, gone):
                        continue
                    key = self.key(gone)
                    if found is None or key < found[0]:
                        found = (key, gone)
        return found

    def partly_evicted(self, victims: frozenset[str]) -> list[str]:
        """The whole groups some but not all of whose members are among ``victims``."""
        return sorted(
            {
                p.group or ""
                for p in self.pods.values()
                if self.whole(p)
                and p.name in victims
                and any(q.group == p.group and q.name not in victims for q in self.pods.values())
            }
        )

    def fits_anywhere(self) -> bool:
        return any(self.fits(node, frozenset()) for node in self.nodes)

    # --- as the API shows it --------------------------------------------------------------
    def engine(self) -> ClusterState:
        if self.dialect == "annotations":
            state = self._annotation_engine()
        else:
            state = self._claims_engine()
        for name, group in self.groups.items():
            spec: Json = {"disruptionMode": {group.mode: {}}}
            if group.priority is not None:
                spec.update(priorityClassName=f"p{group.priority}", priority=group.priority)
            state.books.note_pod_group(f"ns/{name}", {"spec": spec})
        return state

    def _budget(self, state: ClusterState) -> None:
        if self.allowed >= 0:
            state.set_budget(
                {
                    "metadata": {"namespace": "ns", "name": "protected"},
                    "spec": {"selector": {"matchLabels": {"tier": "protected"}}},
                    "status": {"disruptionsAllowed": self.allowed},
                }
            )

    def _annotation_engine(self) -> ClusterState:
        state = ClusterState(DeviceConfig())
        state.preemption_enabled = True
        for node, cards in self.nodes.items():
            builder = make_node(node)
            for card in cards:
                builder.gpu(card.upper(), memory_mib=MEMORY_MIB, cores=CORES, count=SHARES)
            builder.install(state, heartbeat=None)
        self._budget(state)
        for claim in self.claims.values():
            (holder,) = claim.holders
            model_pod = self.pods[holder]
            allocated = f"{claim.card.upper()},NVIDIA,{claim.memory_mib},{claim.cores}:;"
            state.set_pod(annotation_pod(model_pod, allocated))
        return state

    def _claims_engine(self) -> ClusterState:
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
        self._budget(state)
        for claim in self.claims.values():
            state.set_claim(claim_object(claim))
        for model_pod in self.pods.values():
            claim_name = next(c.name for c in self.claims.values() if model_pod.name in c.holders)
            state.set_pod(bound_pod(model_pod, claim_name))
        return state

    def annotation_preemptor(self, name: str = "urgent") -> Json:
        """The pending pod of the annotation dialect."""
        pod = make_pod(name, "ns").container(
            gpu=1, gpumem=self.want_memory_mib, cores=self.want_cores
        )
        obj = pod.spec("priority", PREEMPTOR_PRIORITY).obj()
        obj["metadata"]["uid"] = f"uid-{name}"
        return obj

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


def annotation_pod(pod: ModelPod, allocated: str) -> Json:
    """A running pod of the annotation dialect holding ``allocated``."""
    built = make_pod(pod.name, "ns").container(gpu=1).on_node(pod.node, allocated)
    obj = built.spec("priority", pod.priority).obj()
    obj["metadata"]["uid"] = f"uid-{pod.name}"
    obj["metadata"]["labels"] = {"tier": "protected"} if pod.protected else {"tier": "plain"}
    obj["status"]["startTime"] = f"2026-11-28T10:{pod.start:02d}:00Z"
    if pod.group is not None:
        obj["spec"]["schedulingGroup"] = {"podGroupName": pod.group}
    return obj


def bound_pod(pod: ModelPod, claim_name: str) -> Json:
    labels = {"tier": "protected"} if pod.protected else {"tier": "plain"}
    group = {} if pod.group is None else {"schedulingGroup": {"podGroupName": pod.group}}
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
            **group,
        },
        "status": {"phase": "Running", "startTime": f"2026-11-28T10:{pod.start:02d}:00Z"},
    }


def generate(rng: random.Random, max_nodes: int = 8) -> Case:
    """A cluster where the preemptor fits on no card as it is."""
    while True:
        case = _draw(rng, max_nodes)
        if not case.fits_anywhere():
            return case


def generate_groups(rng: random.Random, dialect: str, max_nodes: int = 6) -> Case:
    """A cluster where the preemptor fits on no card as it is, with PodGroups: up to three,
    of two to four members each on any nodes, ``all`` or ``single``, naming a class or
    not. On the annotation dialect no share is held by two pods."""
    while True:
        case = _draw(rng, max_nodes, shared=dialect == "claims")
        case.dialect = dialect
        names = sorted(case.pods)
        rng.shuffle(names)
        for number in range(rng.randint(0, 3)):
            size = rng.randint(2, 4)
            members, names = names[:size], names[size:]
            if len(members) < 2:
                break
            group = f"g{number}"
            mode = "all" if rng.random() < 0.7 else "single"
            priority = rng.choice([None, None, 0, 2, 9])
            case.groups[group] = ModelGroup(mode, priority)
            for name in members:
                case.pods[name].group = group
        if not case.fits_anywhere():
            return case


def _draw(rng: random.Random, max_nodes: int, shared: bool = True) -> Case:
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
                for _ in range(2 if shared and rng.random() < 0.2 else 1):
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
