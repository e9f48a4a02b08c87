"""``simulate``'s gangs: a scenario's ``podGroups`` (PodGroup objects as the API serves them,
``scheduling.k8s.io/v1beta1``) and the pods that name one in ``spec.schedulingGroup``.

When the simulation reaches the first pending member of a group, the group is decided as
the operator decides it (``scheduling.gangs.gangs.decide_group``): every pending member of the
scenario together, the running members counted toward ``minCount``. Each member's
decision is reported where the first member stood, as for any pod, with ``podGroup``; the
group's own outcome goes to the output's ``podGroups``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from vgpu_operator import simulation_dra
from vgpu_operator.errors import ScenarioError
from vgpu_operator.scheduling.cycle.cluster import ClusterState, Decision
from vgpu_operator.scheduling.gangs import gangs
from vgpu_operator.scheduling.gangs.gangs import GroupDecision, GroupError, GroupSpec
from vgpu_operator.scheduling.pod_key import pod_key
from vgpu_operator.wire import Pod


def check(scenario: Mapping[str, Any]) -> None:
    """``podGroups`` must be a list of mappings with a name (``ScenarioError`` names it)."""
    groups = scenario.get("podGroups")
    if groups is None:
        return
    if not isinstance(groups, list):
        raise ScenarioError("podGroups", "must be a list")
    for position, obj in enumerate(groups):
        meta = obj.get("metadata") if isinstance(obj, Mapping) else None
        if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str):
            raise ScenarioError(f"podGroups[{position}].metadata.name", "a PodGroup needs a name")


def load(scenario: Mapping[str, Any], state: ClusterState) -> None:
    """How preemption weighs the groups' members (``group_victims``: one by one for
    ``disruptionMode: single`` or none named, the API server's default, else the whole
    group; their class's priority); and the groups' own claims (``group_claims``: a claim the
    scenario holds, named by ``resourceClaimName``, is reserved for the group)."""
    for obj in scenario.get("podGroups") or []:
        meta = obj.get("metadata") or {}
        spec = obj.get("spec")
        if not isinstance(spec, Mapping):
            continue  # refused with a reason when its members are decided
        key = f"{meta.get('namespace') or 'default'}/{meta.get('name')}"
        if "disruptionMode" not in spec:
            # The API server's default, which a written scenario may leave out.
            obj = {**obj, "spec": {**spec, "disruptionMode": {"single": {}}}}
        state.books.note_pod_group(key, obj)


def _specs(scenario: Mapping[str, Any]) -> dict[str, GroupSpec | str]:
    out: dict[str, GroupSpec | str] = {}
    for obj in scenario.get("podGroups") or []:
        meta = obj.get("metadata") or {}
        key = f"{meta.get('namespace') or 'default'}/{meta.get('name')}"
        try:
            out[key] = gangs.read_pod_group(obj)
        except GroupError as exc:
            out[key] = str(exc)
    return out


def decide(
    scenario: Mapping[str, Any], state: ClusterState, group: str, now: float
) -> tuple[GroupDecision, list[tuple[Pod, Decision]]]:
    """The group decided; its members' decisions (placed ones confirmed, their claims
    written), each with the pod it is for."""
    pods = scenario.get("pods") or []
    members = [p for p in pods if gangs.group_of(p) == group]
    ours = state.config.scheduler.scheduler_name
    names = [str((p.get("spec") or {}).get("schedulerName") or ours) for p in members]
    bound = {
        pod_key(p): str(p["spec"]["nodeName"])
        for p in members
        if (p.get("spec") or {}).get("nodeName")
    }
    pending = [
        simulation_dra.with_template_claims(scenario, p, state)
        for p in members
        if not (p.get("spec") or {}).get("nodeName")
    ]
    spec = _specs(scenario).get(group)
    if isinstance(spec, str):
        out = gangs.refuse(state, group, pending, spec)
    else:
        out = gangs.decide_group(state, spec, group, pending, bound, now, names)
    by_key = {pod_key(p): p for p in pending}
    decided: list[tuple[Pod, Decision]] = []
    for decision in out.placed:
        simulation_dra.write_claims(decision, state)
        state.confirm(decision.pod)
    for decision in (*out.placed, *out.waiting):
        decided.append((by_key[decision.pod], decision))
    order = {pod_key(p): i for i, p in enumerate(pending)}
    decided.sort(key=lambda pair: order[pod_key(pair[0])])
    return out, decided


def render(out: GroupDecision, members: Sequence[tuple[Pod, Decision]]) -> Any:
    """The group's outcome in ``simulate``'s output."""
    group: dict[str, Any] = {
        "podGroup": out.group,
        "scheduled": out.reason is None and bool(out.placed),
        "placed": sorted(d.pod for d in out.placed),
        "waiting": sorted(d.pod for _, d in members if not d.scheduled),
    }
    if out.domain is not None:
        group["domain"] = out.domain
    if out.reason is not None:
        group["reason"] = out.reason
    return group
