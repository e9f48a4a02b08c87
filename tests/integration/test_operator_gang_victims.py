"""Members of PodGroups as preemption victims, against a real API server (issue 36): a
member of a ``disruptionMode: single`` group may be evicted alone; a member of an ``all``
group is not (evicting a whole group is not built: "not at all")."""

from __future__ import annotations

from typing import Any

from integration import operator_env as env
from integration.test_operator_preemption import Setup, operator, setup  # noqa: F401

from vgpu_operator.handlers.runtime import OperatorThread
from vgpu_operator.scheduling.gangs import gangs


def _group(s: Setup, name: str, mode: str = "single", priority_class: str = "") -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulingPolicy": {"gang": {"minCount": 1}},
        "disruptionMode": {mode: {}},
    }
    if priority_class:
        spec["priorityClassName"] = priority_class
    made: dict[str, Any] = s.cp.create(
        f"/apis/{gangs.API_VERSION}/namespaces/{s.namespace}/podgroups",
        {
            "apiVersion": gangs.API_VERSION,
            "kind": "PodGroup",
            "metadata": {"name": name},
            "spec": spec,
        },
    )
    return made


def _member(s: Setup, name: str, group: str) -> dict[str, Any]:
    pod = env.gpu_pod(s.namespace, name, scheduler=s.scheduler, group=s.namespace, gpumem=20000)
    pod["spec"]["priorityClassName"] = s.classes[0]
    pod["spec"]["schedulingGroup"] = {"podGroupName": group}
    return pod


def test_only_the_single_groups_member_is_evicted(setup: Setup, operator: OperatorThread) -> None:  # noqa: F811
    s = setup
    env.gpu_node(s.cp, s.node("a"), env.cards(s.node("a"), 1, memory_mib=40000), group=s.namespace)
    _group(s, "whole", "all")
    _group(s, "loose", "single")
    env.create_pod(s.cp, _member(s, "w0", "whole"))
    env.create_pod(s.cp, _member(s, "l0", "loose"))
    env.wait_bound(s.cp, s.namespace, "w0")
    env.wait_bound(s.cp, s.namespace, "l0")
    # The card is full; an urgent pod may take only the single group's member's room.
    s.create("urgent", 1000, gpumem=20000)
    env.wait_until("l0 to be evicted", lambda: not s.exists("l0"), 60)
    env.wait_bound(s.cp, s.namespace, "urgent")
    assert s.get("w0")["spec"]["nodeName"] == s.node("a")
    assert not s.get("w0")["metadata"].get("deletionTimestamp")


def test_a_pod_group_naming_a_class_its_namespace_may_not_use_preempts_nobody(
    setup: Setup,  # noqa: F811
    operator: OperatorThread,  # noqa: F811
) -> None:
    """Issue 44 item 2 on the annotation dialect: the namespace may run no pod of the top
    class, a PodGroup naming it is admitted all the same, and its priority-0 member
    preempts nobody (members preempt with the lower of the group's and their own
    priority). A member whose own class is the top one preempts, once the quota allows it."""
    s = setup
    top = s.classes[1000]
    env.gpu_node(s.cp, s.node("a"), env.cards(s.node("a"), 1, memory_mib=40000), group=s.namespace)
    s.running("batch", 0, gpumem=30000)
    env.no_pods_of_class(s.cp, s.namespace, "no-top", top)
    assert _group(s, "lifted", priority_class=top)["spec"]["priority"] == 1000
    env.create_pod(s.cp, _member(s, "m0", "lifted"))  # class p0, 20000 MiB: no room

    def told() -> str | None:
        condition = env.condition(s.get("m0")) or {}
        return condition.get("message") if condition.get("status") == "False" else None

    message = env.wait_until("m0 to be told why it waits", told, 60)
    assert f"pod group {s.namespace}/lifted" in message
    assert "preempted" not in message
    assert not s.get("batch")["metadata"].get("deletionTimestamp")
    reasons = {e["reason"] for e in env.events_for(s.cp, s.namespace, "m0")}
    assert "Preempting" not in reasons
    # Without the quota, a member of the top class itself may preempt for its group.
    s.cp.delete(f"/api/v1/namespaces/{s.namespace}/resourcequotas/no-top")
    _group(s, "fair", priority_class=top)
    member = _member(s, "f0", "fair")
    member["spec"]["priorityClassName"] = top
    env.create_pod(s.cp, member)
    env.wait_until("batch to be evicted", lambda: not s.exists("batch"), 60)
    env.wait_bound(s.cp, s.namespace, "f0")
