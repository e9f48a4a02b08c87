"""Gangs in the runtime: the PodGroups the operator watches, and one decision per group.

``PodGroupStore`` is the watch loop's handler for PodGroups (``kube/pod_groups.py``): it
keeps each group's latest copy and wakes the group's waiting members when it changes (a
``minCount`` lowered, a PodGroup that was missing created). ``GangRuntime`` gathers a
group's members when the worker pops one of them: the pending ones of this scheduler,
those already bound or being bound, and every member's ``schedulerName``; then the engine
decides the group as one unit (``scheduling.gangs.gangs.decide_group``). The worker takes the
other members out of the queue with the one it popped, so a group costs one decision per
attempt, binds those placed, and parks the rest together under one hint.

The members bound or being bound are those this runtime placed and the books still hold;
after a restart it has placed none, so a group whose PodGroup already says
``PodGroupInitiallyScheduled=True`` (terminal upstream) places its later members one by
one instead of waiting for ``minCount`` again.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, cast

import structlog

from vgpu_operator.control import pod_facts
from vgpu_operator.scheduling.books.group_victims import GroupReads, PodGroups
from vgpu_operator.scheduling.cycle.cluster import ClusterState
from vgpu_operator.scheduling.gangs import gang_preemption, gangs
from vgpu_operator.scheduling.gangs.gangs import GroupDecision, GroupError, GroupSpec
from vgpu_operator.scheduling.pod_key import PodKey, pod_key
from vgpu_operator.timestamps import format_rfc3339
from vgpu_operator.wire import KubeObject, Pod, PodGroup, WatchEventType

log = structlog.get_logger("vgpu_operator.gangs")

#: Why a gang's member waits, in the queue's census.
WAIT_REASON = "PodGroupUnschedulable"


class GroupNotes(Protocol):
    """The books' writer of PodGroups (``Books.note_pod_group``) and what it keeps."""

    @property
    def groups(self) -> GroupReads: ...
    def note_pod_group(self, key: str, pod_group: PodGroup | None) -> None: ...


class _OwnGroups:
    """A store's own PodGroups when no books are given (a store on its own)."""

    def __init__(self) -> None:
        self.groups = PodGroups()

    def note_pod_group(self, key: str, pod_group: PodGroup | None) -> None:
        self.groups.note(key, pod_group)


class PodGroupStore:
    """The latest copy of every PodGroup (a ``watch_loop.KindHandler``)."""

    def __init__(
        self,
        on_change: Callable[[str], None] = lambda _: None,
        books: GroupNotes | None = None,
    ) -> None:
        self._groups: dict[str, KubeObject] = {}
        self._on_change = on_change
        #: The books, told of each PodGroup as it comes and changes (their rules weigh
        #: members as victims and queue them, ``group_victims``; their own claims,
        #: ``group_claims``): a write through the books' writer, never into their parts.
        self._books: GroupNotes = books if books is not None else _OwnGroups()
        self.rules = self._books.groups

    def _note(self, key: str, seen: KubeObject | None) -> None:
        self._books.note_pod_group(key, cast(PodGroup | None, seen))  # the PodGroups' watch

    def queue_priority(self, pod: Pod) -> int:
        """The priority the pod is queued with: its own, or its PodGroup's where that is
        lower (a group may slow its members, never lift them)."""
        own = pod_facts.priority_of(pod)
        group = gangs.group_of(pod)
        rule = None if group is None else self.rules.rule(group)
        return gang_preemption.member_priority(own, None if rule is None else rule.priority)

    @staticmethod
    def key_of(obj: Mapping[str, Any]) -> str:
        meta = obj.get("metadata") or {}
        return f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}"

    async def listed(self, items: Sequence[KubeObject], version: str | None) -> None:
        fresh = {self.key_of(obj): obj for obj in items}
        keys = fresh.keys() | self._groups.keys()
        changed = {k for k in keys if fresh.get(k) != self._groups.get(k)}
        self._groups = fresh
        for key in sorted(changed):
            self._note(key, fresh.get(key))
            self._on_change(key)

    async def event(self, event_type: WatchEventType, obj: KubeObject) -> None:
        key = self.key_of(obj)
        if event_type == "DELETED":
            self._groups.pop(key, None)
        else:
            self._groups[key] = obj
        self._note(key, self._groups.get(key))
        self._on_change(key)

    def get(self, key: str) -> KubeObject | None:
        return self._groups.get(key)

    def initially_scheduled(self, key: str) -> bool:
        obj: Mapping[str, Any] = self._groups.get(key) or {}
        status = obj.get("status")
        conditions = status.get("conditions") if isinstance(status, Mapping) else None
        for condition in conditions if isinstance(conditions, list) else ():
            if (
                isinstance(condition, Mapping)
                and condition.get("type") == gangs.INITIALLY_SCHEDULED
            ):
                return condition.get("status") == "True"
        return False


class GangRuntime:
    """One group's members gathered and decided (see the module docstring)."""

    def __init__(
        self,
        engine: ClusterState,
        group_members: Callable[[str], list[Pod]],
        scheduler_name: Callable[[], str],
        groups: PodGroupStore,
        bound_members: Callable[[str], Mapping[PodKey, str]] = lambda _: {},
    ) -> None:
        self.engine = engine
        #: A group's unbound members, any scheduler (the feed's index by group).
        self._group_members = group_members
        #: A group's members the API says are bound to a node (ours, live).
        self._bound_members = bound_members
        self._scheduler_name = scheduler_name
        self.groups = groups
        #: Per group, the members this runtime placed (bound or being bound), and where.
        self._placed: dict[str, dict[PodKey, str]] = {}
        #: Per group, the condition message last written (one write per change).
        self._written: dict[str, str] = {}

    @staticmethod
    def group_of(pod: Pod) -> str | None:
        return gangs.group_of(pod)

    def members(self, group: str) -> list[Pod]:
        """The group's pending members of this scheduler (not placed by us meanwhile)."""
        return self._gather(group)[0]

    def _gather(self, group: str) -> tuple[list[Pod], list[str]]:
        """In one pass over the group's unbound members (found by the feed's index, not
        by a walk over every waiting pod): the pending members of this scheduler not
        placed by us meanwhile, and every unbound member's schedulerName."""
        ours = self._scheduler_name()
        placed = self._bound(group)
        pending: list[Pod] = []
        names: list[str] = []
        for pod in self._group_members(group):
            name = pod_facts.scheduler_name_of(pod)
            names.append(name)
            if name == ours and pod_key(pod) not in placed:
                pending.append(pod)
        return pending, names

    def _bound(self, group: str) -> dict[PodKey, str]:
        """Members bound or being bound that the books hold: those placed here (a failed
        Binding's reservation is rolled back, so that member is pending again) and those
        the API says are bound. After a restart only the latter are known; they count
        toward ``minCount`` as the members placed here did before it."""
        books = self.engine.books.pods
        placed = self._placed.get(group, {})
        held = {k: n for k, n in placed.items() if k in books}
        if held:
            self._placed[group] = held
        else:
            self._placed.pop(group, None)
        bound = {k: n for k, n in self._bound_members(group).items() if k in books}
        return {**bound, **held}

    def group_input(
        self, group: str
    ) -> tuple[GroupSpec | None, list[Pod], dict[PodKey, str], list[str]]:
        """What a group is decided with: its spec (None: no PodGroup; ``GroupError`` when
        it cannot be read), its pending members, those placed here, every member's
        schedulerName (``decide``, and autoscaling's what-if)."""
        pending, names = self._gather(group)
        spec: GroupSpec | None = None
        obj = self.groups.get(group)
        if obj is not None:
            spec = gangs.read_pod_group(cast(PodGroup, obj))
            if spec.gang and self.groups.initially_scheduled(group):
                spec = dataclasses.replace(spec, gang=False)  # later members, one by one
        return spec, pending, self._bound(group), names

    def decide(self, group: str, now: float) -> GroupDecision:
        try:
            spec, pending, bound, names = self.group_input(group)
        except GroupError as exc:
            return gangs.refuse(self.engine, group, self._gather(group)[0], str(exc))
        out = gangs.decide_group(self.engine, spec, group, pending, bound, now, names)
        if out.placed:
            self._placed.setdefault(group, {}).update(out.nodes)
        return out

    def condition_to_write(
        self, out: GroupDecision, now: datetime.datetime
    ) -> dict[str, Any] | None:
        """The group's condition after an attempt, unless the same was written last."""
        condition = group_condition(out, now)
        if condition is None or self._written.get(out.group) == condition["message"]:
            return None
        self._written[out.group] = condition["message"]
        return condition


def group_condition(out: GroupDecision, now: datetime.datetime) -> dict[str, Any] | None:
    """The ``PodGroupInitiallyScheduled`` condition an attempt calls for (None: nothing to
    say, later members placed one by one)."""
    stamp = format_rfc3339(now)
    if out.reason is not None:
        reason = gangs.REASON_UNSCHEDULABLE
        return {
            "type": gangs.INITIALLY_SCHEDULED,
            "status": "False",
            "reason": reason,
            "message": out.reason,
            "lastTransitionTime": stamp,
        }
    if out.placed and out.needed > 0:
        message = f"{len(out.placed)} members placed together (minCount reached)"
        return {
            "type": gangs.INITIALLY_SCHEDULED,
            "status": "True",
            "reason": gangs.REASON_SCHEDULED,
            "message": message,
            "lastTransitionTime": stamp,
        }
    return None


def error_condition(message: str, now: datetime.datetime) -> dict[str, Any]:
    """``PodGroupInitiallyScheduled=False`` with reason ``SchedulerError``: the group's
    decision failed (an engine error, not a lack of room)."""
    return {
        "type": gangs.INITIALLY_SCHEDULED,
        "status": "False",
        "reason": gangs.REASON_SCHEDULER_ERROR,
        "message": message,
        "lastTransitionTime": format_rfc3339(now),
    }
