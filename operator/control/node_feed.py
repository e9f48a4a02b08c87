"""Nodes, their DeviceInventories and their Leases into the engine (part of ``StateFeed``).

Which inventories are believed (one describes only the node it is named after; an
unreadable one offers no device), what is said about the objects the operator ignores
(Warning Events, once per change of reason), and each node's heartbeat: the later of its
inventory's own and its Lease's renewal, never later than now. A node whose devices,
pair scores, cordons or Node fields changed, or whose heartbeat came back, is handed to
``node_changed`` (the feed wakes the pods it may help).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

import structlog

from vgpu_operator import node_leases, resources
from vgpu_operator.control import pod_facts, queue
from vgpu_operator.devices import model
from vgpu_operator.errors import CodecError
from vgpu_operator.wire import DeviceInventory, KubeObject, Lease, Node

log = structlog.get_logger("vgpu_operator.feed")

#: Event reasons of the warnings.
NODE_ANNOTATION_IGNORED: Final = "NodeAnnotationIgnored"
INVENTORY_REFUSED: Final = "InventoryRefused"


@dataclass(frozen=True, slots=True)
class ObjectWarning:
    """Something wrong with an object the operator reads, for a Warning Event on it: a
    Node annotation it ignores, a DeviceInventory it refuses."""

    obj: KubeObject
    kind: str
    reason: str
    message: str


class NodeInputs(Protocol):
    """The part of ``scheduling.cycle.cluster.ClusterState`` that nodes feed."""

    def set_node(self, node: Node) -> None: ...
    def node_warnings(self, name: str) -> tuple[str, ...]: ...
    def remove_node(self, name: str) -> None: ...
    def set_inventory(
        self,
        node_name: str,
        devices: Sequence[model.DeviceInfo],
        pair_scores: model.PairScores,
        heartbeat: float | None,
        cordoned: Sequence[str] = (),
    ) -> None: ...
    def set_heartbeat(self, node_name: str, heartbeat: float | None) -> None: ...
    def remove_inventory(self, node_name: str) -> None: ...


class NodeFeed:
    """See the module docstring. ``wall_clock`` gives epoch seconds."""

    def __init__(
        self,
        engine: NodeInputs,
        node_changed: Callable[[queue.ClusterEvent, str], None],
        *,
        inventory_timeout_s: float | None,
        wall_clock: Callable[[], float],
    ) -> None:
        self._engine = engine
        self._node_changed = node_changed
        self._inventory_timeout_s = inventory_timeout_s
        self._wall_clock = wall_clock
        self._node_fingerprints: dict[str, str] = {}
        #: Per node, the unreadable node-layer annotations last reported, so a Node's
        #: routine updates do not repeat its Event; and the reports not yet written.
        self._node_warnings: dict[str, tuple[str, ...]] = {}
        self._unreported: list[ObjectWarning] = []
        #: Per DeviceInventory, why it is refused (reported once per change of reason).
        self._inventory_problems: dict[str, str] = {}
        self._inventory_fingerprints: dict[str, str] = {}
        self._inventory_nodes: dict[str, str] = {}  # inventory name -> node name
        #: Per node with an accepted inventory, the inventory's own heartbeat; a node's
        #: heartbeat is the later of it and its Lease's renewal (``_heartbeat``).
        self._inventory_beats: dict[str, float | None] = {}
        #: Per node Lease that reads as a heartbeat, its renewTime (any node: the Lease
        #: may arrive before the inventory).
        self._lease_beats: dict[str, float] = {}
        #: Per node Lease that does not, why (logged once per change of reason).
        self._lease_problems: dict[str, str] = {}
        self._stale_nodes: set[str] = set()

    @property
    def stale_nodes(self) -> frozenset[str]:
        return frozenset(self._stale_nodes)

    def take_warnings(self) -> list[ObjectWarning]:
        """The warnings found since the last call (for Events on their objects)."""
        taken, self._unreported = self._unreported, []
        return taken

    # --- nodes --------------------------------------------------------------------------
    def apply_node(self, name: str, node: Node) -> None:
        self._engine.set_node(node)
        warnings = self._engine.node_warnings(name)
        if warnings != self._node_warnings.get(name, ()):
            self._node_warnings[name] = warnings
            for message in warnings:
                log.warning("node_annotation_ignored", node=name, problem=message)
                self._unreported.append(
                    ObjectWarning(node, "Node", NODE_ANNOTATION_IGNORED, message)
                )
        fingerprint = pod_facts.node_fingerprint(node)
        if self._node_fingerprints.get(name) != fingerprint:
            self._node_fingerprints[name] = fingerprint
            self._node_changed(queue.ClusterEvent.NODE_CHANGED, name)

    def forget_node(self, name: str) -> None:
        self._engine.remove_node(name)
        self._node_fingerprints.pop(name, None)
        self._node_warnings.pop(name, None)
        log.info("node_removed", node=name)

    # --- device inventories ---------------------------------------------------------------
    def apply_inventory(self, name: str, obj: DeviceInventory) -> None:
        # An inventory describes only the node it is named after: one that claims another
        # node would let whoever may write it redefine that node's GPUs.
        node = name
        status = obj.get("status")
        claimed = status.get("nodeName") if isinstance(status, Mapping) else None
        if claimed is not None and claimed != name:
            self._refuse_inventory(
                name,
                obj,
                f"status.nodeName {claimed!r} differs from the inventory's name {name!r}: an "
                "inventory describes only the node it is named after; its devices are ignored",
            )
            return
        try:
            reading = resources.read_inventory(obj)
        except CodecError as exc:
            # Without a readable report the node's devices are unknown: offer none.
            if exc.field == "status":
                log.info("inventory_not_reported_yet", node=node)
                self.forget_inventory(name)
            else:
                self._refuse_inventory(name, obj, f"unreadable, its devices are ignored: {exc}")
            return
        if self._inventory_problems.pop(name, None) is not None:
            log.info("inventory_accepted_again", node=node)
        devices, pair_scores = reading.devices, reading.pair_scores
        cordoned = sorted(reading.cordoned)
        previous_node = self._inventory_nodes.get(name)
        if previous_node is not None and previous_node != node:
            self._engine.remove_inventory(previous_node)
        self._inventory_nodes[name] = node
        was_stale = self._was_stale(node)
        self._inventory_beats[node] = (
            self._not_after_now(reading.heartbeat.timestamp())
            if reading.heartbeat is not None
            else None
        )
        heartbeat = self._heartbeat(node)
        self._engine.set_inventory(node, devices, pair_scores, heartbeat, cordoned)
        fingerprint = pod_facts.digest([[_device_wire(d) for d in devices], pair_scores, cordoned])
        changed = self._inventory_fingerprints.get(name) != fingerprint
        self._inventory_fingerprints[name] = fingerprint
        revived = was_stale and not self._is_stale(heartbeat)
        if revived:
            self._stale_nodes.discard(node)
            log.info("inventory_fresh_again", node=node)
        if changed or revived:
            self._node_changed(queue.ClusterEvent.INVENTORY_CHANGED, node)

    def _refuse_inventory(self, name: str, obj: DeviceInventory, problem: str) -> None:
        """Offer none of the inventory's devices, and say why (log, and an Event once per
        change of reason)."""
        self.forget_inventory(name)
        if self._inventory_problems.get(name) == problem:
            return
        self._inventory_problems[name] = problem
        log.warning("inventory_refused", inventory=name, problem=problem)
        self._unreported.append(ObjectWarning(obj, "DeviceInventory", INVENTORY_REFUSED, problem))

    def forget_inventory(self, name: str) -> None:
        node = self._inventory_nodes.pop(name, name)
        self._engine.remove_inventory(node)
        self._inventory_fingerprints.pop(name, None)
        self._inventory_beats.pop(node, None)
        self._stale_nodes.discard(node)

    # --- node Leases (the agents' heartbeats) ---------------------------------------------
    def apply_lease(self, name: str, lease: Lease) -> None:
        # Each Lease is named after its node (the admission policy holds agents to it).
        try:
            renewed: float | None = self._not_after_now(node_leases.read_renewal(lease))
        except CodecError as exc:
            # Not a heartbeat, and the renewal read before it is not one now either: the
            # node is as fresh as its inventory says, no fresher.
            renewed = None
            if self._lease_problems.get(name) != str(exc):
                self._lease_problems[name] = str(exc)
                log.warning("node_lease_unreadable", node=name, problem=str(exc))
        else:
            self._lease_problems.pop(name, None)
        self._move_lease_beat(name, renewed)

    def forget_lease(self, name: str) -> None:
        self._lease_problems.pop(name, None)
        self._move_lease_beat(name, None)

    def _move_lease_beat(self, node: str, renewed: float | None) -> None:
        """Record the node's Lease renewal; a node with an inventory gets its new
        heartbeat (cheap: nothing of its cards is rebuilt), and wakes pods if it revived."""
        was_stale = self._was_stale(node)
        if renewed is None:
            self._lease_beats.pop(node, None)
        else:
            self._lease_beats[node] = renewed
        if node not in self._inventory_beats:
            return  # no inventory, nothing to keep fresh
        heartbeat = self._heartbeat(node)
        self._engine.set_heartbeat(node, heartbeat)
        if was_stale and not self._is_stale(heartbeat):
            self._stale_nodes.discard(node)
            log.info("inventory_fresh_again", node=node)
            self._node_changed(queue.ClusterEvent.INVENTORY_CHANGED, node)

    # --- heartbeats -----------------------------------------------------------------------
    def _not_after_now(self, beat: float) -> float:
        """A heartbeat stamped in the future (a node's clock ahead, or a careless
        writer) counts as made now, when it is seen: a Lease renewed "in 2099" must not
        keep a node fresh after its agent stops."""
        return min(beat, self._wall_clock())

    def _heartbeat(self, node: str) -> float | None:
        """The later of the node's inventory heartbeat and its Lease renewal."""
        beats = (self._inventory_beats.get(node), self._lease_beats.get(node))
        return max((beat for beat in beats if beat is not None), default=None)

    def _was_stale(self, node: str) -> bool:
        """Stale as the books have it now (whether or not the watchdog noticed it yet)."""
        return node in self._stale_nodes or (
            node in self._inventory_beats and self._is_stale(self._heartbeat(node))
        )

    def _is_stale(self, heartbeat: float | None) -> bool:
        if self._inventory_timeout_s is None or heartbeat is None:
            return False
        return self._wall_clock() - heartbeat > self._inventory_timeout_s

    def check_heartbeats(self) -> list[str]:
        """Nodes whose heartbeat (inventory and Lease) has just gone stale (for the
        periodic watchdog's log).

        The engine applies the timeout itself at each decision; this only notices it.
        """
        newly_stale = [
            node
            for node in self._inventory_beats
            if node not in self._stale_nodes and self._is_stale(self._heartbeat(node))
        ]
        self._stale_nodes.update(newly_stale)
        return newly_stale


def _device_wire(device: model.DeviceInfo) -> list[Any]:
    return [
        device.id,
        device.index,
        device.count,
        device.memory_mib,
        device.cores,
        device.type,
        device.numa,
        device.health,
        device.mode,
        device.vendor,
    ]
