"""The books' preemptions under way: each preemptor's nomination (its node, the victims it
waits for, the claims their going releases, until when it holds), the pods marked as
victims, and the nominations that timed out until the runtime takes them.

A victim may be awaited by several nominations: the members of a PodGroup evicted whole
leave every node they ran on, and a preemptor on another of those nodes (a gang's next
member) may count on a member's room there without evicting anything more
(``awaited_on``). A victim stays marked while any nomination waits for it.
"""

from __future__ import annotations

from collections.abc import Iterable

from vgpu_operator.scheduling.books.entries import Nomination
from vgpu_operator.scheduling.pod_key import PodKey


class Nominations:
    """Nominations, marked victims and timed-out nominations (see the module docstring)."""

    def __init__(self) -> None:
        self._held: dict[PodKey, Nomination] = {}
        self._expired: list[tuple[PodKey, Nomination]] = []
        #: Victims of a preemption whose deletion has not been seen yet.
        self._preempted: set[PodKey] = set()

    def __contains__(self, key: PodKey) -> bool:
        return key in self._held

    def get(self, key: PodKey) -> Nomination | None:
        return self._held.get(key)

    def pop(self, key: PodKey) -> Nomination | None:
        return self._held.pop(key, None)

    def add(self, key: PodKey, nomination: Nomination) -> None:
        """Hold a preemptor's nomination; its victims may not be chosen again meanwhile."""
        self._held[key] = nomination
        self._preempted.update(nomination.victims)

    def cancel(self, key: PodKey) -> Nomination | None:
        """Give up the pod's nomination: its victims may be chosen again, but those another
        nomination still waits for."""
        nomination = self._held.pop(key, None)
        if nomination is not None:
            awaited = {v for n in self._held.values() for v in n.victims}
            self._preempted.difference_update(nomination.victims - awaited)
        return nomination

    def is_preempted(self, key: PodKey) -> bool:
        return key in self._preempted

    def unmark(self, keys: Iterable[PodKey]) -> None:
        self._preempted.difference_update(keys)

    def gone(self, key: PodKey) -> None:
        """The pod left: it is no one's victim and holds no nomination."""
        self._held.pop(key, None)
        self._preempted.discard(key)

    def awaited_on(self, node: str) -> frozenset[PodKey]:
        """The victims the nominations on ``node`` wait for (their room there is theirs)."""
        return frozenset(v for n in self._held.values() if n.node == node for v in n.victims)

    def expire(self, now: float) -> list[PodKey]:
        """The preemptors whose hold ran out, kept until ``take_expired``; the caller
        cancels them."""
        out: list[PodKey] = []
        for key, nomination in list(self._held.items()):
            if nomination.until < now:
                self._expired.append((key, nomination))
                out.append(key)
        return out

    def take_expired(self) -> list[tuple[PodKey, Nomination]]:
        taken, self._expired = self._expired, []
        return taken
