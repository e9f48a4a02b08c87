"""The books' record of a node that may be added: built by the books' own code.

A new node of an option (``catalogue.NodeOption``) would come with a Node (the option's
labels, the NodePool's taints, the instance type's capacity, Ready) and its agent's
DeviceInventory (the instance type's cards). ``NodeFactory`` hands both to a scratch
``Books`` with the live books' config, exactly as the feed hands a real node's, and takes
the entry the books make: the what-if fits, ranks and gates it by the same code as every
other node. The cards are renamed per node (``<node>/card-<index>``): a new machine's UUIDs
cannot be known, so a pod that names a card by UUID fits no node that does not exist.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from fractions import Fraction
from typing import Any, Final

from vgpu_operator.devices import model
from vgpu_operator.devices.catalog import VENDOR_TABLE
from vgpu_operator.devices.vendor import VendorSpec
from vgpu_operator.scheduling.autoscale.catalogue import HOSTNAME_LABEL, NodeOption
from vgpu_operator.scheduling.books import Books, BooksView, NodeEntry

#: The prefix of the names the what-if gives the new nodes it tries.
NEW_NODE_PREFIX: Final = "autoscale-new-"
#: The label only nodes of a what-if carry (never a real node's): a pod alone is held to them.
WHAT_IF_LABEL: Final = "vgpu-operator.io/autoscale-what-if"


def quantity_text(value: Fraction) -> str:
    """A quantity as a Node's status writes it (milli-units where it is not whole)."""
    if value.denominator == 1:
        return str(value.numerator)
    return f"{int(value * 1000)}m"


def node_manifest(option: NodeOption, name: str) -> dict[str, Any]:
    """The Node a new node of ``option`` would register as (Ready, its capacity all
    allocatable, the NodePool's taints; Karpenter's own taint gone, as once registered),
    with ``WHAT_IF_LABEL``."""
    capacity = {k: quantity_text(v) for k, v in option.instance_type.capacity.items()}
    labels = {**option.labels(), HOSTNAME_LABEL: name, WHAT_IF_LABEL: "new"}
    spec: dict[str, Any] = {}
    if option.pool.taints:
        spec["taints"] = [dict(t) for t in option.pool.taints]
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": spec,
        "status": {
            "capacity": dict(capacity),
            "allocatable": dict(capacity),
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def renamed_cards(
    name: str, devices: Sequence[model.DeviceInfo], scores: model.PairScores
) -> tuple[list[model.DeviceInfo], dict[str, dict[str, int]]]:
    """The instance type's cards with UUIDs of this node only (``<node>/card-<index>``)."""
    new = {d.id: f"{name}/card-{d.index}" for d in devices}
    cards = [dataclasses.replace(d, id=new[d.id]) for d in devices]
    renamed = {
        new[card]: {new[peer]: score for peer, score in peers.items() if peer in new}
        for card, peers in scores.items()
        if card in new
    }
    return cards, renamed


class NodeFactory:
    """New nodes' entries for one what-if, made once per option and name, then copied."""

    def __init__(
        self, live: BooksView, now: float, vendor_table: Sequence[VendorSpec] = VENDOR_TABLE
    ) -> None:
        self._scratch = Books(live.config, live.inventory_timeout_s, vendor_table)
        self._now = now
        self._made: dict[tuple[tuple[str, str, str, str], str], NodeEntry] = {}
        #: New nodes are ordered after every live node (ties go to nodes that exist).
        self._first_order = 1 + max((n.order for n in live.nodes.values()), default=-1)

    def make(self, option: NodeOption, name: str, position: int) -> NodeEntry:
        """A fresh entry (no pod) for a new node of ``option`` named ``name``, the
        ``position``-th new node of the what-if."""
        key = (option.key, name)
        made = self._made.get(key)
        if made is None:
            made = self._build(option, name)
            self._made[key] = made
        return dataclasses.replace(
            made,
            order=self._first_order + position,
            pods=set(),
            cards=[],
            allocating={},
            dirty=True,
        )

    def _build(self, option: NodeOption, name: str) -> NodeEntry:
        it = option.instance_type
        self._scratch.set_node(node_manifest(option, name))
        cards, scores = renamed_cards(name, it.devices, it.pair_scores)
        self._scratch.set_inventory(name, cards, scores, self._now)
        entry = self._scratch.nodes[name]
        self._scratch.remove_node(name)  # the next option may reuse the name
        return entry
