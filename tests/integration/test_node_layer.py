"""The node configuration layer on a real API server: Node annotations steer pods (issue 14).

Seed 003 §2.3: Pod annotation > Node annotation > ConfigMap. An administrator's
restriction on a Node keeps pods off its cards until it is lifted; an unreadable value
is reported as an Event on the Node and ignored.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from integration import operator_env as env

from vgpu_operator import names
from vgpu_operator.devices import nvidia
from vgpu_operator.handlers.runtime import OperatorThread
from vgpu_operator.testing.controlplane import ControlPlane


@pytest.fixture
def scheduler(control_plane: ControlPlane, namespace: str) -> Iterator[str]:
    yield env.new_scheduler(control_plane, namespace)
    env.cleanup_group(control_plane, namespace)


@pytest.fixture
def operator(control_plane: ControlPlane, namespace: str, scheduler: str) -> Iterator[None]:
    with OperatorThread(env.options(control_plane, namespace)):
        yield


def _create(cp: ControlPlane, namespace: str, scheduler: str, name: str, gpumem: int) -> None:
    pod = env.gpu_pod(namespace, name, scheduler=scheduler, group=namespace, gpumem=gpumem)
    env.create_pod(cp, pod)


def _waiting_message(cp: ControlPlane, namespace: str, name: str) -> str:
    def check() -> str | None:
        cond = env.condition(env.get_pod(cp, namespace, name))
        if cond and cond.get("status") == "False" and cond.get("message"):
            return str(cond["message"])
        return None

    return env.wait_until(f"{name} to be marked unschedulable", check, 30)


def test_node_type_restriction_steers_pods_until_lifted(
    control_plane: ControlPlane, namespace: str, scheduler: str, operator: None
) -> None:
    restricted, free = f"{namespace}-r", f"{namespace}-f"
    # Both nodes hold A100s; the administrator keeps the first one for H100 work only.
    env.gpu_node(
        control_plane,
        restricted,
        env.cards(restricted, 1, memory_mib=20000),
        group=namespace,
        annotations={nvidia.USE_TYPE_ANNOTATION: "H100"},
    )
    env.gpu_node(control_plane, free, env.cards(free, 1, memory_mib=20000), group=namespace)

    _create(control_plane, namespace, scheduler, "first", 15000)
    first = env.wait_bound(control_plane, namespace, "first")
    assert first["spec"]["nodeName"] == free

    _create(control_plane, namespace, scheduler, "second", 15000)
    message = _waiting_message(control_plane, namespace, "second")
    assert re.search(r"1 CardTypeMismatch \(node annotation nvidia\.com/use-gputype\)", message)
    assert "1 CardInsufficientMemory" in message

    # Lifting the restriction wakes the waiting pod, which takes the node's card.
    control_plane.patch(
        f"/api/v1/nodes/{restricted}",
        {"metadata": {"annotations": {nvidia.USE_TYPE_ANNOTATION: None}}},
    )
    second = env.wait_bound(control_plane, namespace, "second", 30)
    assert second["spec"]["nodeName"] == restricted


def test_unreadable_node_annotation_is_reported_on_the_node_and_ignored(
    control_plane: ControlPlane, namespace: str, scheduler: str, operator: None
) -> None:
    node = f"{namespace}-bad"
    env.gpu_node(
        control_plane,
        node,
        env.cards(node, 1),
        group=namespace,
        annotations={names.NODE_SCHEDULER_POLICY: "packed"},
    )

    def node_event() -> dict[str, Any] | None:
        for event in env.events_for(control_plane, "default", node):
            if event["reason"] == "NodeAnnotationIgnored":
                return event
        return None

    event = env.wait_until("a NodeAnnotationIgnored Event on the node", node_event, 30)
    assert event["type"] == "Warning"
    assert event["involvedObject"]["kind"] == "Node"
    assert "namespace" not in event["involvedObject"]
    assert names.NODE_SCHEDULER_POLICY in event["message"]
    assert "'packed'" in event["message"]

    _create(control_plane, namespace, scheduler, "p1", 1000)
    assert env.wait_bound(control_plane, namespace, "p1")["spec"]["nodeName"] == node
