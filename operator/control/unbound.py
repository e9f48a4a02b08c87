"""The unbound live pods the feed keeps, indexed by the PodGroup each names; and the bound
live members of each group.

A gang's decision needs its members, and a PodGroup's change wakes its members: both are
found here by group, in time proportional to the group's members, not by a walk over every
waiting pod. Without the index a tenant with many waiting groups (500 groups of 8: 4,000
pods) made each group decision walk all of them, once per decision and once per PodGroup
event. The index changes only where a pod enters, changes or leaves the map, so it is the
map's own bookkeeping and cannot drift from it.

``BoundMembers`` keeps, per group, the members the API says are bound (and live): after a
restart the runtime has placed no member itself, and these are what count toward the
group's ``minCount``, as the members it placed did before (``gang_runtime``).
"""

from __future__ import annotations

from collections.abc import ItemsView, Iterator, Mapping, ValuesView

from vgpu_operator.control import pod_facts
from vgpu_operator.scheduling.gangs.gangs import group_of
from vgpu_operator.scheduling.pod_key import PodKey
from vgpu_operator.wire import Pod


class UnboundPods:
    """``PodKey -> (pod, fingerprint)``, with the keys of each group's members."""

    def __init__(self) -> None:
        self._pods: dict[PodKey, tuple[Pod, str]] = {}
        self._groups: dict[PodKey, str] = {}
        self._members: dict[str, dict[PodKey, None]] = {}

    def get(self, key: PodKey) -> tuple[Pod, str] | None:
        return self._pods.get(key)

    def __setitem__(self, key: PodKey, entry: tuple[Pod, str]) -> None:
        self._pods[key] = entry
        group = group_of(entry[0])
        if self._groups.get(key) != group:
            self._leave(key)
            if group is not None:
                self._groups[key] = group
                self._members.setdefault(group, {})[key] = None

    def pop(self, key: PodKey, default: None = None) -> tuple[Pod, str] | None:
        self._leave(key)
        return self._pods.pop(key, default)

    def _leave(self, key: PodKey) -> None:
        group = self._groups.pop(key, None)
        if group is None:
            return
        members = self._members.get(group)
        if members is not None:
            members.pop(key, None)
            if not members:
                del self._members[group]

    def __contains__(self, key: object) -> bool:
        return key in self._pods

    def __len__(self) -> int:
        return len(self._pods)

    def __iter__(self) -> Iterator[PodKey]:
        return iter(self._pods)

    def values(self) -> ValuesView[tuple[Pod, str]]:
        return self._pods.values()

    def items(self) -> ItemsView[PodKey, tuple[Pod, str]]:
        return self._pods.items()

    def members(self, group: str) -> list[Pod]:
        """The unbound pods that name ``group`` (``namespace/name``), whichever scheduler
        they name, in the order they arrived."""
        keys = self._members.get(group)
        if not keys:
            return []
        return [self._pods[key][0] for key in keys]


class BoundMembers:
    """Per group, its bound live members: ``PodKey -> (node, schedulerName)``."""

    def __init__(self) -> None:
        self._groups: dict[PodKey, str] = {}
        self._members: dict[str, dict[PodKey, tuple[str, str]]] = {}

    def note(self, key: PodKey, pod: Pod) -> None:
        """The pod's latest copy: in the index while it is a live member bound to a node."""
        self.discard(key)
        group = group_of(pod)
        node = pod_facts.node_name_of(pod)
        if group is None or node is None:
            return
        if pod_facts.is_terminal(pod) or pod_facts.is_deleting(pod):
            return
        self._groups[key] = group
        self._members.setdefault(group, {})[key] = (node, pod_facts.scheduler_name_of(pod))

    def discard(self, key: PodKey) -> None:
        group = self._groups.pop(key, None)
        if group is None:
            return
        members = self._members[group]
        members.pop(key, None)
        if not members:
            del self._members[group]

    def of(self, group: str, scheduler: str) -> Mapping[PodKey, str]:
        """The group's bound live members that name ``scheduler``, and their nodes."""
        members = self._members.get(group) or {}
        return {key: node for key, (node, name) in members.items() if name == scheduler}
