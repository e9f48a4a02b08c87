"""Members of PodGroups as preemption victims, against a real API server (issue 36): a
member of a ``disruptionMode: single`` group may be evicted alone; a member of an ``all``
group is not (evicting a whole group is not built: "not at all")."""

from __future__ import annotations

from typing import Any

from integration import operator_env as env
from integration.test_operator_preemption import Setup, operator, setup  # noqa: F401

from vgpu_operator.handlers.runtime import OperatorThread
from vgpu_operator.scheduling.gangs import gangs


def _group(s: Setup, name: str, mode: str) -> None:
    s.cp.create(
        f"/apis/{gangs.API_VERSION}/namespaces/{s.namespace}/podgroups",
        {
            "apiVersion": gangs.API_VERSION,
            "kind": "PodGroup",
            "metadata": {"name": name},
            "spec": {
                "schedulingPolicy": {"gang": {"minCount": 1}},
                "disruptionMode": {mode: {}},
            },
        },
    )


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
