"""A mapped extended resource served on either path (issue 47 item 7, ``either_plugin``):
with a DeviceClass mapping ``nvidia.com/gpu``, a pod asking it goes to a device-plugin node
(the annotation allocation) or to a DRA node (its special claim), whichever the one walk
finds, as kube-scheduler serves such a pod from a device plugin or through DRA."""

from __future__ import annotations

from typing import Any

from builders import A100_40, bound, make_node
from unit.scheduling.test_extended_claims import NODE, pod, state

from vgpu_operator.devices import dra, nvidia
from vgpu_operator.scheduling.cycle.cluster import ClusterState
from vgpu_operator.scheduling.dialects.claims import extended_claims
from vgpu_operator.scheduling.status import Reason

DP = "dp-a"  # a device-plugin node: one 16 GiB card (the DRA node has two of 10 GiB)


def mixed() -> ClusterState:
    engine = state()
    make_node(DP).gpu("GPU-dp0", memory_mib=16384, type=A100_40).install(engine)
    return engine


def gpus(count: int, memory: int | None = None, **more: str) -> dict[str, Any]:
    limits: dict[str, Any] = {"nvidia.com/gpu": str(count), **more}
    if memory is not None:
        limits["nvidia.com/gpumem"] = str(memory)
    return limits


def test_only_the_device_plugin_node_fits_so_the_annotation_path_takes_it() -> None:
    engine = mixed()
    decision = engine.schedule(pod(gpus(1, 16000)), now=0)
    assert decision.scheduled, decision.diagnosis and decision.diagnosis.message()
    assert decision.node == DP
    assert decision.claim_writes == ()  # no special claim made
    assert "GPU-dp0" in decision.annotations[nvidia.TO_ALLOCATE_ANNOTATION]


def test_only_the_dra_node_fits_so_the_special_claim_takes_it() -> None:
    engine = mixed()
    decision = engine.schedule(pod(gpus(2, 4000)), now=0)  # two cards: the DRA node's
    assert decision.scheduled, decision.diagnosis and decision.diagnosis.message()
    assert decision.node == NODE
    [write] = decision.claim_writes
    assert write.create is not None
    assert write.allocation is not None
    assert nvidia.TO_ALLOCATE_ANNOTATION not in decision.annotations


def test_a_request_no_claim_can_say_still_goes_to_a_device_plugin_node() -> None:
    engine = mixed()
    limits = gpus(1, **{"nvidia.com/gpumem-percentage": "50"})
    decision = engine.schedule(pod(limits), now=0)
    assert decision.scheduled, decision.diagnosis and decision.diagnosis.message()
    assert decision.node == DP
    assert decision.claim_writes == ()


def test_a_refusal_names_both_paths_reasons() -> None:
    engine = mixed()
    decision = engine.schedule(pod(gpus(1, 20000)), now=0)  # fits no card anywhere
    assert not decision.scheduled
    diagnosis = decision.diagnosis
    assert diagnosis is not None
    assert set(diagnosis.node_failures) == {NODE, DP}
    assert Reason.CARD_INSUFFICIENT_MEMORY in diagnosis.node_failures[DP].reasons
    assert diagnosis.node_failures[NODE].reasons  # the claims fit's own reason
    assert diagnosis.message().startswith("0/2 nodes are available")


def test_a_path_that_cannot_read_the_request_is_named_with_its_sentence() -> None:
    engine = mixed()
    limits = gpus(1, **{"nvidia.com/gpumem-percentage": "50"})
    for name in ("a", "b"):  # half of the device-plugin card each
        assert engine.schedule(pod(limits, name), now=0).node == DP
    decision = engine.schedule(pod(limits, "c"), now=0)
    assert not decision.scheduled
    diagnosis = decision.diagnosis
    assert diagnosis is not None
    assert diagnosis.node_failures[NODE].reasons == {Reason.EXTENDED_CLAIM_REFUSED: 1}
    message = diagnosis.message()
    assert "ExtendedClaimRefused" in message
    assert "DRA nodes cannot serve it" in message
    assert "gpumem-percentage" in message


def test_a_pod_bound_through_the_device_plugin_path_is_booked_there() -> None:
    engine = mixed()
    first = pod(gpus(1, 16000), "a")
    decision = engine.schedule(first, now=0)
    assert decision.node == DP
    engine.set_pod(bound(first, decision))
    again = engine.schedule(pod(gpus(1, 16000), "b"), now=1)
    assert not again.scheduled  # the card's memory is the first pod's
    assert again.diagnosis is not None
    assert Reason.CARD_INSUFFICIENT_MEMORY in again.diagnosis.node_failures[DP].reasons


def test_without_a_mapping_the_dra_node_is_not_offered() -> None:
    engine = state(extended=None)
    make_node(DP).gpu("GPU-dp0", memory_mib=16384, type=A100_40).install(engine)
    decision = engine.schedule(pod(gpus(2, 4000)), now=0)
    assert not decision.scheduled  # the annotation path alone: one card on DP


def test_a_pod_preempts_on_the_device_plugin_node_through_the_annotation_path() -> None:
    engine = mixed()
    engine.preemption_enabled = True
    low = pod(gpus(1, 16000), "low")
    low["spec"]["priority"] = 1
    decision = engine.schedule(low, now=0)
    assert decision.node == DP
    engine.set_pod(bound(low, decision))
    urgent = pod(gpus(1, 16000), "urgent")
    urgent["spec"]["priority"] = 100
    chosen = engine.schedule(urgent, now=1)
    assert chosen.victims == ("ns/low",)
    assert chosen.nominated_node == DP
    assert chosen.claim_writes == ()
    engine.remove_pod("ns/low")
    placed = engine.schedule(urgent, now=2)
    assert placed.scheduled, placed.diagnosis and placed.diagnosis.message()
    assert placed.node == DP
    assert "GPU-dp0" in placed.annotations[nvidia.TO_ALLOCATE_ANNOTATION]


def test_a_pod_also_asking_an_implicit_class_name_stays_on_the_dra_path() -> None:
    """No device plugin serves ``deviceclass.resource.kubernetes.io/<class>``: a pod
    asking it beside ``nvidia.com/gpu`` is not placed on a device-plugin node, where
    that resource would go unserved."""
    engine = mixed()
    implicit = extended_claims.IMPLICIT_PREFIX + dra.EXCLUSIVE_CLASS
    decision = engine.schedule(pod({**gpus(1, 16000), implicit: "1"}), now=0)
    assert not decision.scheduled  # the 16000 MiB share fits only the device-plugin card
    assert decision.diagnosis is not None
    assert decision.diagnosis.node_failures[DP].reasons == {Reason.NODE_NOT_ON_DRA_PATH: 1}
