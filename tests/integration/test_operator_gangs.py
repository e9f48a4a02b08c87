"""The operator places an upstream PodGroup's gang all together or not at all (issue 36),
against a real API server with the GenericWorkload gate on: members wait whole (nothing
bound, the group's reason on each member and on the PodGroup), then bind together once
room appears; a missing PodGroup gives its members a clear reason."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from integration import operator_env as env

from vgpu_operator.handlers.runtime import OperatorThread
from vgpu_operator.scheduling.gangs import gangs
from vgpu_operator.testing.controlplane import ControlPlane


@pytest.fixture
def scheduler(control_plane: ControlPlane, namespace: str) -> Iterator[str]:
    name = env.new_scheduler(control_plane, namespace)
    yield name
    env.cleanup_group(control_plane, namespace)


@pytest.fixture
def operator(control_plane: ControlPlane, namespace: str, scheduler: str) -> Iterator[None]:
    with OperatorThread(env.options(control_plane, namespace)):
        yield


def _groups(namespace: str) -> str:
    return f"/apis/{gangs.API_VERSION}/namespaces/{namespace}/podgroups"


def _member(namespace: str, scheduler: str, name: str, group: str) -> dict[str, Any]:
    pod = env.gpu_pod(namespace, name, scheduler=scheduler, group=namespace, gpumem=20000)
    pod["spec"]["schedulingGroup"] = {"podGroupName": group}
    return pod


def _message(cp: ControlPlane, namespace: str, name: str) -> str:
    cond = env.condition(env.get_pod(cp, namespace, name)) or {}
    return str(cond.get("message", "")) if cond.get("status") == "False" else ""


def _group_condition(cp: ControlPlane, namespace: str, group: str) -> dict[str, Any] | None:
    obj = cp.get(f"{_groups(namespace)}/{group}")
    for cond in (obj.get("status") or {}).get("conditions") or ():
        if cond.get("type") == gangs.INITIALLY_SCHEDULED:
            return dict(cond)
    return None


def _newest_group_condition(
    cp: ControlPlane, namespace: str, group: str, text: str
) -> dict[str, Any] | None:
    cond = _group_condition(cp, namespace, group)
    return cond if cond is not None and text in str(cond.get("message")) else None


def test_a_gang_waits_whole_then_binds_together(
    control_plane: ControlPlane, namespace: str, scheduler: str, operator: None
) -> None:
    cp = control_plane
    cp.create(
        _groups(namespace),
        {
            "apiVersion": gangs.API_VERSION,
            "kind": "PodGroup",
            "metadata": {"name": "train"},
            "spec": {"schedulingPolicy": {"gang": {"minCount": 4}}},
        },
    )
    # One node with one 40 GB card: two members of 20 GB fit, the other two do not, so
    # none is bound.
    env.gpu_node(
        cp, f"{namespace}-a", env.cards(f"{namespace}-a", 1, memory_mib=40000), group=namespace
    )
    for i in range(4):
        env.create_pod(cp, _member(namespace, scheduler, f"w{i}", "train"))
    for i in range(4):
        env.wait_until(
            f"w{i} to wait with the group's reason",
            lambda i=i: re.search(r"2 of the 4 members", _message(cp, namespace, f"w{i}")),
            30,
        )
    # The condition is written after the members are told, so an earlier attempt's (fewer
    # members had arrived) may still stand for a moment: wait for the newest.
    cond = env.wait_until(
        "the PodGroup's condition to name the four members",
        lambda: _newest_group_condition(cp, namespace, "train", "2 of the 4 members"),
        30,
    )
    assert cond["status"] == "False"
    assert cond["reason"] == gangs.REASON_UNSCHEDULABLE
    assert "2 of the 4 members" in cond["message"]
    assert not any(env.get_pod(cp, namespace, f"w{i}")["spec"].get("nodeName") for i in range(4))
    # Room for the whole gang: all four are bound.
    env.gpu_node(
        cp, f"{namespace}-b", env.cards(f"{namespace}-b", 1, memory_mib=40000), group=namespace
    )
    for i in range(4):
        env.wait_bound(cp, namespace, f"w{i}")
    env.wait_until(
        "the PodGroup to be marked scheduled",
        lambda: (_group_condition(cp, namespace, "train") or {}).get("status") == "True",
        30,
    )


def test_a_missing_pod_group_is_named(
    control_plane: ControlPlane, namespace: str, scheduler: str, operator: None
) -> None:
    cp = control_plane
    env.gpu_node(
        cp, f"{namespace}-a", env.cards(f"{namespace}-a", 2, memory_mib=40000), group=namespace
    )
    env.create_pod(cp, _member(namespace, scheduler, "lonely", "nowhere"))
    env.wait_until(
        "the member to say its PodGroup is missing",
        lambda: f"PodGroup {namespace}/nowhere does not exist" in _message(cp, namespace, "lonely"),
        30,
    )
    assert not env.get_pod(cp, namespace, "lonely")["spec"].get("nodeName")
    # The PodGroup appears: the member is placed.
    cp.create(
        _groups(namespace),
        {
            "apiVersion": gangs.API_VERSION,
            "kind": "PodGroup",
            "metadata": {"name": "nowhere"},
            "spec": {"schedulingPolicy": {"gang": {"minCount": 1}}},
        },
    )
    env.wait_bound(cp, namespace, "lonely")
