"""Which members of an upstream PodGroup preemption may take one by one.

A PodGroup's ``spec.disruptionMode`` says how its members may be disrupted: ``single``,
one by one as any pod; ``all``, the whole group or none. Evicting a whole group is not built
yet (``docs/gangs.md``), so a member of an ``all`` group, or of a group whose PodGroup the
operator has not read (absent, not yet listed), is never a victim: "none" is always allowed.
The PodGroup store keeps ``Books.single_groups`` (the groups read as ``single``); both
dialects' victim search (``cycle.preempting``) asks ``protected``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from vgpu_operator.scheduling.books.entries import PodEntry


def group_key(pod: Mapping[str, Any]) -> str | None:
    """The ``namespace/name`` of the PodGroup the pod names, or None."""
    group = (pod.get("spec") or {}).get("schedulingGroup")
    name = group.get("podGroupName") if isinstance(group, Mapping) else None
    if not isinstance(name, str) or not name:
        return None
    return f"{(pod.get('metadata') or {}).get('namespace') or 'default'}/{name}"


def disrupted_one_by_one(pod_group: Mapping[str, Any]) -> bool:
    """Whether the PodGroup lets its members be disrupted one by one: ``disruptionMode``
    ``single``. Anything else (``all``, a value not understood) keeps them together."""
    spec = pod_group.get("spec")
    mode = spec.get("disruptionMode") if isinstance(spec, Mapping) else None
    return isinstance(mode, Mapping) and "single" in mode and "all" not in mode


def protected(entry: PodEntry, single_groups: Collection[str]) -> bool:
    """A group member preemption may not take alone."""
    return entry.in_group and entry.group not in single_groups
