"""The books' ranking index: nodes with a free card in each policy's order.

Three sorted lists of (key, order, name), best first: spread (score ascending), binpack
(score descending), and, for pods that name no node policy, each node ranked by its own
policy (node annotation, else the ConfigMap) on one scale (``policies.node_preference``).
Equal keys go to the node registered first. The books re-rank the nodes that changed
before a walk (``Books.rerank``); a full node is not ranked (no search walks past it).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from vgpu_operator.scheduling.policies import policies

Ranked = tuple[float, int, str]


class RankIndex:
    def __init__(self) -> None:
        self._spread: list[Ranked] = []
        self._binpack: list[Ranked] = []
        self._layered: list[Ranked] = []
        #: Each ranked node's score, preference and order.
        self._ranked: dict[str, tuple[float, float, int]] = {}

    def ranking(self, pod_node_policy: str | None) -> Sequence[Ranked]:
        if pod_node_policy is None:
            return self._layered
        if pod_node_policy == policies.SPREAD:
            return self._spread
        return self._binpack

    def entry(self, name: str, pod_node_policy: str | None) -> Ranked | None:
        """The node's entry in ``ranking(pod_node_policy)`` (None: not ranked)."""
        ranked = self._ranked.get(name)
        if ranked is None:
            return None
        score, preference, order = ranked
        if pod_node_policy is None:
            return (-preference, order, name)
        if pod_node_policy == policies.SPREAD:
            return (score, order, name)
        return (-score, order, name)

    def add(self, name: str, order: int, score: float, preference: float) -> None:
        bisect.insort(self._spread, (score, order, name))
        bisect.insort(self._binpack, (-score, order, name))
        bisect.insort(self._layered, (-preference, order, name))
        self._ranked[name] = (score, preference, order)

    def remove(self, name: str) -> None:
        ranked = self._ranked.pop(name, None)
        if ranked is None:
            return
        score, preference, order = ranked
        for ranking, entry in (
            (self._spread, (score, order, name)),
            (self._binpack, (-score, order, name)),
            (self._layered, (-preference, order, name)),
        ):
            at = bisect.bisect_left(ranking, entry)
            if at < len(ranking) and ranking[at] == entry:
                del ranking[at]
