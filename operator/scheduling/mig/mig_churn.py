"""MIG churn: a seeded trace of MIG profile requests and departures, replayed against a
cluster of MIG cards published as partitionable devices, by the engine's rule
(``mig_partitions.choose``) and by upstream's first fit (``mig_partitions.first_fit``).

The figure is the one issue 39 names: requests placed before the first refusal. Both
rules see the same trace; a departure frees the instance a live request holds (the
``k``-th live one, ``k`` drawn by the trace, so it names the same request in both runs as
long as both have placed the same requests).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from vgpu_operator.devices import dra, dra_mig
from vgpu_operator.scheduling.mig import mig_partitions as mp
from vgpu_operator.wire import ResourceSlice

#: The cards of the trace's nodes: A100 80GB and H100 80GB (the same MIG profiles).
_MODELS = (("NVIDIA A100-SXM4-80GB", 81920), ("NVIDIA H100 80GB HBM3", 81920))
#: How often each profile is asked for (the small ones most, as in shared clusters).
_MIX = (("1g.10gb", 40), ("2g.20gb", 25), ("3g.40gb", 18), ("4g.40gb", 7), ("7g.80gb", 10))

#: The bench's trace: long enough that both rules meet a refusal, four arrivals in ten
#: events a departure (the cluster fills while it churns).
DEFAULT_LENGTH = 4000
DEFAULT_LEAVE_SHARE = 0.4

Rule = Callable[[mp.MigAsk, Sequence[mp.MigDevice], mp.CounterLedger], mp.MigDevice | None]


@dataclass(frozen=True, slots=True)
class Event:
    """An arrival (``profile``) or a departure (``leave``: the index among live ones)."""

    profile: str | None = None
    leave: int | None = None


def cluster_slices(nodes: int = 12, cards_per_node: int = 8) -> list[dict[str, Any]]:
    """Every node's MIG slices (counters and instances), half A100 nodes, half H100."""
    out: list[dict[str, Any]] = []
    for n in range(nodes):
        node = f"node-{n:02d}"
        product, memory = _MODELS[n % len(_MODELS)]
        cards = [
            dra_mig.MigCardShape(
                uuid=f"GPU-{n:04x}{c:04x}-0000-4000-8000-000000000000",
                index=c,
                product=product,
                hami_type=product,
                memory_mib=memory,
            )
            for c in range(cards_per_node)
        ]
        for name, body in dra_mig.pool_specs(node, [], cards)[1:]:
            out.append(
                {
                    "metadata": {"name": name},
                    "spec": {
                        "driver": dra.DRIVER,
                        "nodeName": node,
                        "pool": {"name": node, "generation": 1, "resourceSliceCount": 0},
                        **body,
                    },
                }
            )
    return out


def trace(
    seed: int, length: int = DEFAULT_LENGTH, leave_share: float = DEFAULT_LEAVE_SHARE
) -> list[Event]:
    """A seeded trace: arrivals with the profile mix, departures of random live ones."""
    rng = random.Random(seed)
    names = [p for p, _ in _MIX]
    weights = [w for _, w in _MIX]
    events = []
    for _ in range(length):
        if rng.random() < leave_share:
            events.append(Event(leave=rng.randrange(1 << 30)))
        else:
            events.append(Event(profile=rng.choices(names, weights)[0]))
    return events


def cluster_devices(slices: Sequence[ResourceSlice]) -> tuple[list[mp.MigDevice], mp.Counters]:
    devices: list[mp.MigDevice] = []
    counters: mp.Counters = {}
    for node in sorted({s["spec"]["nodeName"] for s in slices}):
        pool = mp.read_mig_pool(node, slices)
        devices.extend(pool.devices)
        counters.update(pool.counters)
    return devices, counters


@dataclass(frozen=True, slots=True)
class Run:
    """One rule on one trace: requests placed before the first refusal, the profile
    refused (None: the trace ended first), and the compute and memory slices the live
    instances held then (the cluster's capacity bounds what any rule can place)."""

    placed: int
    refused: str | None
    compute_slices: int
    memory_slices: int


def replay(events: Sequence[Event], rule: Rule, slices: Sequence[Any]) -> Run:
    """The trace under ``rule`` until its first refusal."""
    devices, counters = cluster_devices(slices)
    ledger = mp.CounterLedger(counters)
    live: list[mp.MigDevice] = []
    placed = 0
    for event in events:
        if event.profile is None:
            if live and event.leave is not None:
                gone = live.pop(event.leave % len(live))
                ledger.give_back(gone.consumes)
                if isinstance(rule, SpreadFirstFit):
                    rule.ended(gone)
            continue
        chosen = rule(mp.MigAsk(profile=event.profile), devices, ledger)
        if chosen is None:
            return Run(
                placed,
                event.profile,
                sum(d.compute_slices for d in live),
                sum(d.memory_slices for d in live),
            )
        ledger.take(chosen.consumes)
        if isinstance(rule, SpreadFirstFit):
            rule.placed(chosen)
        live.append(chosen)
        placed += 1
    return Run(placed, None, 0, 0)


class SpreadFirstFit:
    """kube-scheduler with upstream's allocator, as it places these pods: the allocator
    fits a node's devices first by slice name (``mig_partitions.first_fit``), and the
    node is the one default scoring ranks best. Only the prioritized-list score of the
    DRA plugin looks at devices (none here); ``NodeResourcesFit`` (least allocated) and
    ``BalancedAllocation`` see the pods' CPU and memory, and a pod that asks none counts
    kube-scheduler's defaults for a request it leaves out (100m, 200Mi): the node with
    the fewest pods wins, ties chosen at random (``selectHost``; seeded here).

    Stateful: one instance per replay (it counts the pods ``replay`` places and ends)."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)
        self._pods: dict[str, int] = {}
        self._nodes: dict[int, dict[str, list[mp.MigDevice]]] = {}

    def __call__(
        self, ask: mp.MigAsk, devices: Sequence[mp.MigDevice], ledger: mp.CounterLedger
    ) -> mp.MigDevice | None:
        nodes = self._nodes.get(id(devices))
        if nodes is None:
            nodes = {}
            for device in sorted(devices, key=lambda d: d.slice_name):
                nodes.setdefault(_node_of(device), []).append(device)
            self._nodes = {id(devices): nodes}
        feasible = [
            (node, found)
            for node, on_node in nodes.items()
            if (found := mp.first_fit(ask, on_node, ledger)) is not None
        ]
        if not feasible:
            return None
        least = min(self._pods.get(node, 0) for node, _ in feasible)
        best = [d for node, d in feasible if self._pods.get(node, 0) == least]
        return self._rng.choice(best)

    def placed(self, device: mp.MigDevice) -> None:
        node = _node_of(device)
        self._pods[node] = self._pods.get(node, 0) + 1

    def ended(self, device: mp.MigDevice) -> None:
        self._pods[_node_of(device)] -= 1


def _node_of(device: mp.MigDevice) -> str:
    """The node of a device, by its slice's name (``<node>-<driver>-mig-<n>``)."""
    return device.slice_name.rsplit(f"-{dra.DRIVER}-", 1)[0]


#: Compute and memory slices of each profile of the trace (80 GB cards).
_SLICES = {
    "1g.10gb": (1, 1),
    "2g.20gb": (2, 2),
    "3g.40gb": (3, 4),
    "4g.40gb": (4, 4),
    "7g.80gb": (7, 8),
}


def capacity_bound(events: Sequence[Event], cards: int) -> int:
    """Requests placed before the first refusal by a cluster that refuses only when the
    live instances' compute or memory slices would pass the cards' total (instances
    moved freely between cards, no placement geometry): no rule places more."""
    live: list[str] = []
    compute = memory = placed = 0
    for event in events:
        if event.profile is None:
            if live and event.leave is not None:
                gone = live.pop(event.leave % len(live))
                compute -= _SLICES[gone][0]
                memory -= _SLICES[gone][1]
            continue
        c, m = _SLICES[event.profile]
        full = (cards * dra_mig.COMPUTE_SLICES, cards * dra_mig.MEMORY_SLICES)
        if compute + c > full[0] or memory + m > full[1]:
            return placed
        live.append(event.profile)
        compute += c
        memory += m
        placed += 1
    return placed


def placed_before_refusal(events: Sequence[Event], rule: Rule, slices: Sequence[Any]) -> int:
    """Requests ``rule`` places before it refuses one for the first time."""
    return replay(events, rule, slices).placed
