"""Small generated clusters with one pod blocked by fragmentation, and the exhaustive
search that defines the best plan: for the planner's tests and for the heuristic's
measured distance from the exact plan (``tests/bench/bench_defrag.py``).

A case is seeded: up to ``max_nodes`` nodes of one or two cards, pods of several sizes,
owners (mostly ReplicaSets; StatefulSets, Jobs, DaemonSets and bare pods too), three
priorities, a few PodDisruptionBudgets, some with no disruption left, and a waiting pod
bigger than any card's free memory that some node could hold if its free memory were on
one card.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations, permutations
from typing import Any

from builders import books_readings, make_node

from vgpu_operator import names
from vgpu_operator.config import DeviceConfig
from vgpu_operator.devices import codec, model, nvidia
from vgpu_operator.scheduling.cycle.cluster import ClusterState
from vgpu_operator.scheduling.defrag import defrag
from vgpu_operator.scheduling.defrag.defrag_books import DefragBooks
from vgpu_operator.scheduling.preemption import disruption

Json = dict[str, Any]
A100 = "NVIDIA A100-SXM4-40GB"
L40S = "NVIDIA L40S"

_OWNERS = (
    ("apps/v1", "ReplicaSet"),
    ("apps/v1", "ReplicaSet"),
    ("apps/v1", "ReplicaSet"),
    ("apps/v1", "ReplicaSet"),
    ("apps/v1", "StatefulSet"),
    ("batch/v1", "Job"),
    ("apps/v1", "DaemonSet"),
    (None, None),
)


def allocation(entries: Sequence[tuple[str, int, int]]) -> str:
    """The allocation annotation of a one-container pod on ``(card, MiB, cores)``."""
    single = (tuple(model.ContainerDevice(u, "NVIDIA", m, c) for u, m, c in entries),)
    return codec.encode_pod_single_device(single, nvidia.ALLOCATED_ANNOTATION)


def running_pod(
    name: str,
    node: str,
    card: str,
    memory_mib: int,
    *,
    cores: int = 0,
    namespace: str = "default",
    owner: tuple[str | None, str | None] = ("apps/v1", "ReplicaSet"),
    priority: int = 0,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    scheduler: str = names.SCHEDULER_NAME,
) -> Json:
    """A bound pod holding ``memory_mib`` (and ``cores``) of one card, placed by
    ``scheduler`` (this operator's unless told)."""
    limits: dict[str, Any] = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": memory_mib}
    if cores:
        limits["nvidia.com/gpucores"] = cores
    meta: Json = {
        "namespace": namespace,
        "name": name,
        "uid": f"uid-{namespace}-{name}",
        "labels": dict(labels or {}),
        "annotations": {
            **(annotations or {}),
            names.ASSIGNED_NODE: node,
            nvidia.ALLOCATED_ANNOTATION: allocation([(card, memory_mib, cores)]),
        },
    }
    api_version, kind = owner
    if kind is not None:
        meta["ownerReferences"] = [
            {
                "apiVersion": api_version,
                "kind": kind,
                "name": f"{name}-owner",
                "uid": f"owner-{name}",
                "controller": True,
            }
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "nodeName": node,
            "schedulerName": scheduler,
            "priority": priority,
            "containers": [{"name": "c", "resources": {"limits": limits}}],
        },
        "status": {"phase": "Running"},
    }


def waiting_pod(
    name: str,
    memory_mib: int,
    *,
    priority: int = 0,
    namespace: str = "default",
    annotations: Mapping[str, str] | None = None,
) -> Json:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"namespace": namespace, "name": name, "annotations": dict(annotations or {})},
        "spec": {
            "schedulerName": names.SCHEDULER_NAME,  # the webhook's routing
            "priority": priority,
            "containers": [
                {
                    "name": "c",
                    "resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": memory_mib}},
                }
            ],
        },
    }


def budget(name: str, labels: Mapping[str, str], allowed: int, namespace: str = "default") -> Json:
    return {
        "metadata": {"namespace": namespace, "name": name},
        "spec": {"selector": {"matchLabels": dict(labels)}},
        "status": {"disruptionsAllowed": allowed},
    }


def node_object(name: str) -> Json:
    return {
        "metadata": {"name": name, "labels": {}, "annotations": {}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def card(uuid: str, index: int, memory_mib: int, card_type: str = A100) -> model.DeviceInfo:
    return model.DeviceInfo(uuid, index, 4, memory_mib, 100, card_type, 0, True, "hami-core")


@dataclass
class Case:
    """A cluster to build afresh for each use (planning must leave it as it was, but a
    test that checks that should not rely on it)."""

    seed: int
    nodes: list[tuple[str, list[model.DeviceInfo]]]
    running: list[Json]
    budgets: list[Json]
    waiting: Json

    def state(self) -> ClusterState:
        state = ClusterState(DeviceConfig())
        for name, cards in self.nodes:
            state.set_node(node_object(name))
            state.set_inventory(name, cards, {}, heartbeat=None)
        for pdb in self.budgets:
            state.set_budget(pdb)
        for pod in self.running:
            state.set_pod(pod)
        return state


def generate(seed: int, max_nodes: int = 8) -> Case | None:
    """A case, or None when the seed gave no pod blocked by fragmentation."""
    rng = random.Random(seed)
    nodes: list[tuple[str, list[model.DeviceInfo]]] = []
    running: list[Json] = []
    widest = pooled = 0
    for n in range(rng.randint(2, max_nodes)):
        name = f"n{n}"
        card_type = A100 if rng.random() < 0.8 else L40S
        cards = [
            card(f"GPU-{n}-{i}", i, rng.choice((16384, 24576)), card_type)
            for i in range(rng.choice((1, 2)))
        ]
        nodes.append((name, cards))
        node_free = 0
        for device in cards:
            used = held = 0
            target = device.memory_mib * rng.uniform(0.4, 0.95)
            while used < target and held < 3:
                size = rng.choice((2048, 4096, 6144, 8192, 10240))
                if used + size > device.memory_mib:
                    break
                running.append(
                    running_pod(
                        f"p{len(running)}",
                        name,
                        device.id,
                        size,
                        owner=rng.choice(_OWNERS),
                        priority=rng.choice((0, 0, 5, 10)),
                        labels={"app": f"g{rng.randint(0, 3)}"},
                    )
                )
                used += size
                held += 1
            widest = max(widest, device.memory_mib - used)
            node_free += device.memory_mib - used
        pooled = max(pooled, node_free)
    if pooled <= widest:
        return None
    size = rng.randint(widest + 1, pooled)
    budgets = [
        budget(f"pdb-g{g}", {"app": f"g{g}"}, rng.choice((0, 1, 1)))
        for g in range(4)
        if rng.random() < 0.4
    ]
    waiting = waiting_pod("w", size, priority=5)
    return Case(seed, nodes, running, budgets, waiting)


def cases(count: int, max_nodes: int = 8, first_seed: int = 0) -> list[Case]:
    """``count`` cases whose waiting pod is blocked by fragmentation."""
    found: list[Case] = []
    seed = first_seed
    while len(found) < count:
        case = generate(seed, max_nodes)
        seed += 1
        if case is None:
            continue
        state = case.state()
        books = DefragBooks(state)
        job = books.job(case.waiting)
        if job is None or books.fits_somewhere(job, 0.0):
            continue
        if defrag.fragmentation(books, job, 0.0) is None:
            continue
        found.append(case)
    return found


def exhaustive_best(case: Case, max_evictions: int) -> tuple[int, int] | None:
    """The least (evictions, memory moved) of any plan, found by trying every set of
    movable pods of up to ``max_evictions`` within the budgets, every node holding one of
    them as the target, and every order (the definition the planner must meet)."""
    state = case.state()
    books = DefragBooks(state)
    options = defrag.PlanOptions(max_evictions=max_evictions)
    movable = defrag.movers(books, case.running, options)
    priority = int(case.waiting["spec"]["priority"])
    pool = sorted((m for m in movable.values() if m.priority <= priority), key=lambda m: m.key)
    budgets = books.budgets()
    job = books.job(case.waiting)
    assert job is not None
    for size in range(1, max_evictions + 1):
        best: int | None = None
        for moved in combinations(pool, size):
            memory = sum(m.memory_mib for m in moved)
            if best is not None and memory >= best:
                continue
            identities = [
                disruption.PodIdentity(*m.key.split("/", 1), m.labels)  # type: ignore[call-arg]
                for m in moved
            ]
            if disruption.split_by_violation(identities, budgets)[0]:
                continue
            for node in sorted({m.node for m in moved}):
                here = frozenset(m.key for m in moved if m.node == node)
                if not books.fit_after_leaving(node, job, here, 0.0).ok:
                    continue
                if any(
                    defrag.replay(
                        state, case.waiting, node, [m.key for m in order], case.running, 0.0
                    )
                    is not None
                    for order in permutations(moved)
                ):
                    best = memory
                    break
        if best is not None:
            return size, best
    return None


def books_fingerprint(state: ClusterState) -> Any:
    """What planning must leave as it was: the books' readings, drift and nominations."""
    return (
        books_readings(state),
        state.drifted_nodes(),
        {k: state.nominated_node(k) for k in state.holding_pods()},
    )


def two_half_full_cards(keeper: str = "q6") -> tuple[list[Any], list[Json]]:
    """Node a: two 16 GiB cards with 10 GiB and 8 GiB used (6 and 8 free); node b: one
    card with 10 GiB free beside a pod (``keeper``) that matters more than the waiting
    ones. The node builders and the running pods."""
    gib = 1024
    nodes = [
        make_node("a").gpu("GPU-a0", memory_mib=16 * gib).gpu("GPU-a1", memory_mib=16 * gib),
        make_node("b").gpu("GPU-b0", memory_mib=16 * gib),
    ]
    pods = [
        running_pod("p10", "a", "GPU-a0", 10 * gib),
        running_pod("p8", "a", "GPU-a1", 8 * gib),
        running_pod(keeper, "b", "GPU-b0", 6 * gib, priority=100),
    ]
    return nodes, pods
