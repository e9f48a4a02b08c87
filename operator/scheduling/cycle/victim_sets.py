"""Who preemption may weigh on a node, and the victim sets they form (both dialects).

A pod alone is a victim set of one. A member of a PodGroup that may be disrupted only
whole (``books.group_victims``: ``disruptionMode: all``, or a PodGroup not read) is one
set with every other member the books hold, on whatever node: removing one removes all,
the room its members free on other nodes is no use to the preemptor there but they go
too, and every member counts as a victim when candidates are ranked (``preemption``).

Not weighed: a pod being deleted (it leaves anyway), a reservation (a decision in flight),
a victim of a preemption under way; and a whole group any member of which is one of those
but deleting (a member being placed or already chosen: the group is not evicted in part).

``Occupancy`` is one search's view: per node its occupants, per whole group its members
(read once per search). A whole group whose priority is not below the preemptor's but
which holds a member of lower priority (alone, that member would have been a victim) is
noted in ``shielded``; with ``lift`` it is weighed as if it were just below: the search
that finds no candidate otherwise asks whether evicting such a group would make room, to
tell the preemptor why it waits (``preempting.choose``).

``spare``: on a node, the pods already leaving for a preemption elsewhere (members of a
group evicted whole) whose room nobody counts on yet: a preemptor there counts on it at no
cost (a gang's next member, typically).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from vgpu_operator.scheduling.books.entries import NodeEntry, PodEntry
from vgpu_operator.scheduling.books.view import BooksView
from vgpu_operator.scheduling.pod_key import PodKey
from vgpu_operator.scheduling.preemption import preemption

Occupant = preemption.Occupant


class Occupancy:
    """One search's occupants and whole groups (see the module docstring)."""

    def __init__(self, view: BooksView, priority: int, lift: bool = False) -> None:
        self._view = view
        self._priority = priority
        self._lift = lift
        #: Per whole group seen, its members (None: not evictable now).
        self._whole: dict[str, tuple[Occupant, ...] | None] = {}
        #: Whole groups not of lower priority than the preemptor, with their priority.
        self.shielded: dict[str, int] = {}
        #: The nodes where such a group has a member.
        self.shielded_nodes: set[str] = set()

    @property
    def whole(self) -> Mapping[str, Sequence[Occupant]]:
        """Per whole group met so far and evictable, its members."""
        return {g: m for g, m in self._whole.items() if m is not None}

    def on(self, node: NodeEntry) -> list[Occupant]:
        """The pods on ``node`` preemption may weigh, in key order."""
        view = self._view
        out: list[Occupant] = []
        for key in sorted(node.pods):
            entry = view.pods.get(key)
            if entry is None or not self._weighed(entry):
                continue
            group = entry.group if view.groups.whole(entry) else None
            if group is None:
                priority = view.groups.priority(entry)
                out.append(Occupant(key, priority, entry.started, entry.labels))
                continue
            members = self.members(group)
            if members is None:
                continue
            member = next((m for m in members if m.key == key), None)
            if member is None:
                continue  # not in the group's index (cannot be: kept by the books)
            if group in self.shielded:
                self.shielded_nodes.add(node.name)
            out.append(member)
        return out

    def members(self, group: str) -> tuple[Occupant, ...] | None:
        """Every member of a whole group as a victim (None: not evictable now)."""
        if group in self._whole:
            return self._whole[group]
        view = self._view
        entries = [view.pods[k] for k in sorted(view.groups.members(group)) if k in view.pods]
        found: tuple[Occupant, ...] | None = None
        if all(e.deleting or self._weighed(e) for e in entries):
            live = [e for e in entries if not e.deleting]
            priorities = [view.groups.priority(e) for e in live]
            top = max(priorities, default=0)
            if top >= self._priority > min(priorities, default=top):
                self.shielded[group] = top
                if self._lift:
                    priorities = [self._priority - 1] * len(live)
            found = tuple(
                Occupant(e.key, p, e.started, e.labels, group)
                for e, p in zip(live, priorities, strict=True)
            )
        self._whole[group] = found
        return found

    def spare(self, node: NodeEntry) -> frozenset[PodKey]:
        """The pods of ``node`` already leaving as victims of a preemption for another
        node (a whole group's members there), whose room no nomination on ``node`` counts
        on: a preemptor here may count on it without evicting anything more, and waits for
        them (``nominations``)."""
        view = self._view
        leaving = [k for k in node.pods if view.is_preempted(k)]
        if not leaving:
            return frozenset()
        awaited = view.awaited_on(node.name)
        return frozenset(k for k in leaving if k not in awaited)

    def _weighed(self, entry: PodEntry) -> bool:
        return not entry.deleting and not entry.reserved and not self._view.is_preempted(entry.key)

    def unit_priority(self, pod: Occupant) -> int:
        """The priority of the victim set the occupant is in: a whole group's is its most
        important member's."""
        if pod.group is None:
            return pod.priority
        members = self._whole.get(pod.group) or (pod,)
        return max(m.priority for m in members)

    def freeable(self, weighed: Sequence[Occupant]) -> dict[PodKey, int]:
        """The occupants that may be victims, each with its victim set's priority."""
        out: dict[PodKey, int] = {}
        for pod in weighed:
            top = self.unit_priority(pod)
            if top < self._priority:
                out[pod.key] = top
        return out

    def lower_sets(self, weighed: Sequence[Occupant]) -> frozenset[PodKey]:
        """Every pod of the victim sets of lower priority that ``weighed`` are in (the
        members of a whole group on other nodes too)."""
        keys: set[PodKey] = set()
        for pod in weighed:
            if self.unit_priority(pod) >= self._priority:
                continue
            if pod.group is None:
                keys.add(pod.key)
            else:
                keys.update(m.key for m in self._whole.get(pod.group) or (pod,))
        return frozenset(keys)
