"""Fluent builders for the Kubernetes objects the engine reads (kube-scheduler's wrappers).

``make_node("a").gpu("GPU-a0", memory_mib=16384).obj()`` gives the Node dict and its
cards; ``make_pod("p1", "ns").container(gpu=1, gpumem=4096).obj()`` gives a Pod dict.
Every builder returns plain JSON-like dicts, the shape handlers and ``simulate`` pass in.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any, Self

from vgpu_operator import names
from vgpu_operator.config import DeviceConfig
from vgpu_operator.devices import codec, dra, model, nvidia
from vgpu_operator.scheduling.cycle.cluster import ClusterState, Decision

A100_40 = "NVIDIA A100-SXM4-40GB"
A100_80 = "NVIDIA A100-SXM4-80GB"
H100 = "NVIDIA H100 80GB HBM3"
T4 = "NVIDIA-Tesla T4"

GPU = "nvidia.com/gpu"
GPUMEM = "nvidia.com/gpumem"
GPUMEM_PERCENTAGE = "nvidia.com/gpumem-percentage"
GPUCORES = "nvidia.com/gpucores"

Json = dict[str, Any]


class NodeBuilder:
    """A Node and the cards its inventory reports."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._labels: dict[str, str] = {}
        self._annotations: dict[str, str] = {}
        self._taints: list[Json] = []
        self._allocatable: dict[str, Any] = {}
        self._unschedulable = False
        self._ready = True
        self._cards: list[model.DeviceInfo] = []

    def gpu(
        self,
        uuid: str,
        *,
        memory_mib: int = 16384,
        numa: int = 0,
        type: str = A100_40,
        mode: str = model.MODE_HAMI_CORE,
        count: int = 10,
        cores: int = 100,
        health: bool = True,
        index: int | None = None,
    ) -> Self:
        position = len(self._cards) if index is None else index
        self._cards.append(
            model.DeviceInfo(uuid, position, count, memory_mib, cores, type, numa, health, mode)
        )
        return self

    def label(self, key: str, value: str) -> Self:
        self._labels[key] = value
        return self

    def annotate(self, key: str, value: str) -> Self:
        self._annotations[key] = value
        return self

    def taint(self, key: str, value: str = "", effect: str = "NoSchedule") -> Self:
        self._taints.append({"key": key, "value": value, "effect": effect})
        return self

    def unschedulable(self) -> Self:
        self._unschedulable = True
        return self

    def not_ready(self) -> Self:
        self._ready = False
        return self

    def allocatable(self, **values: Any) -> Self:
        """Allocatable resources; ``gpus=8`` sets ``nvidia.com/gpu``."""
        for key, value in values.items():
            self._allocatable[GPU if key == "gpus" else key] = value
        return self

    def obj(self) -> tuple[Json, list[model.DeviceInfo]]:
        node: Json = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self._name,
                "labels": dict(self._labels),
                "annotations": dict(self._annotations),
            },
            "spec": {"unschedulable": self._unschedulable, "taints": list(self._taints)},
            "status": {
                "allocatable": dict(self._allocatable),
                "conditions": [{"type": "Ready", "status": "True" if self._ready else "False"}],
            },
        }
        return node, list(self._cards)

    def install(self, state: ClusterState, heartbeat: float | None = 0.0) -> Self:
        """Add the node and its inventory to ``state``."""
        node, cards = self.obj()
        state.set_node(node)
        state.set_inventory(self._name, cards, {}, heartbeat=heartbeat)
        return self


def make_node(name: str) -> NodeBuilder:
    return NodeBuilder(name)


class PodBuilder:
    """A Pod with GPU containers, annotations and (for running pods) an allocation."""

    def __init__(self, name: str, namespace: str) -> None:
        self._meta: Json = {"name": name, "namespace": namespace, "annotations": {}}
        self._spec: Json = {"containers": []}
        self._status: Json = {}

    @staticmethod
    def _container(
        name: str,
        section: str,
        gpu: Any,
        gpumem: Any,
        percentage: Any,
        cores: Any,
        cpu: Any,
        memory: Any,
        extra: Mapping[str, Any] | None,
    ) -> Json:
        values: dict[str, Any] = dict(extra or {})
        for key, value in (
            (GPU, gpu),
            (GPUMEM, gpumem),
            (GPUMEM_PERCENTAGE, percentage),
            (GPUCORES, cores),
            ("cpu", cpu),
            ("memory", memory),
        ):
            if value is not None:
                values[key] = value
        return {"name": name, "image": "cuda", "resources": {section: values}}

    def container(
        self,
        gpu: Any = None,
        gpumem: Any = None,
        cores: Any = None,
        percentage: Any = None,
        *,
        name: str | None = None,
        section: str = "limits",
        cpu: Any = None,
        memory: Any = None,
        extra: Mapping[str, Any] | None = None,
    ) -> Self:
        """One app container; resources go to ``limits`` unless ``section="requests"``."""
        containers = self._spec["containers"]
        label = name or f"c{len(containers)}"
        containers.append(
            self._container(label, section, gpu, gpumem, percentage, cores, cpu, memory, extra)
        )
        return self

    def init_container(
        self,
        gpu: Any = None,
        gpumem: Any = None,
        cores: Any = None,
        percentage: Any = None,
        *,
        cpu: Any = None,
        memory: Any = None,
    ) -> Self:
        inits = self._spec.setdefault("initContainers", [])
        inits.append(
            self._container(
                f"init{len(inits)}", "limits", gpu, gpumem, percentage, cores, cpu, memory, None
            )
        )
        return self

    def annotate(self, key: str, value: str) -> Self:
        self._meta["annotations"][key] = value
        return self

    def spec(self, key: str, value: Any) -> Self:
        """Any other pod spec field (tolerations, nodeSelector, affinity...)."""
        self._spec[key] = value
        return self

    def privileged(self, position: int = 0) -> Self:
        self._spec["containers"][position]["securityContext"] = {"privileged": True}
        return self

    def on_node(self, node: str, allocated: str | None = None) -> Self:
        """A running pod: bound to ``node`` by this scheduler (the books believe only its
        allocations), holding ``allocated`` (the annotation value)."""
        self._spec["nodeName"] = node
        self._spec.setdefault("schedulerName", names.SCHEDULER_NAME)
        self._status["phase"] = "Running"
        if allocated is not None:
            self._meta["annotations"][names.ASSIGNED_NODE] = node
            self._meta["annotations"][nvidia.ALLOCATED_ANNOTATION] = allocated
        return self

    def phase(self, phase: str) -> Self:
        self._status["phase"] = phase
        return self

    def obj(self) -> Json:
        pod: Json = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": copy.deepcopy(self._meta),
            "spec": copy.deepcopy(self._spec),
        }
        if self._status:
            pod["status"] = dict(self._status)
        return pod


def make_pod(name: str, namespace: str = "default") -> PodBuilder:
    return PodBuilder(name, namespace)


def bound(pod: Mapping[str, Any], decision: Decision, phase: str = "Running") -> Json:
    """The pod as the API shows it once bound by ``decision`` (what handlers pass set_pod)."""
    out: Json = copy.deepcopy(dict(pod))
    meta = out.setdefault("metadata", {})
    meta["annotations"] = {**(meta.get("annotations") or {}), **decision.annotations}
    spec = out.setdefault("spec", {})
    spec["nodeName"] = decision.node
    spec.setdefault("schedulerName", names.SCHEDULER_NAME)  # the webhook's routing
    out["status"] = {"phase": phase}
    return out


def resource_quota(
    namespace: str,
    *,
    gpumem: int | None = None,
    gpucores: int | None = None,
    name: str = "gpu-quota",
) -> Json:
    hard: dict[str, str] = {}
    if gpumem is not None:
        hard[f"limits.{GPUMEM}"] = str(gpumem)
    if gpucores is not None:
        hard[f"limits.{GPUCORES}"] = str(gpucores)
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"hard": hard},
    }


def cluster(
    *nodes: NodeBuilder,
    config: DeviceConfig | None = None,
    inventory_timeout_s: float | None = None,
) -> ClusterState:
    """A ClusterState holding ``nodes`` (heartbeat 0)."""
    state = ClusterState(config or DeviceConfig(), inventory_timeout_s)
    for node in nodes:
        node.install(state)
    return state


def card_uuids(decision: Decision) -> list[list[str]]:
    """Per container (init first), the card ids a decision chose."""
    single: Sequence[model.ContainerDevices] = decision.devices.get("NVIDIA", ())
    return [[d.uuid for d in container] for container in single]


def pod_awaiting_devices(
    name: str, entries: Sequence[Sequence[tuple[str, int, int]]], created: str, node: str
) -> Json:
    """A pod bound to ``node`` whose device plugin has not answered yet: one container per
    entry (``(card uuid, memory MiB, cores)`` each), asking for as many ``nvidia.com/gpu``,
    with the entries still to hand out in ``hami.io/vgpu-devices-to-allocate``."""
    single = tuple(
        tuple(model.ContainerDevice(u, "NVIDIA", m, c) for u, m, c in entry) for entry in entries
    )
    value = codec.encode_pod_single_device(single, nvidia.TO_ALLOCATE_ANNOTATION)
    return {
        "metadata": {
            "namespace": "ns",
            "name": name,
            "uid": f"uid-{name}",
            "creationTimestamp": created,
            "annotations": {
                names.ASSIGNED_NODE: node,
                nvidia.TO_ALLOCATE_ANNOTATION: value,
                names.BIND_PHASE: "allocating",
            },
        },
        "spec": {
            "nodeName": node,
            "schedulerName": names.SCHEDULER_NAME,
            "containers": [
                {"name": f"c{i}", "resources": {"limits": {GPU: len(e)}}}
                for i, e in enumerate(entries)
            ],
        },
        "status": {"phase": "Pending"},
    }


# --- DRA objects ---------------------------------------------------------------------------


def dra_node(name: str, labels: Mapping[str, str] | None = None) -> Json:
    """A Node on the DRA path (its cards are its slice's: ``dra.slice_wire``)."""
    base = {"kubernetes.io/hostname": name, dra.NODE_PATH_LABEL: dra.PATH_DRA}
    return {"metadata": {"name": name, "labels": {**base, **(labels or {})}}}


def dra_cards(node: str, memory_mib: int, slots: int, count: int = 2) -> list[dra.CardShape]:
    """``count`` L40S cards of ``memory_mib`` each, ``slots`` shares per card."""
    return [
        dra.CardShape(
            f"GPU-{node}-{i}", i, "L40S", "NVIDIA-L40S", memory_mib, 100, slots, "hami-core"
        )
        for i in range(count)
    ]


def shared_claim(name: str, namespace: str, memory_mib: int, uid: str | None = None) -> Json:
    """A ResourceClaim of the shared class asking one card's ``memory_mib``."""
    request = {
        "deviceClassName": dra.SHARED_CLASS,
        "capacity": {"requests": {"memory": f"{memory_mib}Mi"}},
    }
    return {
        "metadata": {
            "namespace": namespace,
            "name": name,
            "uid": uid or f"uid-claim-{name}",
            "resourceVersion": "1",
        },
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}},
    }


def books_readings(state: ClusterState) -> Any:
    """What the books say through their public readers (usage, quota, the pods and
    claims holding shares, the kept holds): what a what-if must leave as it was and a
    recount must find again."""
    return (
        state.device_usage(),
        state.quota_usage(),
        state.holding_pods(),
        state.claim_holds(),
        state.kept_holds(),
    )


def claim_status(
    pool: str,
    device: str,
    *,
    request: str = "gpu",
    consumed: Mapping[str, str] | None = None,
    pinned: bool = False,
    reserved_for: Sequence[str] = (),
) -> Json:
    """A claim's status: our driver's allocation of ``device`` in ``pool`` (the node) for
    ``request``, consuming ``consumed``; with ``pinned``, the node selector naming the
    node; reserved for the pods ``reserved_for`` (their uids ``uid-<name>``)."""
    result: Json = {"request": request, "driver": dra.DRIVER, "pool": pool, "device": device}
    if consumed is not None:
        result["consumedCapacity"] = dict(consumed)
    allocation: Json = {"devices": {"results": [result]}}
    if pinned:
        term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [pool]}]}
        allocation["nodeSelector"] = {"nodeSelectorTerms": [term]}
    status: Json = {"allocation": allocation}
    if reserved_for:
        status["reservedFor"] = [
            {"resource": "pods", "name": n, "uid": f"uid-{n}"} for n in reserved_for
        ]
    return status


def claim_pod(name: str, namespace: str, claim: str) -> Json:
    """A pending pod whose one container uses the claim ``claim`` (as request ``gpu``)."""
    return {
        "metadata": {"namespace": namespace, "name": name, "uid": f"uid-{name}"},
        "spec": {
            "containers": [{"name": "c", "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
        },
        "status": {"phase": "Pending"},
    }


def books_from(
    nodes: Sequence[Json],
    inventories: Mapping[str, Sequence[model.DeviceInfo]],
    slices: Sequence[Json] = (),
    claims: Sequence[Json] = (),
    pods: Sequence[Json] = (),
    quotas: Sequence[Json] = (),
) -> ClusterState:
    """Books built from the API's objects as they are now (no reservation in them), the
    DeviceClasses of the driver included: what a restarted operator would hold."""
    state = ClusterState(DeviceConfig())
    for device_class in dra.device_classes():
        state.set_device_class(device_class)
    for node in nodes:
        state.set_node(node)
    for name, cards in inventories.items():
        state.set_inventory(name, cards, {}, heartbeat=None)
    for item in slices:
        state.set_slice(item)
    for quota in quotas:
        state.set_quota(quota)
    for claim in claims:
        state.set_claim(claim)
    for pod in pods:
        state.set_pod(pod)
    return state
