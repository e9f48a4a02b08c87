"""What verdicts read of the books (``verdicts.JudgedBooks``): the view, with the
decision cycle's node gate and Fit, and each node's cards as classes and its group made
once per change of the node (``books.node_classes``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from vgpu_operator.scheduling.books.entries import NodeEntry
from vgpu_operator.scheduling.books.node_classes import NodeClasses, NodeRecord
from vgpu_operator.scheduling.books.view import BooksView
from vgpu_operator.scheduling.cycle import node_gate
from vgpu_operator.scheduling.dialects.annotation import card_classes, card_groups, placement
from vgpu_operator.scheduling.policies import node_layer
from vgpu_operator.scheduling.status import NodeFailure, Reason

#: One failure per gate reason, shared by every node the gate rules out.
_GATE_FAILURES: dict[Reason, NodeFailure] = {}


def gate_failure(reason: Reason) -> NodeFailure:
    """The diagnosis entry of a node its gate rules out."""
    failure = _GATE_FAILURES.get(reason)
    if failure is None:
        failure = _GATE_FAILURES[reason] = NodeFailure({reason: 1})
    return failure


Gate = Callable[[NodeEntry, placement.Job, float], Reason | None]
Fit = Callable[[NodeEntry, placement.Job, float], placement.Outcome]


class JudgedView:
    def __init__(self, view: BooksView, gate: Gate, fit: Fit) -> None:
        self.view = view
        self._gate = gate
        self._fit = fit
        #: Each node's cards as classes and its group, made once per change of the node.
        self.classes = NodeClasses(view)

    @property
    def epoch(self) -> int:
        return self.view.epoch

    def change_seq(self) -> int:
        return self.view.change_log.seq

    def changed_since(self, seq: int) -> set[str] | None:
        return self.view.change_log.since(seq)

    def judged_nodes(self) -> Iterable[str]:
        return self.view.nodes.keys()

    def has_node(self, name: str) -> bool:
        return name in self.view.nodes

    def node_count(self) -> int:
        return len(self.view.nodes)

    def node_gate(
        self, name: str, job: placement.Job, now: float, key: object = None
    ) -> Reason | None:
        """The node gate; with ``key`` (what the gate reads of the job, hashable: the
        verdicts' ``gate_key``), answered from the node's last gate for that key while
        the node has not changed (its record, ``books.node_classes``)."""
        if key is None:
            node = self.view.nodes[name]
            # Whoever asks for the gate gets the node rebuilt (a no-op unless it is
            # dirty), which later reads of the node may rely on.
            self.view.refresh(node)
            return self._gate(node, job, now)
        record = self.classes.record(name)
        if record is None:
            raise KeyError(name)
        return self._kept_gate(record, job, now, key)

    def _kept_gate(
        self, record: NodeRecord, job: placement.Job, now: float, key: object
    ) -> Reason | None:
        """The gate from the record's last answer for ``key``, else made and kept. Of the
        gate's checks only the last one, the node's staleness, reads the clock: a kept
        answer other than None or stale holds, and None or stale is decided again
        against ``now``."""
        if record.gate_key is key or (record.gate_key is not None and record.gate_key == key):
            reason = record.gate
            if reason is not None and reason is not Reason.INVENTORY_STALE:
                return reason
            node = record.node
            if job.wants_devices and node_gate.stale(node, now, self.view.inventory_timeout_s):
                return Reason.INVENTORY_STALE
            return None
        reason = self._gate(record.node, job, now)
        record.gate_key, record.gate = key, reason
        return reason

    def judge_by_classes(
        self, name: str, job: placement.Job, now: float, key: object, groups: card_groups.GroupJudge
    ) -> card_classes.Judgement:
        """The node judged by its gate (kept for ``key``), then by its group where the
        group decides, else by its card classes (``card_groups``): its failure, None (the
        job fits), or ``UNJUDGED`` (MIG cards: fit it)."""
        record = self.classes.record(name)
        if record is None:
            raise KeyError(name)
        gate = self._kept_gate(record, job, now, key)
        if gate is not None:
            return gate_failure(gate)
        group = NodeClasses.group_of(record)
        if groups.by_ids(group):
            return groups.simple.judge(NodeClasses.profile_of(record, True))
        known = groups.known(group)
        if known is not card_classes.UNJUDGED:
            return known
        return groups.learn(group, NodeClasses.profile_of(record, False))

    def node_profile(self, name: str, with_ids: bool) -> card_classes.NodeProfile | None:
        """The node's cards as classes, made once per change of the node."""
        return self.classes.profile(name, with_ids)

    def node_group(self, name: str) -> card_groups.NodeGroup | None:
        """The node's group and free-capacity bounds, made once per change of the node."""
        return self.classes.group(name)

    def node_layer(self, name: str) -> node_layer.NodeLayer:
        return self.view.nodes[name].layer

    def node_fit(self, name: str, job: placement.Job, now: float) -> placement.Outcome:
        return self._fit(self.view.nodes[name], job, now)

    def heartbeat(self, name: str) -> float | None:
        node = self.view.nodes.get(name)
        return None if node is None else node.heartbeat

    def fresh_until(self, name: str) -> float | None:
        """When the node's devices go stale unless its heartbeat moves (None: never, or
        already stale without a heartbeat)."""
        node = self.view.nodes.get(name)
        timeout = self.view.inventory_timeout_s
        if timeout is None or node is None or node.inventory is None or node.heartbeat is None:
            return None
        return node.heartbeat + timeout

    def namespace_quota(self, namespace: str) -> object:
        """What Fit's quota check reads of the namespace (None when no quota limits it)."""
        if not self.view.quota.has_limits(namespace):
            return None
        return tuple(sorted(self.view.quota.usage(namespace).items()))
