"""What judging reads of a node independently of any request, made once per node change.

A request judges a node by its card classes (``card_classes.NodeProfile``) and, where it
can, by the node's group and free-capacity bounds (``card_groups.NodeGroup``); before
either, by the node gate, whose answer depends on what the gate reads of the request (a
gate key) and is kept per key. None of it depends on the rest of the request, so it is
kept in one record per node, made when the node is first judged after a change and
dropped at the node's next change (the books' change log numbers them; a change of the
config or the quota limits, the books' epoch, drops every record): a burst of
never-seen requests reads the records, it does not make them again.
"""

from __future__ import annotations

from dataclasses import dataclass

from vgpu_operator.scheduling import node_annotations
from vgpu_operator.scheduling.books.entries import NodeEntry
from vgpu_operator.scheduling.books.view import BooksView
from vgpu_operator.scheduling.dialects.annotation import card_classes, card_groups
from vgpu_operator.scheduling.status import Reason


@dataclass(slots=True)
class NodeRecord:
    """One node as judging reads it, as of its last change."""

    node: NodeEntry
    profile: card_classes.NodeProfile | None = None
    #: The profile made card by card (for UUID restrictions).
    profile_by_ids: card_classes.NodeProfile | None = None
    group: card_groups.NodeGroup | None = None
    #: The last gate answer and the gate key it was made for (``gate_key`` None: none).
    gate_key: object = None
    gate: Reason | None = None


class NodeClasses:
    """The records of the nodes judged since their last change."""

    def __init__(self, view: BooksView) -> None:
        self.view = view
        self._records: dict[str, NodeRecord] = {}
        self._log = view.change_log
        #: The change and the epoch the records are current with.
        self._seq = self._log.seq
        self._epoch = view.epoch

    def _drop_changed(self) -> None:
        """Drop the records of the nodes changed since the last call (every record when
        the log no longer reaches back, or the epoch moved)."""
        log, epoch = self._log, self.view.epoch
        changed = log.since(self._seq) if epoch == self._epoch else None
        if changed is None:
            self._records.clear()
        else:
            for name in changed:
                self._records.pop(name, None)
        self._seq, self._epoch = log.seq, epoch

    def record(self, name: str) -> NodeRecord | None:
        """The node's record (None: no such node)."""
        if self._log.seq != self._seq or self.view.epoch != self._epoch:
            self._drop_changed()
        record = self._records.get(name)
        if record is None:
            node = self.view.nodes.get(name)
            if node is None:
                return None
            self.view.refresh(node)
            record = self._records[name] = NodeRecord(node)
        return record

    def profile(self, name: str, with_ids: bool) -> card_classes.NodeProfile | None:
        """The node's cards as classes (None: no such node)."""
        record = self.record(name)
        return None if record is None else self.profile_of(record, with_ids)

    def group(self, name: str) -> card_groups.NodeGroup | None:
        """The node's group and free-capacity bounds (None: no such node)."""
        record = self.record(name)
        return None if record is None else self.group_of(record)

    @staticmethod
    def profile_of(record: NodeRecord, with_ids: bool) -> card_classes.NodeProfile:
        """A record's profile, made on first use."""
        made = record.profile_by_ids if with_ids else record.profile
        if made is None:
            node = record.node
            cordoned = node_annotations.cordoned_cards(
                node.facts.annotations, node.inventory_cordoned
            )
            made = card_classes.profile(node.cards, cordoned, node.layer, with_ids=with_ids)
            if with_ids:
                record.profile_by_ids = made
            else:
                record.profile = made
        return made

    @classmethod
    def group_of(cls, record: NodeRecord) -> card_groups.NodeGroup:
        """A record's group, made on first use."""
        if record.group is None:
            record.group = card_groups.group_of(cls.profile_of(record, False))
        return record.group
