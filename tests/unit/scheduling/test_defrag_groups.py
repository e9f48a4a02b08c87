"""Defragmentation and PodGroups (issue 47 item 2): a ``single`` group's member moves as
any pod, within its group's topology domain; an ``all`` group (or one whose PodGroup is
not read) is left alone whole, and the report says so."""

from __future__ import annotations

from typing import Any

from builders import cluster, make_node
from defrag_cases import running_pod, waiting_pod
from unit.scheduling.test_defrag import GIB, only_plan

from vgpu_operator.operator_cli import report_json, report_table
from vgpu_operator.scheduling.cycle.cluster import ClusterState
from vgpu_operator.scheduling.defrag import defrag


def _cluster(
    mode: str | None, zone_b: str = "x", topology: bool = False
) -> tuple[ClusterState, list[dict[str, Any]]]:
    """Node a (zone x): two 16 GiB cards with 10 and 8 GiB used; node b (zone ``zone_b``):
    one card with 10 GiB free. A 12 GiB pod waits: moving p8 (a member of ``train``, the
    cheapest move) or p10 to b makes room on a."""
    nodes = [
        make_node("a")
        .label("zone", "x")
        .gpu("GPU-a0", memory_mib=16 * GIB)
        .gpu("GPU-a1", memory_mib=16 * GIB),
        make_node("b").label("zone", zone_b).gpu("GPU-b0", memory_mib=16 * GIB),
    ]
    pods = [
        running_pod("p10", "a", "GPU-a0", 10 * GIB),
        running_pod("p8", "a", "GPU-a1", 8 * GIB),
        running_pod("q6", "b", "GPU-b0", 6 * GIB, priority=100),
    ]
    pods[1]["spec"]["schedulingGroup"] = {"podGroupName": "train"}
    state = cluster(*nodes)
    if mode is not None:
        spec: dict[str, Any] = {"disruptionMode": {mode: {}}}
        if topology:
            spec["schedulingConstraints"] = {"topology": [{"key": "zone"}]}
        state.books.note_pod_group("default/train", {"spec": spec})
    for pod in pods:
        state.set_pod(pod)
    return state, pods


def _moved(report: defrag.Report) -> list[str]:
    return [m.pod for m in only_plan(report).moves]


def test_a_single_groups_member_moves_as_any_pod() -> None:
    state, pods = _cluster("single")
    report = defrag.plan(state, [waiting_pod("w", 12 * GIB)], pods, 0.0)
    assert _moved(report) == ["default/p8"]
    assert report.groups_left == {}


def test_a_member_stays_in_its_groups_topology_domain() -> None:
    """With a topology constraint on ``zone``, p8's replacement may go to b only where b
    is in p8's zone; else the plan moves p10 instead."""
    state, pods = _cluster("single", zone_b="x", topology=True)
    assert _moved(defrag.plan(state, [waiting_pod("w", 12 * GIB)], pods, 0.0)) == ["default/p8"]
    state, pods = _cluster("single", zone_b="y", topology=True)
    assert _moved(defrag.plan(state, [waiting_pod("w", 12 * GIB)], pods, 0.0)) == ["default/p10"]


def test_an_all_group_is_left_alone_and_the_report_says_so() -> None:
    for mode in ("all", None):
        state, pods = _cluster(mode)
        report = defrag.plan(state, [waiting_pod("w", 12 * GIB)], pods, 0.0)
        assert _moved(report) == ["default/p10"]
        assert list(report.groups_left) == ["default/train"]
        why = report.groups_left["default/train"]
        assert "moved whole or not at all" in why
        assert report_json(report)["groupsLeft"] == {"default/train": why}
        assert f"Pod groups left alone:\n  {why}" in report_table(report)


def test_no_plan_names_the_groups_left_alone() -> None:
    """p10 is of higher priority than the waiting pod, p8 a member of an ``all`` group:
    no plan, and the sentence says the group was left alone."""
    state, pods = _cluster("all")
    pods[0]["spec"]["priority"] = 100
    state.set_pod(pods[0])
    report = defrag.plan(state, [waiting_pod("w", 12 * GIB)], pods, 0.0)
    assert report.plans == ()
    why = report.unplanned["default/w"]
    assert "left alone: pod group default/train: disruptionMode all" in why
