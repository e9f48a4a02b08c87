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
from vgpu_operator.scheduling import mig_partitions as mp

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


def cluster_devices(slices: Sequence[dict[str, Any]]) -> tuple[list[mp.MigDevice], mp.Counters]:
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
        live.append(chosen)
        placed += 1
    return Run(placed, None, 0, 0)


def placed_before_refusal(events: Sequence[Event], rule: Rule, slices: Sequence[Any]) -> int:
    """Requests ``rule`` places before it refuses one for the first time."""
    return replay(events, rule, slices).placed
