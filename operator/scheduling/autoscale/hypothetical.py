"""The books' record of a node that may be added: built by the books' own code.

A new node of an option (``catalogue.NodeOption``) would come with a Node (the option's
labels, the NodePool's taints, the instance type's capacity, Ready) and its agent's
DeviceInventory (the instance type's cards). ``NodeFactory`` hands both to a scratch
``Books`` with the live books' config, exactly as the feed hands a real node's, and takes
the entry the books make: the what-if fits, ranks and gates it by the same code as every
other node. The cards are renamed per node (``<node>/card-<index>``): a new machine's UUIDs
cannot be known, so a pod that names a card by UUID fits no node that does not exist.

A node on the DRA path (its NodePool's template labels it so: ``dra.NODE_PATH_LABEL``)
offers its cards as the ResourceSlices its agent publishes: built from the instance type's
card shapes (``InstanceType.dra_cards``, ``dra_mig_cards``: the agent's own
``dra_shapes`` over the type's cards) by the driver's own slice code
(``dra_mig.pool_slices``), with the device config's request defaults, and read by the
books' claims part like any node's slices. Its cards are named ``new-<digest>-card-<index>``
(a device name is a DNS label), one digest per node.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Final

from vgpu_operator.config import DeviceConfig
from vgpu_operator.devices import dra, dra_mig, model, nvidia
from vgpu_operator.devices.catalog import VENDOR_TABLE
from vgpu_operator.devices.vendor import VendorSpec
from vgpu_operator.scheduling.autoscale.catalogue import HOSTNAME_LABEL, NodeOption
from vgpu_operator.scheduling.books import Books, BooksView, NodeEntry
from vgpu_operator.scheduling.dialects.claims import claim_mig, dra_pool
from vgpu_operator.wire import Node, NodeSpec, ResourceSlice

#: The prefix of the names the what-if gives the new nodes it tries.
NEW_NODE_PREFIX: Final = "autoscale-new-"
#: The label only nodes of a what-if carry (never a real node's): a pod alone is held to them.
WHAT_IF_LABEL: Final = "vgpu-operator.io/autoscale-what-if"


def quantity_text(value: Fraction) -> str:
    """A quantity as a Node's status writes it (milli-units where it is not whole)."""
    if value.denominator == 1:
        return str(value.numerator)
    return f"{int(value * 1000)}m"


def node_manifest(option: NodeOption, name: str) -> Node:
    """The Node a new node of ``option`` would register as (Ready, its capacity all
    allocatable, the NodePool's taints; Karpenter's own taint gone, as once registered),
    with ``WHAT_IF_LABEL``."""
    capacity = {k: quantity_text(v) for k, v in option.instance_type.capacity.items()}
    labels = {**option.labels(), HOSTNAME_LABEL: name, WHAT_IF_LABEL: "new"}
    spec: NodeSpec = {}
    if option.pool.taints:
        spec["taints"] = [t.copy() for t in option.pool.taints]
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


def dra_uuid(name: str, index: int) -> str:
    """The UUID a new DRA node's card ``index`` goes by (its device name: a DNS label)."""
    digest = hashlib.blake2b(name.encode(), digest_size=4).hexdigest()
    return f"new-{digest}-card-{index}"


def dra_slices(option: NodeOption, name: str, config: DeviceConfig) -> list[ResourceSlice]:
    """The slices a new node ``name`` of ``option`` would publish (its agent's cards with
    this node's UUIDs and the device config's request defaults), or none when the
    instance type has no card the DRA driver publishes."""
    it = option.instance_type
    section = nvidia.section(config)
    cards = [
        dataclasses.replace(
            card,
            uuid=dra_uuid(name, card.index),
            default_memory_mib=section.default_memory,
            default_cores=section.default_cores,
        )
        for card in it.dra_cards
    ]
    migs = [dataclasses.replace(c, uuid=dra_uuid(name, c.index)) for c in it.dra_mig_cards]
    if not cards and not migs:
        return []
    return dra_mig.pool_slices(name, cards, migs, 1, None)


@dataclass(frozen=True, slots=True)
class NewNode:
    """A new node as the what-if adds it: the books' entry and, on the DRA path, its pool
    and MIG placements as the books read its slices."""

    entry: NodeEntry
    pool: dra_pool.Pool | None = None
    mig: claim_mig.MigNode | None = None


class NodeFactory:
    """New nodes' entries for one what-if, made once per option and name, then copied."""

    def __init__(
        self, live: BooksView, now: float, vendor_table: Sequence[VendorSpec] = VENDOR_TABLE
    ) -> None:
        self._scratch = Books(live.config, live.inventory_timeout_s, vendor_table)
        self._now = now
        self._made: dict[tuple[tuple[str, str, str, str], str], NewNode] = {}
        #: New nodes are ordered after every live node (ties go to nodes that exist).
        self._first_order = 1 + max((n.order for n in live.nodes.values()), default=-1)

    def make(self, option: NodeOption, name: str, position: int) -> NewNode:
        """A fresh entry (no pod) for a new node of ``option`` named ``name``, the
        ``position``-th new node of the what-if, with its pool on the DRA path."""
        key = (option.key, name)
        made = self._made.get(key)
        if made is None:
            made = self._build(option, name)
            self._made[key] = made
        entry = dataclasses.replace(
            made.entry,
            order=self._first_order + position,
            pods=set(),
            cards=[],
            allocating={},
            dirty=True,
        )
        return dataclasses.replace(made, entry=entry)

    def _build(self, option: NodeOption, name: str) -> NewNode:
        it = option.instance_type
        scratch = self._scratch
        manifest = node_manifest(option, name)
        dra_path = manifest["metadata"]["labels"].get(dra.NODE_PATH_LABEL) == dra.PATH_DRA
        slices = dra_slices(option, name, scratch.config) if dra_path else []
        for published in slices:
            scratch.claims.set_slice(published)
        scratch.set_node(manifest)
        if dra_path:
            # The inventory names the cards as the slices do (its pair scores then map).
            cards = [dataclasses.replace(d, id=dra_uuid(name, d.index)) for d in it.devices]
            by_old = {d.id: c.id for d, c in zip(it.devices, cards, strict=True)}
            scores = {
                by_old[a]: {by_old[b]: v for b, v in peers.items() if b in by_old}
                for a, peers in it.pair_scores.items()
                if a in by_old
            }
        else:
            cards, scores = renamed_cards(name, it.devices, it.pair_scores)
        scratch.set_inventory(name, cards, scores, self._now)
        made = NewNode(
            scratch.nodes[name], scratch.claims.pool_of(name), scratch.claims.mig_of(name)
        )
        scratch.remove_node(name)  # the next option may reuse the name
        for published in slices:
            scratch.claims.remove_slice(str(published["metadata"]["name"]))
        return made
