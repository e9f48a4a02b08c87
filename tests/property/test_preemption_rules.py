"""Preemption in simulated scenarios: whatever the priorities and shares, a preemptor
evicts only strictly lower priorities on its own node, the cards are never
over-committed once the victims are gone, and no victim was needed beyond the last.

The checks recompute bookings from the scenario's running pods and the decisions, never
from the engine.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any
from unittest import mock

from hypothesis import event, given
from hypothesis import strategies as st

from vgpu_operator import simulation
from vgpu_operator.scheduling.cycle import annotation_freeing

MEMORY = 10000
CORES = 100
SLOTS = 4

Json = dict[str, Any]


def _running(name: str, node: str, card: str, memory: int, cores: int, priority: int) -> Json:
    allocation = f"{card},NVIDIA,{memory},{cores}:;"
    return {
        "metadata": {
            "namespace": "default",
            "name": name,
            "annotations": {
                "hami.io/vgpu-node": node,
                "hami.io/vgpu-devices-allocated": allocation,
            },
        },
        "spec": {
            "nodeName": node,
            "schedulerName": "vgpu-scheduler",
            "priority": priority,
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1}}}],
        },
        "status": {"phase": "Running"},
    }


def _pending(name: str, memory: int, cores: int, priority: int) -> Json:
    limits = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": memory, "nvidia.com/gpucores": cores}
    return {
        "metadata": {"namespace": "default", "name": name},
        "spec": {
            "priority": priority,
            "containers": [{"name": "c", "resources": {"limits": limits}}],
        },
    }


@st.composite
def scenarios(draw: st.DrawFn) -> Json:
    nodes = []
    pods: list[Json] = []
    for n in range(draw(st.integers(1, 3))):
        name = f"node-{n}"
        cards = [f"GPU-{n}-{c}" for c in range(draw(st.integers(1, 2)))]
        nodes.append(
            {
                "metadata": {"name": name},
                "devices": [
                    {
                        "id": card,
                        "index": i,
                        "count": SLOTS,
                        "devmem": MEMORY,
                        "devcore": CORES,
                        "type": "NVIDIA-T4",
                        "numa": 0,
                        "health": True,
                        "mode": "hami-core",
                    }
                    for i, card in enumerate(cards)
                ],
            }
        )
        for card in cards:
            free_memory, free_cores = MEMORY, CORES
            for _ in range(draw(st.integers(0, SLOTS))):
                memory = draw(st.integers(0, free_memory))
                cores = draw(st.integers(0, free_cores))
                free_memory, free_cores = free_memory - memory, free_cores - cores
                priority = draw(st.integers(-1, 3))
                pods.append(_running(f"r{len(pods)}", name, card, memory, cores, priority))
    for p in range(draw(st.integers(1, 4))):
        memory = draw(st.integers(1, MEMORY))
        pods.append(
            _pending(f"p{p}", memory, draw(st.integers(0, CORES)), draw(st.integers(-1, 4)))
        )
    return {"config": {"nvidia": {"deviceSplitCount": SLOTS}}, "nodes": nodes, "pods": pods}


@given(scenarios())
def test_victims_are_lower_and_local_and_cards_stay_within_capacity(scenario: Json) -> None:
    decisions = simulation.simulate(scenario)["decisions"]
    live: dict[str, tuple[str, int, int, int]] = {}  # pod -> (card, memory, cores, priority)
    nodes: dict[str, str] = {}
    for pod in scenario["pods"]:
        spec = pod["spec"]
        if spec.get("nodeName"):
            alloc = pod["metadata"]["annotations"]["hami.io/vgpu-devices-allocated"]
            card, _, memory, cores = alloc.rstrip(":;").split(",")
            key = f"default/{pod['metadata']['name']}"
            live[key] = (card, int(memory), int(cores), spec["priority"])
            nodes[key] = spec["nodeName"]
    priorities = {
        f"default/{p['metadata']['name']}": p["spec"]["priority"] for p in scenario["pods"]
    }
    for decision in decisions:
        key = decision["pod"]
        event("preempts" if decision.get("victims") else "no preemption")
        for victim in decision.get("victims", []):
            assert victim in live, f"{victim} evicted twice or never running"
            assert live[victim][3] < priorities[key]
            assert nodes[victim] == decision["node"]
            del live[victim]
        if decision["scheduled"]:
            ((device,),) = decision["containers"]
            live[key] = (device["uuid"], device["usedmem"], device["usedcores"], priorities[key])
            nodes[key] = decision["node"]
        usage: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
        for card, memory, cores, _ in live.values():
            usage[card] = [usage[card][0] + 1, usage[card][1] + memory, usage[card][2] + cores]
        for card, (slots, memory, cores) in usage.items():
            assert slots <= SLOTS, f"{card}: {slots} tasks"
            assert memory <= MEMORY, f"{card}: {memory} MiB"
            assert cores <= CORES, f"{card}: {cores} cores"


@given(scenarios())
def test_incremental_trials_choose_as_fresh_ones_would(scenario: Json) -> None:
    """The victim search books back returned pods onto the last fitting cards; rebuilding
    the node from scratch for every trial must choose exactly the same."""
    fast = simulation.simulate(scenario)

    def fresh(trial: Any, removed: frozenset[str]) -> Any:
        return trial.fresh_cards(removed)

    with mock.patch.object(annotation_freeing.AnnotationFreeing, "cards_without", fresh):
        slow = simulation.simulate(scenario)
    assert fast == slow
