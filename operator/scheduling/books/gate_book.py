"""The books' part that keeps the per-node allocation gate (``allocation_gate``).

Which pod holds each node's gate lives on the node entries (``NodeEntry.allocating``,
kept as pods come and go); this part keeps the gate's mode and timeout, each bound pod's
first device-plugin answer, and the pods whose hold timed out, and answers whether a
node's gate is open. It reads the nodes and pods it is given and writes only the time a
hold started (its own record and the node's map; pod entries are frozen).
"""

from __future__ import annotations

from collections.abc import Mapping

from vgpu_operator.devices import codec
from vgpu_operator.scheduling.books import allocation_gate
from vgpu_operator.scheduling.books.entries import NodeEntry, PodEntry
from vgpu_operator.scheduling.pod_key import PodKey


class GateBook:
    def __init__(self) -> None:
        #: At most one GPU pod per node between Binding and the plugin's answer.
        self.mode = allocation_gate.GateMode.OFF
        self.timeout_s = allocation_gate.DEFAULT_TIMEOUT_S
        #: The first answer of each bound pod's device plugin (``success`` or ``failed``):
        #: a pod answered holds no gate again, and a later answer changes nothing.
        self._answers: dict[PodKey, str] = {}
        #: Pods whose hold on the gate timed out (reported once, by ``expired``): a
        #: later ``allocating`` holds nothing.
        self._expired: set[PodKey] = set()
        #: When each hold was timed (``time``): a frozen entry keeps the time it was read
        #: with, so a later entry of the pod and a re-added one carry this one over.
        self._timed: dict[PodKey, float] = {}

    @property
    def enabled(self) -> bool:
        """Whether a node's GPU pods are bound one at a time (any gate mode but off)."""
        return self.mode is not allocation_gate.GateMode.OFF

    # --- what a pod's annotations say ------------------------------------------------
    def new_pod(self, key: PodKey) -> None:
        """Another pod of the same name: nothing the old one's plugin said applies."""
        self._answers.pop(key, None)
        self._expired.discard(key)
        self._timed.pop(key, None)

    def answered_failed(self, key: PodKey, annotations: Mapping[str, str], holds: bool) -> bool:
        """Record the plugin's first answer; whether it refused the pod's devices (kubelet
        will not start it with them: only the first answer counts, so a pod that got its
        devices and says failed later is still on them)."""
        answer = allocation_gate.answer(annotations)
        if answer is not None and holds:
            self._answers.setdefault(key, answer)
        return self._answers.get(key) == codec.BindPhase.FAILED

    def since(
        self,
        key: PodKey,
        uid: str,
        previous: PodEntry | None,
        annotations: Mapping[str, str],
        holds: bool,
        deleting: bool,
    ) -> float | None:
        """Since when (the operator's clock) the pod holds its node's allocation gate, or
        None. The time is never read from the pod: it is carried over from the pod's
        earlier entry (its own Binding's, ``confirm``), or starts at the gate's next look
        (``allocation_gate.UNTIMED``)."""
        if deleting or key in self._answers or key in self._expired:
            return None
        if not allocation_gate.claims_gate(annotations, holds):
            return None
        if (
            previous is not None
            and previous.allocating_since is not None
            and previous.uid in ("", uid)
        ):
            return self._timed.get(key, previous.allocating_since)
        return allocation_gate.UNTIMED

    def held_since(self, entry: PodEntry) -> float | None:
        """Since when the entry's pod holds its node's gate (None: it holds none)."""
        if entry.allocating_since is None:
            return None
        return self._timed.get(entry.key, entry.allocating_since)

    def forget(self, key: PodKey) -> None:
        self._answers.pop(key, None)
        self._expired.discard(key)
        self._timed.pop(key, None)

    # --- the gate ----------------------------------------------------------------------
    def time(self, entry: PodEntry, node: NodeEntry | None, now: float) -> None:
        """The pod's hold starts now."""
        self._timed[entry.key] = now
        if node is not None and entry.key in node.allocating:
            node.allocating[entry.key] = now

    def _holders(
        self, node: NodeEntry, pods: Mapping[PodKey, PodEntry], now: float
    ) -> list[tuple[PodKey, float]]:
        """The bound pods holding the node's gate, and since when (untimed ones timed now)."""
        held = []
        for holder, since in sorted(node.allocating.items()):
            entry = pods.get(holder)
            if entry is None or entry.reserved:
                continue  # decided, not bound yet: it holds no gate
            if since == allocation_gate.UNTIMED:
                self.time(entry, node, now)
                since = now
            held.append((holder, since))
        return held

    def open(
        self,
        node: NodeEntry | None,
        key: PodKey,
        pods: Mapping[PodKey, PodEntry],
        now: float,
    ) -> bool:
        """Whether ``key``, decided onto the node, may be bound there now: no other pod
        bound there still waits for its devices (and, with ``hami-lock``, HAMi's node
        lock is not held by another pod). Pods decided but not yet bound do not count:
        they wait for the gate themselves, in decision order."""
        if self.mode is allocation_gate.GateMode.OFF or node is None:
            return True
        for holder, since in self._holders(node, pods, now):
            if holder != key and now - since <= self.timeout_s:
                return False
        if self.mode is allocation_gate.GateMode.HAMI_LOCK:
            owner = allocation_gate.lock_holder(node.facts.annotations, now, self.timeout_s)
            # Correctness does not rest on this: taking the lock is a guarded write.
            if owner is not None and owner != key and (not owner or owner in pods):
                return False
        return True

    def holder(
        self, node: NodeEntry | None, pods: Mapping[PodKey, PodEntry], now: float
    ) -> allocation_gate.GateHolder | None:
        """The bound pod that keeps the node's gate shut now, or None."""
        if node is None or self.mode is allocation_gate.GateMode.OFF:
            return None
        for holder, since in self._holders(node, pods, now):
            if now - since <= self.timeout_s:
                held = now - since
                return allocation_gate.GateHolder(holder, held, self.timeout_s - held)
        return None

    def expired(
        self, nodes: Mapping[str, NodeEntry], pods: Mapping[PodKey, PodEntry], now: float
    ) -> list[tuple[str, PodKey]]:
        """Gates that timed out since the last call (node, holder): their nodes are open
        again, so parked pods should be retried, and the holders reported."""
        if self.mode is allocation_gate.GateMode.OFF:
            return []
        expired: list[tuple[str, PodKey]] = []
        for node in nodes.values():
            for key, since in list(node.allocating.items()):
                entry = pods.get(key)
                if entry is None or entry.reserved:
                    continue  # decided, not bound yet: it holds no gate
                if since == allocation_gate.UNTIMED:
                    self.time(entry, node, now)
                    continue
                if now - since > self.timeout_s and key not in self._expired:
                    self._expired.add(key)
                    expired.append((node.name, key))
        return sorted(expired)
