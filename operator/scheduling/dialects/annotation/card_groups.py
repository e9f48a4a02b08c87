"""Nodes judged by groups: alike nodes whose free capacity is on one side of a request.

A node's card classes (``card_classes``) tell its cards apart by everything a Fit check
reads, their free memory and cores included, so on a loaded cluster almost every node has
a profile of its own and a request never seen before judges each node once. Most of those
judgements are alike: a request that asks more memory than any card of a node has free
fails every card of it at the memory check (or at an earlier one), whatever the exact
free memory of each. What such a node's failure reads of a card is then only the part of
its class that no share changes (its static part), plus three answers that no request
moves: whether its slots are all taken, whether anything is on it (exclusivity), whether
its cores are all taken (compute units).

``NodeGroup`` keeps, per node, those coarse classes as one number (``ident``), and the
node's free capacity as bounds: per card memory size the least and the most free memory,
and the least and the most free cores. Both are independent of any request and are made
once per change of the node (``books.node_classes``). For a simple job (``Simple``), a
node's ``Regime`` says on which side of the request each card's free memory and cores
lie: every card short of memory (``SHORT``), or every card with the memory, and then
every card short of the cores or every card with them. Nodes of one group in one regime
fail alike: the first of them is judged by its card classes (``Simple.judge``, which runs
Fit's own checks on one card of each class), and the others take its failure. A node
whose cards lie on both sides (``None``) is judged by its own classes.

Why that is exact: ``Simple`` judges a card class by its static part and the answers
``(slots taken, in use, short of memory, short of cores, cores taken)``; in a group those
answers are equal card for card, but for the two about memory and cores, which the regime
makes equal too (short of memory decides before the cores are read: Fit checks memory
first). The property test ``test_node_groups_match_fit`` compares it with Fit on every
node.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from vgpu_operator.scheduling.dialects.annotation.card_classes import (
    UNJUDGED,
    Judgement,
    NodeProfile,
    Simple,
    ident,
)
from vgpu_operator.scheduling.status import NodeFailure

#: Every card that reaches the memory check is short of memory.
SHORT: Final = "short"
#: Every card has the memory; every card is short of the cores / every card has them.
ROOM_SHORT_CORES: Final = "room, short of cores"
ROOM: Final = "room"

Regime = str


@dataclass(frozen=True, slots=True)
class NodeGroup:
    """A node's cards as coarse classes (``ident``) and its free capacity as bounds."""

    #: A number for the coarse classes: the node layer as judging reads it, whether it
    #: has MIG cards, and per class its static part, the three request-free answers
    #: and its card count.
    ident: int
    #: Per card memory size (MiB): the least and the most free memory of such cards.
    memory: tuple[tuple[int, int, int], ...]
    least_free_cores: int
    most_free_cores: int
    has_mig: bool
    #: The node layer's card restriction annotations (keys): UUID restrictions judge
    #: card by card (``GroupJudge.by_ids``).
    restrictions: frozenset[str]


def group_of(profile: NodeProfile) -> NodeGroup:
    """The node's group, from its profile made without card ids (``card_classes``)."""
    coarse: dict[tuple[object, ...], int] = {}
    memory: dict[int, tuple[int, int]] = {}
    least_cores = most_cores = -1
    for card_class in profile.classes:
        card = card_class.card
        answers = (card.count <= card.used, card.used > 0, card.used_cores == card.total_cores)
        key = (card_class.static, answers)
        coarse[key] = coarse.get(key, 0) + card_class.count
        free = card.total_memory_mib - card.used_memory_mib
        least, most = memory.get(card.total_memory_mib, (free, free))
        memory[card.total_memory_mib] = (min(least, free), max(most, free))
        cores = card.total_cores - card.used_cores
        least_cores = cores if least_cores < 0 else min(least_cores, cores)
        most_cores = max(most_cores, cores)
    whole = (profile.layer_key, profile.has_mig, tuple(sorted(coarse.items())))
    bounds = tuple((total, least, most) for total, (least, most) in sorted(memory.items()))
    restrictions = frozenset(profile.layer.restrictions)
    return NodeGroup(ident(whole), bounds, least_cores, most_cores, profile.has_mig, restrictions)


def regime(group: NodeGroup, memory_mib: int, percent: int, cores: int) -> Regime | None:
    """On which side of the request (``memory_mib``, or ``percent`` of each card when
    0 or more; ``cores`` at most 100) the node's cards lie, or None when on both."""
    short = room = True
    for total, least, most in group.memory:
        need = total * percent // 100 if percent >= 0 else memory_mib
        short = short and most < need
        room = room and least >= need
    if short:
        return SHORT
    if not room:
        return None
    if group.most_free_cores < cores:
        return ROOM_SHORT_CORES
    if group.least_free_cores >= cores:
        return ROOM
    return None


class GroupJudge:
    """A simple job's judgements per (group, regime), over its ``Simple`` judge.

    Per node: ``by_ids`` (judged card by card instead: UUID restrictions), else
    ``known`` (the group's judgement in the node's regime, made already), else
    ``learn`` (the node judged by its own card classes, kept for its group).
    """

    #: Judgements remembered at most; then started again.
    MAX_GROUPS: Final = 1 << 14

    def __init__(self, simple: Simple) -> None:
        self.simple = simple
        self._memory, self._percent, self._cores = simple.room_request()
        self._uuid_keys = simple.uuid_restriction_keys()
        self._known: dict[tuple[int, Regime], NodeFailure | None] = {}

    def by_ids(self, group: NodeGroup) -> bool:
        """Whether the node must be judged card by card (``Simple.wants_ids``)."""
        return self.simple.by_uuid or not self._uuid_keys.isdisjoint(group.restrictions)

    def known(self, group: NodeGroup) -> Judgement:
        """The group's judgement in the node's regime, or ``UNJUDGED`` when none is
        made yet or none applies (the node's cards on both sides, MIG cards)."""
        if group.has_mig:
            return UNJUDGED
        side = regime(group, self._memory, self._percent, self._cores)
        if side is None:
            return UNJUDGED
        return self._known.get((group.ident, side), UNJUDGED)

    def learn(self, group: NodeGroup, profile: NodeProfile) -> Judgement:
        """The node judged by its card classes (``profile``, made without card ids),
        kept for its group where its regime is one."""
        failure = self.simple.judge(profile)
        side = None if group.has_mig else regime(group, self._memory, self._percent, self._cores)
        if side is not None and failure is not UNJUDGED:
            if len(self._known) >= self.MAX_GROUPS:
                self._known.clear()
            self._known[group.ident, side] = failure  # type: ignore[assignment]
        return failure
