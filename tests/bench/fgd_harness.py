"""One harness for the FGD replays: every policy decides on the same engine.

A policy is either one of the engine's (``binpack``, ``spread``, ``fragmentation``...:
the pod goes through ``ClusterState.schedule`` as ``simulate`` sends it), or a
reference scorer of ``fgd_reference`` (``fgd``, ``bestfit``, ``packing``): the scorer
picks the node and cards on its model, and the pod, pinned there (``nodeSelector`` on
the node's hostname, ``use-gpuuuid`` on the cards), still goes through the engine,
which must place it exactly there. Every placement, whoever chose it, is then booked
on the model as well, which refuses one it finds impossible: the engine and the model
check each other's idea of what fits (CPU, memory, card model, milli per card) on
every pod, so the figures of the two kinds of policy are of one experiment.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.append(str(HERE))

import fgd_reference  # noqa: E402
import fgd_trace  # noqa: E402
from fgd_reference import Node, Shape  # noqa: E402
from fgd_trace import Task  # noqa: E402

from vgpu_operator import simulation, simulation_stream  # noqa: E402
from vgpu_operator.scheduling.cycle.cluster import ClusterState  # noqa: E402
from vgpu_operator.scheduling.pod_key import PodKey  # noqa: E402

#: The engine's policies by name: a node policy and a GPU policy (HAMi's pairs and ours).
ENGINE: Final = {
    "binpack": ("binpack", "binpack"),
    "spread": ("spread", "spread"),
    "binpack-spread": ("binpack", "spread"),
    "fragmentation": ("fragmentation", "fragmentation"),
}
#: Reference policies: what the pinned pod names as its policies does not matter.
_PINNED: Final = ("binpack", "binpack")
NAMESPACE: Final = "trace"


def shape_of(task: Task) -> Shape:
    return Shape(task.cpu_milli, task.milli_per_card, task.num_gpu, task.models)


def target_mix(tasks: Sequence[Task]) -> fgd_reference.Mix:
    """FGD's target mix: the shapes of the task list itself (before any tuning)."""
    return fgd_reference.target_mix(shape_of(t) for t in tasks)


def policy_names() -> tuple[str, ...]:
    return (*ENGINE, *fgd_reference.POLICIES)


@dataclass(frozen=True, slots=True)
class Placed:
    node: str
    cards: tuple[int, ...]


class Harness:
    """The engine, the model and (for a reference policy) its scorer, for one replay."""

    def __init__(
        self,
        policy: str,
        list_tasks: Sequence[Task],
        seed: int = 0,
        quantise: bool = True,
        rows: Sequence[dict[str, str]] | None = None,
    ) -> None:
        """``rows``: the node list's rows (the trace's when None)."""
        if policy not in policy_names():
            raise ValueError(f"policy {policy!r}: choose one of {', '.join(policy_names())}")
        self.policy = policy
        self.pair = ENGINE.get(policy, _PINNED)
        rows = fgd_trace.node_rows() if rows is None else rows
        nodes = fgd_trace.load_nodes(rows)
        self.capacity = sum(len(n["devices"]) for n in nodes)
        self.state: ClusterState = simulation.build_state(
            {"config": fgd_trace.config(*self.pair), "nodes": nodes, "pods": []}
        )
        self.model = {
            row["sn"]: Node(
                row["sn"],
                row["model"],
                int(row["cpu_milli"]),
                int(row["memory_mib"]),
                int(row["gpu"]),
            )
            for row in rows
        }
        self.mix = target_mix(list_tasks)
        self.measure = fgd_reference.Measure(self.mix)
        self.reference = (
            fgd_reference.Reference(policy, node_order(self.model, seed), self.mix, quantise)
            if policy in fgd_reference.POLICIES
            else None
        )
        self.placed: dict[str, tuple[Task, Placed]] = {}

    def place(self, task: Task, pin: tuple[str, list[int]] | None = None) -> Placed | None:
        """Decide the task's pod now: where it went (booked on engine and model), or None.
        ``pin`` (node, cards): a defragmentation plan's choice, which the engine may
        refuse (None) where the plan was wrong."""
        shape = shape_of(task)
        planned = pin is not None
        if self.reference is not None and pin is None:
            choice = self.reference.decide(shape, task.memory_mib)
            if choice is None:
                return None
            pin = (choice[0].name, choice[1])
        pod = fgd_trace.pod_of(task, *self.pair, pin=pin)
        decision = next(
            simulation_stream.decisions({"pods": [pod]}, self.state, scores=False), None
        )
        if decision is None or not decision[1].scheduled:
            if pin is not None and not planned:
                raise AssertionError(f"the engine refused {task.name} pinned to {pin}")
            return None
        node = decision[1].node
        assert node is not None
        cards = tuple(sorted(_cards(node, decision[1].devices)))
        if pin is not None and (pin[0], tuple(sorted(pin[1]))) != (node, cards):
            raise AssertionError(f"{task.name}: pinned to {pin}, placed on {node} {cards}")
        self.model[node].place(shape, task.memory_mib, cards)
        placed = Placed(node, cards)
        self.placed[task.name] = (task, placed)
        return placed

    def remove(self, name: str) -> None:
        """The task's pod leaves (churn): off the engine and the model."""
        task, placed = self.placed.pop(name)
        self.state.remove_pod(PodKey(f"{NAMESPACE}/{name}"))
        self.model[placed.node].release(shape_of(task), task.memory_mib, placed.cards)

    def allocated_milli(self) -> int:
        return sum(1000 * len(n.cards) - n.idle for n in self.model.values())

    def fragmentation(self) -> tuple[float, int]:
        """FGD's cluster fragmentation (milli) and idle GPU milli, on the model."""
        return fgd_reference.cluster_fragmentation(self.measure, self.model.values())


def node_order(model: Mapping[str, Node], seed: int) -> list[Node]:
    """The nodes in the order a reference scorer breaks ties by: a permutation drawn from
    the seed (FGD's simulator prefixes each node's name with one)."""
    order = sorted(model)
    random.Random(f"node-order-{seed}").shuffle(order)
    return [model[name] for name in order]


def _cards(node: str, devices: Mapping[str, Any]) -> list[int]:
    out: list[int] = []
    for containers in devices.values():
        for container in containers:
            for device in container:
                out.append(fgd_trace.card_index(node, device.uuid))
    return out
