"""What the books keep per node and per pod, and a preemptor's nomination.

Frozen records: the books (``books.Books``) replace a pod's entry and change a node's
in place through ``change_node`` only; every reader gets them through the read view
(``view.BooksView``), where a write fails.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vgpu_operator.devices import dra, model
from vgpu_operator.devices.mig_allocations import MigAllocation
from vgpu_operator.scheduling import node_basics
from vgpu_operator.scheduling.dialects.annotation import placement
from vgpu_operator.scheduling.pod_key import PodKey
from vgpu_operator.scheduling.policies import node_layer


@dataclass(frozen=True, slots=True)
class DeviceUsageRow:
    """One card's booking, for metrics and the demo table."""

    node: str
    uuid: str
    vendor: str
    type: str
    used_slots: int
    total_slots: int
    used_memory_mib: int
    total_memory_mib: int
    used_cores: int
    total_cores: int


@dataclass(frozen=True, slots=True)
class PodEntry:
    """One pod as the books hold it. Frozen: the books replace an entry, never change
    it, so a reader (``view.BooksView``) cannot write through one."""

    key: PodKey
    namespace: str
    node: str | None
    requests: node_basics.PodResources
    devices: dict[str, model.PodSingleDevice]
    bookings: dict[str, list[placement.Booking]]
    reserved: bool = False
    priority: int = 0
    started: float | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    #: Being deleted: it leaves anyway, so it is never a victim.
    deleting: bool = False
    #: A member of an upstream PodGroup (``spec.schedulingGroup``): never moved by
    #: defragmentation alone, and a preemption victim only when its group's
    #: ``disruptionMode`` is ``single`` (``group_victims``, ``docs/gangs.md``).
    in_group: bool = False
    #: That PodGroup's ``namespace/name`` (None outside a group).
    group: str | None = None
    uid: str = ""
    #: HAMi v2.10's MIG entries and the allocation as decoded: for a pod with devices on
    #: MIG cards, read against the cards' tables again when the node's cards change
    #: (``Books._read_mig_records``).
    mig_records: tuple[MigAllocation, ...] = ()
    decoded: dict[str, model.PodSingleDevice] = field(default_factory=dict)
    init_count: int = 0
    #: Its init containers have all finished (``init_release``): only the app containers
    #: hold devices.
    init_done: bool = False
    #: Since when (the operator's clock) the pod holds its node's allocation gate, if it
    #: does; ``allocation_gate.UNTIMED`` until the gate's next look stamps it.
    allocating_since: float | None = None
    #: What ``set_pod`` read the entry from (the config's epoch and ``_share_source``);
    #: None for a decision's reservation.
    source: tuple[Any, ...] | None = None

    @property
    def quota_sums(self) -> dict[str, tuple[int, int]]:
        """Per vendor, the memory and cores this pod holds (what its quota counts)."""
        return {
            v: (sum(b.memory_mib for b in bs), sum(b.cores for b in bs))
            for v, bs in self.bookings.items()
        }


@dataclass(frozen=True, slots=True)
class NodeEntry:
    """One node as the books hold it. Frozen to its readers (``view.BooksView``): only
    the books' own modules change it, in place, through ``change_node``."""

    name: str
    order: int
    facts: node_basics.NodeFacts
    inventory: tuple[model.DeviceInfo, ...] | None = None
    inventory_scores: model.PairScores = field(default_factory=dict)
    inventory_cordoned: frozenset[str] = frozenset()
    heartbeat: float | None = None
    registered: tuple[model.DeviceInfo, ...] = ()
    pair_scores: model.PairScores = field(default_factory=dict)
    register_error: str | None = None
    layer: node_layer.NodeLayer = node_layer.EMPTY
    gpus_lost: bool = False
    reported_gpus: int = 0
    pods: set[PodKey] = field(default_factory=set)
    cards: list[model.DeviceUsage] = field(default_factory=list)
    used: node_basics.PodResources = field(default_factory=node_basics.PodResources)
    score: float = 0.0
    summary: placement.Summary = field(default_factory=placement.Summary)
    dirty: bool = True
    #: Pods between their Binding and the device plugin's answer, and since when.
    allocating: dict[PodKey, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Nomination:
    node: str
    victims: frozenset[PodKey]
    until: float
    #: On the DRA path: the claims (holds) the victims' going releases; the preemptor
    #: waits until they no longer hold (the claim controller deallocates them).
    claims: frozenset[str] = frozenset()

    def remaining(self, pods: Mapping[PodKey, PodEntry]) -> list[PodKey]:
        """The victims on its node still there, in key order: what the preemptor waits
        for. Victims elsewhere (the members of a PodGroup evicted whole on other nodes)
        leave too, but their room is not the preemptor's: it does not wait for them (and
        no news of their node would wake it)."""
        node = self.node
        return sorted(v for v in self.victims if (e := pods.get(v)) is not None and e.node == node)


def change_node(node: NodeEntry, **fields: Any) -> None:
    """The books' one way to change a node entry in place (the entry is frozen, so a
    reader's write fails; the books keep one entry per node, which the ranking, overlays
    and a decision in progress all hold). Only ``scheduling/books/`` calls it
    (``tests/unit/scheduling/test_books_read_only.py`` checks)."""
    for name, value in fields.items():
        object.__setattr__(node, name, value)


def is_dra_node(node: NodeEntry) -> bool:
    """Whether the node's cards are offered as DRA devices (its label says so)."""
    return node.facts.labels.get(dra.NODE_PATH_LABEL) == dra.PATH_DRA
