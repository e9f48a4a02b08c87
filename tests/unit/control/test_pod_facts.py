"""Which pods wait for us, which hold devices, and which changes matter."""

from __future__ import annotations

from typing import Any

import pytest

from vgpu_operator import names
from vgpu_operator.control import pod_facts
from vgpu_operator.devices import nvidia


def pod(**parts: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
        "spec": {"schedulerName": "vgpu-scheduler", "containers": [{"name": "c"}]},
        "status": {"phase": "Pending"},
    }
    for section, values in parts.items():
        obj[section] = {**obj.get(section, {}), **values}
    return obj


@pytest.mark.parametrize(
    ("obj", "waiting"),
    [
        pytest.param(pod(), True, id="pending-unbound"),
        pytest.param(pod(status={"phase": None}), True, id="no-phase-yet"),
        pytest.param(pod(spec={"nodeName": "n1"}), False, id="bound"),
        pytest.param(
            pod(metadata={"deletionTimestamp": "2024-01-01T00:00:00Z"}), False, id="deleting"
        ),
        pytest.param(pod(status={"phase": "Failed"}), False, id="failed"),
        pytest.param(pod(spec={"schedulingGates": [{"name": "g"}]}), False, id="gated"),
    ],
)
def test_is_waiting_for_scheduler(obj: dict[str, Any], waiting: bool) -> None:
    assert pod_facts.is_waiting_for_scheduler(obj) is waiting


def test_holds_devices_needs_the_assigned_node_annotation() -> None:
    assert not pod_facts.holds_devices(pod(spec={"nodeName": "n"}))
    assert pod_facts.holds_devices(pod(metadata={"annotations": {names.ASSIGNED_NODE: "n"}}))


def test_slim_drops_managed_fields_without_touching_the_original() -> None:
    original = pod(metadata={"managedFields": [{"manager": "x"}]})
    slimmed = pod_facts.slim(original)
    assert "managedFields" not in slimmed["metadata"]
    assert "managedFields" in original["metadata"]


def test_pod_fingerprint_ignores_status_but_not_annotations() -> None:
    base = pod_facts.pod_fingerprint(pod())
    with_condition = pod(status={"conditions": [{"type": "PodScheduled", "status": "False"}]})
    assert pod_facts.pod_fingerprint(with_condition) == base
    annotated = pod(metadata={"annotations": {nvidia.USE_TYPE_ANNOTATION: "A100"}})
    assert pod_facts.pod_fingerprint(annotated) != base


def node(**status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "n1", "labels": {"a": "b"}, "annotations": {}},
        "spec": {},
        "status": {
            "allocatable": {"cpu": "8"},
            "conditions": [
                {"type": "Ready", "status": "True", "lastHeartbeatTime": "t1"},
            ],
            **status,
        },
    }


@pytest.mark.parametrize(
    ("change", "matters"),
    [
        pytest.param(
            lambda n: n["status"]["conditions"][0].update(lastHeartbeatTime="t2"),
            False,
            id="heartbeat",
        ),
        pytest.param(
            lambda n: n["status"]["conditions"][0].update(status="False"), True, id="not-ready"
        ),
        pytest.param(lambda n: n["spec"].update(unschedulable=True), True, id="cordoned"),
        pytest.param(
            lambda n: n["spec"].update(taints=[{"key": "k", "effect": "NoSchedule"}]),
            True,
            id="taint",
        ),
        pytest.param(lambda n: n["metadata"]["labels"].update(c="d"), True, id="label"),
        pytest.param(
            lambda n: n["metadata"]["annotations"].update({nvidia.REGISTER_ANNOTATION: "[]"}),
            True,
            id="hami-register",
        ),
        pytest.param(
            lambda n: n["metadata"]["annotations"].update({"unrelated": "x"}),
            False,
            id="other-annotation",
        ),
        pytest.param(lambda n: n["status"]["allocatable"].update(cpu="4"), True, id="allocatable"),
    ],
)
def test_node_fingerprint_changes_only_with_schedulable_facts(change: Any, matters: bool) -> None:
    before = node()
    after = node()
    change(after)
    assert (pod_facts.node_fingerprint(before) != pod_facts.node_fingerprint(after)) is matters


def test_quota_fingerprint_ignores_usage_status() -> None:
    quota = {"spec": {"hard": {"limits.nvidia.com/gpumem": "1000"}}, "status": {"used": {}}}
    used = {**quota, "status": {"used": {"limits.nvidia.com/gpumem": "500"}}}
    assert pod_facts.quota_fingerprint(quota) == pod_facts.quota_fingerprint(used)
