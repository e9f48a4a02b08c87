"""Members of an upstream PodGroup as preemption victims: one by one, or the whole group.

A PodGroup's ``spec.disruptionMode`` says how its members may be disrupted: ``single``,
one by one as any pod; ``all``, the whole group or none. Preemption (``cycle.preempting``,
both dialects) takes a member of a ``single`` group alone, and a member of any other group
only with every other member the books hold, on whatever node (``whole``): the group is
one victim set. A group whose PodGroup the operator has not read (absent, deleted after
its members were bound, a mode not understood) is evicted whole too: whole is allowed by
either mode, so a tenant cannot shield pods by naming a group that does not exist.

The priority a member is weighed with as a victim is the one the engine gives a member
everywhere (queue order, preemption by the group): the lower of its own resolved priority
and its PodGroup's, when the PodGroup names a class (``member_priority``). A PodGroup can
lift nobody (the API server resolves a PodGroup's priority from any class it names, and no
quota counts PodGroups), so naming a high class shields no card; and lowering it makes the
group only easier to evict. A whole group weighs as its most important member.

The books keep the rules of every PodGroup read (``PodGroups.note``, from the PodGroup
store and ``simulate``) and, per group, the members they hold (bound or reserved), kept
current as pods come and go, so that a victim search finds a group's other members
without a scan of every pod.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol

from vgpu_operator.scheduling.books import group_claims
from vgpu_operator.scheduling.books.entries import PodEntry
from vgpu_operator.scheduling.books.group_claims import GroupClaims
from vgpu_operator.scheduling.pod_key import PodKey
from vgpu_operator.wire import Pod, PodGroup


def group_key(pod: Pod) -> str | None:
    """The ``namespace/name`` of the PodGroup the pod names, or None."""
    group = (pod.get("spec") or {}).get("schedulingGroup")
    name = group.get("podGroupName") if isinstance(group, Mapping) else None
    if not isinstance(name, str) or not name:
        return None
    return f"{(pod.get('metadata') or {}).get('namespace') or 'default'}/{name}"


def disrupted_one_by_one(pod_group: PodGroup) -> bool:
    """Whether the PodGroup lets its members be disrupted one by one: ``disruptionMode``
    ``single``. Anything else (``all``, a value not understood) keeps them together."""
    spec = pod_group.get("spec")
    mode = spec.get("disruptionMode") if isinstance(spec, Mapping) else None
    return isinstance(mode, Mapping) and "single" in mode and "all" not in mode


def class_priority(pod_group: PodGroup) -> int | None:
    """The ``priority`` of a PodGroup that names a ``priorityClassName``, or None. The API
    server resolves ``priority`` even for a PodGroup that names no class (the default,
    0): only a PodGroup that names a class bears on its members, and then only to lower
    their priority (``member_priority``)."""
    spec = pod_group.get("spec")
    if not isinstance(spec, Mapping) or not spec.get("priorityClassName"):
        return None
    priority = spec.get("priority")
    return priority if isinstance(priority, int) and not isinstance(priority, bool) else None


def member_priority(own: int, group_priority: int | None) -> int:
    """The priority a member is queued, preempts and is weighed as a victim with: the
    lower of its own resolved priority and its PodGroup's (see the module docstring)."""
    return own if group_priority is None else min(own, group_priority)


@dataclass(frozen=True, slots=True)
class GroupRule:
    """What the books read of one PodGroup for its members as victims."""

    #: ``disruptionMode: single``: its members are victims one by one.
    one_by_one: bool
    #: The priority of its class, if it names one (``class_priority``).
    priority: int | None
    #: The node label of its topology constraint (its members share one value of it);
    #: None: no constraint. ``""``: a constraint not understood (its members stay put).
    domain_key: str | None = None


def rule_of(pod_group: PodGroup) -> GroupRule:
    return GroupRule(
        disrupted_one_by_one(pod_group), class_priority(pod_group), domain_key(pod_group)
    )


def domain_key(pod_group: PodGroup) -> str | None:
    """The node label of the PodGroup's topology constraint, None when it names none, and
    ``""`` when it names one this reader does not understand (several, or no key): the
    group's decision refuses such a PodGroup with a reason (``gangs.read_pod_group``);
    here it only keeps defragmentation from moving a member out of its domain."""
    spec = pod_group.get("spec")
    constraints = spec.get("schedulingConstraints") if isinstance(spec, Mapping) else None
    topology = constraints.get("topology") if isinstance(constraints, Mapping) else None
    if not topology:
        return None
    first = topology[0] if isinstance(topology, list) and len(topology) == 1 else None
    key = first.get("key") if isinstance(first, Mapping) else None
    return key if isinstance(key, str) else ""


class GroupReads(Protocol):
    """What readers (``view.BooksView.groups``) see of the books' PodGroups."""

    @property
    def claims(self) -> Mapping[str, GroupClaims]: ...
    @property
    def single(self) -> Collection[str]: ...
    def rule(self, key: str) -> GroupRule | None: ...
    def members(self, key: str) -> Collection[PodKey]: ...
    def whole(self, entry: PodEntry) -> bool: ...
    def priority(self, entry: PodEntry) -> int: ...


class PodGroups:
    """The books' PodGroups: their rules, their own claims (``group_claims``), and the
    members the books hold per group. Written by the books only (``Books.note_pod_group``,
    ``add_pod``, ``drop_pod``); readers get it as ``GroupReads``."""

    def __init__(self) -> None:
        self._rules: dict[str, GroupRule] = {}
        self._members: dict[str, set[PodKey]] = {}
        self._claims: dict[str, GroupClaims] = {}
        #: The PodGroups that name claims of their own, by namespace/name (read-only).
        self.claims: Mapping[str, GroupClaims] = MappingProxyType(self._claims)

    # --- the PodGroups (the store's and simulate's writes, through the books) -----------
    def note(self, key: str, pod_group: PodGroup | None) -> None:
        """The PodGroup ``key`` as read now (None: it is gone)."""
        shared = None if pod_group is None else group_claims.read(pod_group)
        if pod_group is None:
            self._rules.pop(key, None)
        else:
            self._rules[key] = rule_of(pod_group)
        if shared is None:
            self._claims.pop(key, None)
        else:
            self._claims[key] = shared

    def rule(self, key: str) -> GroupRule | None:
        return self._rules.get(key)

    @property
    def single(self) -> Collection[str]:
        """The groups whose members go one by one."""
        return {k for k, r in self._rules.items() if r.one_by_one}

    # --- the members the books hold (the books' writes) ---------------------------------
    def joined(self, entry: PodEntry) -> None:
        if entry.group is not None:
            self._members.setdefault(entry.group, set()).add(entry.key)

    def left(self, entry: PodEntry) -> None:
        if entry.group is None:
            return
        members = self._members.get(entry.group)
        if members is not None:
            members.discard(entry.key)
            if not members:
                del self._members[entry.group]

    def members(self, key: str) -> Collection[PodKey]:
        """The group's members the books hold (bound or reserved), on any node."""
        return self._members.get(key, ())

    # --- as preemption reads them ---------------------------------------------------------
    def whole(self, entry: PodEntry) -> bool:
        """Whether the member is a victim only with its whole group (module docstring)."""
        if entry.group is None:
            return False
        rule = self._rules.get(entry.group)
        return rule is None or not rule.one_by_one

    def priority(self, entry: PodEntry) -> int:
        """The member's priority as a victim (``member_priority``)."""
        rule = None if entry.group is None else self._rules.get(entry.group)
        return member_priority(entry.priority, None if rule is None else rule.priority)


class ReadGroups:
    """The books' PodGroups as readers get them (``GroupReads``): the reads only, so a
    write through the view fails at run time as ``mypy`` refuses it."""

    __slots__ = ("_groups",)

    def __init__(self, groups: PodGroups) -> None:
        self._groups = groups

    @property
    def claims(self) -> Mapping[str, GroupClaims]:
        return self._groups.claims

    @property
    def single(self) -> Collection[str]:
        return self._groups.single

    def rule(self, key: str) -> GroupRule | None:
        return self._groups.rule(key)

    def members(self, key: str) -> Collection[PodKey]:
        return self._groups.members(key)

    def whole(self, entry: PodEntry) -> bool:
        return self._groups.whole(entry)

    def priority(self, entry: PodEntry) -> int:
        return self._groups.priority(entry)
