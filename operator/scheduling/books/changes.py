"""What changed in the books since when, for the verdicts of waiting pods and their
queueing hints.

Two records, both kept by the books as they change:

- ``ChangeLog``: a sequence number that moves on every change to a node that a Fit reads
  (its cards' shares, its facts, its registration, its removal). A verdict made at one
  number is brought up to date by judging again only the nodes changed since.
- ``FreedRoom``: the pods that left a node (ended, deleted, a reservation rolled back, a
  preemptor's hold given up, an init container's share released), net of a pod taken
  off and put back with the same shares (a status update, its own bound copy). Each is
  room a waiting pod may now fit in; the runtime drains them and wakes those it helps.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from vgpu_operator.scheduling.pod_key import PodKey

#: Changes listed before the oldest are forgotten; a verdict older than that judges every
#: node again (it has been waiting that long anyway).
DEFAULT_KEEP: Final = 65_536


class ChangeLog:
    """Node changes in order, numbered from 1."""

    def __init__(self, keep: int = DEFAULT_KEEP) -> None:
        if keep < 1:
            raise ValueError("keep must be positive")
        self._keep = keep
        self._seq = 0
        self._log: list[tuple[int, str]] = []
        self._last: dict[str, int] = {}
        #: Changes numbered up to this one are no longer listed.
        self._forgotten = 0

    @property
    def seq(self) -> int:
        """The number of the latest change (0: none yet)."""
        return self._seq

    def bump(self, node: str) -> int:
        """Record a change to ``node``; returns its number."""
        self._seq += 1
        self._log.append((self._seq, node))
        self._last[node] = self._seq
        if len(self._log) > 2 * self._keep:
            cut = len(self._log) - self._keep
            self._forgotten = self._log[cut - 1][0]
            del self._log[:cut]
        return self._seq

    def last(self, node: str) -> int:
        """The number of the node's latest change (0: none recorded)."""
        return self._last.get(node, 0)

    def since(self, seq: int) -> set[str] | None:
        """The nodes changed after change ``seq``; None when the log no longer reaches
        back that far (judge every node)."""
        if seq >= self._seq:
            return set()
        if seq < self._forgotten:
            return None
        start = bisect.bisect_right(self._log, seq, key=lambda item: item[0])
        return {node for _, node in self._log[start:]}


@dataclass(frozen=True, slots=True)
class Freed:
    """Room freed on a node by a pod of a namespace."""

    node: str
    namespace: str


class FreedRoom:
    """Pods that left a node since the last ``take``, net of those put back unchanged.

    ``left`` is called when a pod's entry leaves a node with ``same``, a token of what it
    held there; ``came`` when an entry is added: the same pod back on the same node with
    an equal token cancels the leaving.
    """

    def __init__(self) -> None:
        self._left: dict[PodKey, tuple[Freed, object]] = {}

    def left(self, key: PodKey, node: str, namespace: str, same: object) -> None:
        self._left[key] = (Freed(node, namespace), same)

    def came(self, key: PodKey, node: str | None, same: object) -> None:
        noted = self._left.get(key)
        if noted is not None and noted[0].node == node and noted[1] == same:
            del self._left[key]

    def forget(self, keys: Iterable[PodKey]) -> None:
        """These pods' leaving frees nothing: reservations taken back within one decision
        (a gang that did not fit whole) free no room a waiting pod could use."""
        for key in keys:
            self._left.pop(key, None)

    def take(self) -> list[Freed]:
        """Every room freed since the last call, once each (node and namespace)."""
        if not self._left:
            return []
        taken = list(dict.fromkeys(freed for freed, _ in self._left.values()))
        self._left.clear()
        return taken
