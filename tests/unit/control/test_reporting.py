"""What a pending pod's owner reads: the condition, the Event text, Event aggregation."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from vgpu_operator.control.reporting import (
    condition_reasons,
    failed_scheduling_message,
    preempted_message,
    preempting_message,
    scheduled_message,
)
from vgpu_operator.kube import conditions, events
from vgpu_operator.kube.binding import binding_body
from vgpu_operator.kube.eviction import eviction_body
from vgpu_operator.scheduling.status import Diagnosis, NodeFailure, Reason

T0 = datetime.datetime(2030, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
T1 = T0 + datetime.timedelta(seconds=30)


def test_event_message_has_node_summary_and_device_counts() -> None:
    diagnosis = Diagnosis(
        {
            "a": NodeFailure({Reason.CARD_INSUFFICIENT_MEMORY: 3, Reason.CARD_TYPE_MISMATCH: 1}),
            "b": NodeFailure({Reason.CARD_INSUFFICIENT_MEMORY: 4}),
            "c": NodeFailure({Reason.CARD_TYPE_MISMATCH: 8}),
        },
        3,
    )
    assert failed_scheduling_message(diagnosis) == (
        "0/3 nodes are available: 2 CardInsufficientMemory, 1 CardTypeMismatch. "
        "Devices ruled out: 7 CardInsufficientMemory, 9 CardTypeMismatch."
    )


def test_event_message_without_devices_is_the_summary() -> None:
    assert failed_scheduling_message(Diagnosis({}, 0)) == "0/0 nodes are available."


def test_scheduled_message_names_pod_and_node() -> None:
    pod = {"metadata": {"namespace": "ns", "name": "p"}}
    assert scheduled_message(pod, "n1") == "Successfully assigned ns/p to n1"


def _pod_with(condition: dict[str, Any] | None) -> dict[str, Any]:
    return {"status": {"conditions": [condition] if condition else []}}


def test_condition_is_written_first_time() -> None:
    written = conditions.unschedulable_condition(_pod_with(None), "0/1 nodes are available.", T0)
    assert written == {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "0/1 nodes are available.",
        "lastProbeTime": None,
        "lastTransitionTime": "2030-01-02T03:04:05Z",
    }


def test_same_condition_is_not_written_again() -> None:
    first = conditions.unschedulable_condition(_pod_with(None), "m", T0)
    assert conditions.unschedulable_condition(_pod_with(first), "m", T1) is None


def test_new_message_keeps_the_transition_time() -> None:
    first = conditions.unschedulable_condition(_pod_with(None), "m1", T0)
    second = conditions.unschedulable_condition(_pod_with(first), "m2", T1)
    assert second is not None
    assert second["message"] == "m2"
    assert second["lastTransitionTime"] == "2030-01-02T03:04:05Z"


REF = events.ObjectRef(kind="Pod", namespace="ns", name="p", uid="u1")


def test_repeated_event_bumps_the_count_of_one_event() -> None:
    aggregator = events.EventAggregator("op-1")
    first = aggregator.record(REF, "FailedScheduling", "no room", T0)
    again = aggregator.record(REF, "FailedScheduling", "no room", T1)
    assert first.action is events.EventWriteAction.CREATE
    assert first.body["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": "ns",
        "name": "p",
        "uid": "u1",
    }
    assert first.body["type"] == "Warning"
    assert first.body["reportingInstance"] == "op-1"
    assert again.action is events.EventWriteAction.UPDATE
    assert again.name == first.name
    assert again.body == {"count": 2, "lastTimestamp": "2030-01-02T03:04:35Z"}


def test_new_message_starts_a_new_event() -> None:
    aggregator = events.EventAggregator("op-1")
    first = aggregator.record(REF, "FailedScheduling", "no room", T0)
    other = aggregator.record(REF, "FailedScheduling", "still no room, differently", T1)
    assert other.action is events.EventWriteAction.CREATE
    assert other.name != first.name


def test_forgotten_pod_starts_afresh() -> None:
    aggregator = events.EventAggregator("op-1")
    aggregator.record(REF, "FailedScheduling", "no room", T0)
    aggregator.forget("ns", "p")
    assert len(aggregator) == 0
    assert (
        aggregator.record(REF, "FailedScheduling", "no room", T1).action
        is events.EventWriteAction.CREATE
    )


def test_forgetting_one_pod_keeps_the_others_series() -> None:
    aggregator = events.EventAggregator("op-1")
    other = events.ObjectRef("Pod", "ns", "q")
    aggregator.record(REF, "FailedScheduling", "no room", T0)
    aggregator.record(REF, "Preempting", "evicting", T0)
    aggregator.record(other, "FailedScheduling", "no room", T0)
    aggregator.forget("ns", "p")
    assert len(aggregator) == 1
    again = aggregator.record(other, "FailedScheduling", "no room", T1)
    assert again.action is events.EventWriteAction.UPDATE
    assert (
        aggregator.record(REF, "Preempting", "evicting", T1).action
        is events.EventWriteAction.CREATE
    )


def test_long_message_is_cut_to_the_api_limit() -> None:
    write = events.EventAggregator().record(REF, "R", "x" * 5000, T0)
    assert len(write.body["message"]) == events.MAX_MESSAGE_CHARS


def test_binding_carries_annotations_uid_and_target() -> None:
    body = binding_body("ns", "p", "u1", "n1", {"hami.io/vgpu-node": "n1"})
    assert body == {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "uid": "u1",
            "annotations": {"hami.io/vgpu-node": "n1"},
        },
        "target": {"apiVersion": "v1", "kind": "Node", "name": "n1"},
    }


@pytest.mark.parametrize("uid", ["", "u2"])
def test_binding_uid_is_optional(uid: str) -> None:
    assert ("uid" in binding_body("ns", "p", uid, "n", {})["metadata"]) is bool(uid)


def test_preemption_texts_name_both_sides() -> None:
    preemptor = {"metadata": {"namespace": "ml", "name": "urgent"}}
    assert preempted_message(preemptor, "node-a") == "Preempted by ml/urgent on node node-a"
    assert preempting_message("node-a", 2) == "Preempting 2 pods on node node-a"
    assert preempting_message("node-a", 1) == "Preempting 1 pod on node node-a"


def test_eviction_carries_the_uid_precondition_when_known() -> None:
    body = eviction_body("ml", "batch", "u-1")
    assert body["kind"] == "Eviction"
    assert body["deleteOptions"] == {"preconditions": {"uid": "u-1"}}
    assert "deleteOptions" not in eviction_body("ml", "batch", "")


def test_the_metric_reasons_are_the_condition_messages() -> None:
    """``unschedulable_pods{reason}`` counts a pod under each reason its condition message
    names (each node's main reason, without the node annotation that caused it)."""
    diagnosis = Diagnosis(
        {
            "a": NodeFailure({Reason.CARD_INSUFFICIENT_MEMORY: 3, Reason.CARD_TYPE_MISMATCH: 1}),
            "b": NodeFailure(
                {Reason.CARD_TYPE_MISMATCH: 4},
                refused_by={Reason.CARD_TYPE_MISMATCH: frozenset({"nvidia.com/use-gputype"})},
            ),
            "c": NodeFailure({Reason.NODE_UNTOLERATED_TAINT: 1}),
        },
        4,
    )
    assert diagnosis.message() == (
        "1/4 nodes are available: 1 CardInsufficientMemory, "
        "1 CardTypeMismatch (node annotation nvidia.com/use-gputype), 1 NodeUntoleratedTaint."
    )
    assert condition_reasons(diagnosis) == (
        "CardInsufficientMemory",
        "CardTypeMismatch",
        "NodeUntoleratedTaint",
    )
    assert condition_reasons(Diagnosis({}, 0)) == ("NoNodes",)
    assert condition_reasons(Diagnosis({}, 3, error="bad gpumem")) == ("InvalidRequest",)
