"""A pod pinned to a card (``nvidia.com/use-gpuuuid``) whose card fails for another cause
is told that cause: the node's other cards count under ``CardUuidMismatch`` (HAMi's
device counts, kept for the Event), but the node's reason is what the pinned card
failed. Both ways of judging a node (Fit, and the card classes) say the same."""

from __future__ import annotations

import pytest
from builders import T4, cluster, make_node, make_pod

from vgpu_operator.devices import nvidia
from vgpu_operator.scheduling.cycle.cluster import ClusterState


def _four_cards(**pinned: object) -> ClusterState:
    node = make_node("a")
    for index in range(4):
        node.gpu(f"GPU-a{index}", **(pinned if index == 2 else {}))  # type: ignore[arg-type]
    return cluster(node)


@pytest.mark.parametrize("use_index", [True, False], ids=["card-classes", "fit"])
@pytest.mark.parametrize(
    ("pinned", "request_mib", "reason"),
    [
        pytest.param({"memory_mib": 8192}, 10000, "CardInsufficientMemory", id="memory"),
        pytest.param({"health": False}, 1024, "CardNotHealth", id="health"),
        pytest.param({"type": T4}, 1024, "CardTypeMismatch", id="type"),
        pytest.param({"count": 0}, 1024, "CardTimeSlicingExhausted", id="slots"),
    ],
)
def test_the_pinned_cards_own_failure_is_the_nodes_reason(
    use_index: bool, pinned: dict[str, object], request_mib: int, reason: str
) -> None:
    state = _four_cards(**pinned)
    state.use_index = use_index
    pod = (
        make_pod("p")
        .container(gpu=1, gpumem=request_mib)
        .annotate(nvidia.USE_UUID_ANNOTATION, "GPU-a2")
    )
    if reason == "CardTypeMismatch":
        pod = pod.annotate(nvidia.USE_TYPE_ANNOTATION, "A100")
    decision = state.schedule(pod.obj(), 0)
    assert not decision.scheduled
    assert decision.diagnosis is not None
    assert decision.diagnosis.message() == f"0/1 nodes are available: 1 {reason}."
    # The Event's device counts stay HAMi's: the other cards under CardUuidMismatch.
    assert decision.diagnosis.device_counts()["CardUuidMismatch"] == 3


@pytest.mark.parametrize("use_index", [True, False], ids=["card-classes", "fit"])
def test_a_pinned_card_the_node_lacks_is_a_uuid_mismatch(use_index: bool) -> None:
    state = _four_cards(health=False)
    state.use_index = use_index
    pod = make_pod("p").container(gpu=1, gpumem=1024).annotate(nvidia.USE_UUID_ANNOTATION, "GPU-b0")
    decision = state.schedule(pod.obj(), 0)
    assert decision.diagnosis is not None
    assert decision.diagnosis.message() == "0/1 nodes are available: 1 CardUuidMismatch."


@pytest.mark.parametrize("use_index", [True, False], ids=["card-classes", "fit"])
def test_an_excluded_card_does_not_hide_why_the_others_fail(use_index: bool) -> None:
    """nouse-gpuuuid: three cards excluded, the fourth too small."""
    node = make_node("a")
    for index in range(4):
        node.gpu(f"GPU-a{index}", memory_mib=8192 if index == 3 else 16384)
    state = cluster(node)
    state.use_index = use_index
    pod = make_pod("p").container(gpu=1, gpumem=10000)
    pod = pod.annotate(nvidia.NOUSE_UUID_ANNOTATION, "GPU-a0,GPU-a1,GPU-a2")
    decision = state.schedule(pod.obj(), 0)
    assert decision.diagnosis is not None
    assert decision.diagnosis.message() == "0/1 nodes are available: 1 CardInsufficientMemory."
