"""Members of PodGroups as preemption victims, against a real API server (issues 36, 44,
47): a member of a ``disruptionMode: single`` group may be evicted alone; an ``all`` group
is evicted whole (every member, on every node) or not at all, and shields no card."""

from __future__ import annotations

from typing import Any

from integration import operator_env as env
from integration.test_operator_preemption import (  # noqa: F401
    PRIORITY_CLASSES,
    Setup,
    operator,
    setup,
)

from vgpu_operator.handlers.runtime import OperatorThread
from vgpu_operator.scheduling.gangs import gangs


def _group(
    s: Setup, name: str, mode: str = "single", priority_class: str = "", min_count: int = 1
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulingPolicy": {"gang": {"minCount": min_count}},
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


def _member(s: Setup, name: str, group: str, gpumem: int = 20000) -> dict[str, Any]:
    pod = env.gpu_pod(s.namespace, name, scheduler=s.scheduler, group=s.namespace, gpumem=gpumem)
    pod["spec"]["priorityClassName"] = s.classes[0]
    pod["spec"]["schedulingGroup"] = {"podGroupName": group}
    return pod


def test_a_single_groups_member_goes_rather_than_a_whole_group(
    setup: Setup,  # noqa: F811
    operator: OperatorThread,  # noqa: F811
) -> None:
    """The card is full with an ``all`` group of two and a ``single`` group's member, all
    of one priority: the urgent pod takes one member's room, and the cheapest choice is
    the single group's member alone (one victim), not the whole group (two)."""
    s = setup
    env.gpu_node(s.cp, s.node("a"), env.cards(s.node("a"), 1, memory_mib=60000), group=s.namespace)
    _group(s, "whole", "all", min_count=2)
    _group(s, "loose", "single")
    for name, group in (("w0", "whole"), ("w1", "whole"), ("l0", "loose")):
        env.create_pod(s.cp, _member(s, name, group))
    for name in ("w0", "w1", "l0"):
        env.wait_bound(s.cp, s.namespace, name)
    s.create("urgent", 1000, gpumem=20000)
    env.wait_until("l0 to be evicted", lambda: not s.exists("l0"), 60)
    env.wait_bound(s.cp, s.namespace, "urgent")
    for name in ("w0", "w1"):
        assert s.get(name)["spec"]["nodeName"] == s.node("a")
        assert not s.get(name)["metadata"].get("deletionTimestamp")


def test_an_urgent_pod_evicts_an_all_group_whole_and_binds(
    setup: Setup,  # noqa: F811
    operator: OperatorThread,  # noqa: F811
) -> None:
    """Issue 47 item 1 / issue 44 item 3: two priority-0 members of an ``all`` gang, one
    on each node, fill both cards; a priority-100000 pod that needs one card's room
    evicts the group whole (the member on the other node too), binds, and both sides are
    told by Events."""
    s = setup
    top = f"{s.namespace}-p100000"
    s.cp.create(
        PRIORITY_CLASSES,
        {"apiVersion": "scheduling.k8s.io/v1", "metadata": {"name": top}, "value": 100000},
    )
    try:
        for suffix in ("a", "b"):
            cards = env.cards(s.node(suffix), 1, memory_mib=40000)
            env.gpu_node(s.cp, s.node(suffix), cards, group=s.namespace)
        _group(s, "whole", "all", min_count=2)
        for name in ("w0", "w1"):
            env.create_pod(s.cp, _member(s, name, "whole", gpumem=30000))
        nodes = {env.wait_bound(s.cp, s.namespace, n)["spec"]["nodeName"] for n in ("w0", "w1")}
        assert nodes == {s.node("a"), s.node("b")}
        urgent = env.gpu_pod(
            s.namespace, "urgent", scheduler=s.scheduler, group=s.namespace, gpumem=30000
        )
        urgent["spec"]["priorityClassName"] = top
        env.create_pod(s.cp, urgent)
        for name in ("w0", "w1"):
            env.wait_until(f"{name} to be evicted", lambda n=name: not s.exists(n), 60)
        bound = env.wait_bound(s.cp, s.namespace, "urgent", 60)
        assert bound["spec"]["nodeName"] in nodes

        def reasons(name: str) -> set[str]:
            return {e["reason"] for e in env.events_for(s.cp, s.namespace, name)}

        env.wait_until("the Events", lambda: "Preempting" in reasons("urgent"), 30)
        for name in ("w0", "w1"):
            env.wait_until(f"{name}'s Event", lambda n=name: "Preempted" in reasons(n), 30)
        preempting = [
            e for e in env.events_for(s.cp, s.namespace, "urgent") if e["reason"] == "Preempting"
        ]
        assert preempting[0]["message"].startswith("Preempting 2 pods on node ")
    finally:
        s.cp.delete(f"{PRIORITY_CLASSES}/{top}")


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
