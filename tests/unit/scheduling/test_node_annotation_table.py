"""The table of Node annotations: the engine sees only declared keys, and every declared
key that can change a verdict wakes waiting pods.

Each declared key has an example here: a cluster built with and without the key's value
and the verdict the engine reaches for a pod in each. Adding a key to the table without
an example fails ``test_every_declared_key_has_an_example``; a key whose example changes
the verdict but that does not wake (or that the feed's node fingerprint misses) fails
``test_a_key_that_changes_a_verdict_wakes_waiting_pods``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from builders import A100_80, Json, bound, card_uuids, make_node, make_pod

from vgpu_operator import names
from vgpu_operator.config import DeviceConfig
from vgpu_operator.control import pod_facts
from vgpu_operator.devices import catalog, codec, model, node_lock
from vgpu_operator.devices.vendor import VendorSpec, resource_names
from vgpu_operator.scheduling import node_annotations
from vgpu_operator.scheduling.books import allocation_gate
from vgpu_operator.scheduling.cycle.cluster import ClusterState
from vgpu_operator.scheduling.node_basics import NodeFacts

NOW = time.time()


@dataclass(frozen=True)
class Example:
    """A cluster and a pod whose verdict the annotation (``value``, or absent) decides."""

    value: str
    #: Build the cluster, with the annotation set to the value or left out (None).
    cluster: Callable[[str | None], ClusterState]
    pod: Json


def _verdict(state: ClusterState, pod: Json) -> Any:
    decision = state.schedule(pod, NOW)
    diagnosis = decision.diagnosis.to_json() if decision.diagnosis else None
    gate = state.bind_gate_open(decision.node, decision.pod, NOW) if decision.node else None
    return (decision.node, card_uuids(decision), diagnosis, gate)


def _card(spec: VendorSpec, uuid: str) -> model.DeviceInfo:
    return model.DeviceInfo(uuid, 0, 10, 16384, 100, f"{spec.type_marker} X1", 0, True)


def _vendor_pod(spec: VendorSpec) -> Json:
    count = resource_names(spec.config_type()).count
    return make_pod("p").container(extra={count: 1}).obj()


def _one_card_node(spec: VendorSpec, key: str) -> Callable[[str | None], ClusterState]:
    """One node with one of the vendor's cards (from its inventory); ``key`` set to the
    value when given."""

    def build(value: str | None) -> ClusterState:
        state = ClusterState(DeviceConfig())
        node = make_node("n")
        if value is not None:
            node.annotate(key, value)
        obj, _ = node.obj()
        state.set_node(obj)
        state.set_inventory("n", [_card(spec, f"{spec.common_word}-0")], {}, heartbeat=0.0)
        return state

    return build


def _registered_node(spec: VendorSpec) -> Callable[[str | None], ClusterState]:
    """A node with no inventory: its cards come from the register annotation alone."""

    def build(value: str | None) -> ClusterState:
        state = ClusterState(DeviceConfig())
        node = make_node("n")
        if value is not None:
            node.annotate(spec.register_annotation, value)
        state.set_node(node.obj()[0])
        return state

    return build


def _vendor_examples(spec: VendorSpec) -> dict[str, Example]:
    pod = _vendor_pod(spec)
    uuid = f"{spec.common_word}-0"
    register = codec.encode_node_devices_json([_card(spec, uuid)], spec.register_annotation)
    examples = {
        spec.register_annotation: Example(register, _registered_node(spec), pod),
        spec.use_type_annotation: Example(
            "no-such-type", _one_card_node(spec, spec.use_type_annotation), pod
        ),
        spec.nouse_type_annotation: Example(
            spec.type_marker, _one_card_node(spec, spec.nouse_type_annotation), pod
        ),
        spec.use_uuid_annotation: Example(
            "no-such-card", _one_card_node(spec, spec.use_uuid_annotation), pod
        ),
        spec.nouse_uuid_annotation: Example(
            uuid, _one_card_node(spec, spec.nouse_uuid_annotation), pod
        ),
    }
    if spec.score_annotation:
        examples[spec.score_annotation] = _pair_scores_example(spec)
    return examples


def _pair_scores_example(spec: VendorSpec) -> Example:
    """Three cards; the scores make a0+a2 the best pair for a topology-aware pod."""
    cards = [model.DeviceInfo(f"GPU-a{i}", i, 10, 81920, 100, A100_80, 0, True) for i in range(3)]
    scores = {
        "GPU-a0": {"GPU-a1": 20, "GPU-a2": 1230},
        "GPU-a1": {"GPU-a0": 20, "GPU-a2": 20},
        "GPU-a2": {"GPU-a0": 1230, "GPU-a1": 20},
    }
    register = codec.encode_node_devices_json(cards, spec.register_annotation)
    key = spec.score_annotation
    assert key is not None

    def build(value: str | None) -> ClusterState:
        state = ClusterState(DeviceConfig())
        node = make_node("n").annotate(spec.register_annotation, register)
        if value is not None:
            node.annotate(key, value)
        state.set_node(node.obj()[0])
        return state

    pod = (
        make_pod("pair")
        .container(gpu=2, gpumem=1024, cores=10)
        .annotate(names.GPU_SCHEDULER_POLICY, "topology-aware")
        .obj()
    )
    return Example(codec.encode_pair_scores(scores, key), build, pod)


def _two_cards_one_used(key: str) -> Callable[[str | None], ClusterState]:
    """Node "a" with a used and an idle card, node "b" idle: the policies decide."""

    def build(value: str | None) -> ClusterState:
        state = ClusterState(DeviceConfig())
        for name in ("a", "b"):
            node = make_node(name).gpu(f"GPU-{name}0").gpu(f"GPU-{name}1")
            if value is not None:
                node.annotate(key, value)
            node.install(state)
        first = make_pod("first").container(gpu=1, gpumem=4096).obj()
        decision = state.schedule(first, NOW)
        state.confirm(decision.pod)
        state.set_pod(bound(first, decision))
        return state

    return build


def _locked_node(value: str | None) -> ClusterState:
    state = ClusterState(DeviceConfig())
    state.gate_mode = allocation_gate.GateMode.HAMI_LOCK
    node = make_node("n").gpu("GPU-0")
    if value is not None:
        node.annotate(names.NODE_LOCK, value)
    node.install(state)
    return state


def _examples() -> dict[str, Example]:
    examples: dict[str, Example] = {}
    for spec in catalog.VENDOR_TABLE:
        examples.update(_vendor_examples(spec))
    one_gpu = make_pod("p").container(gpu=1, gpumem=1024).obj()
    examples[names.NODE_DEVICE_CORDON] = Example(
        "NVIDIA-0",
        _one_card_node(catalog.VENDOR_TABLE[0], names.NODE_DEVICE_CORDON),
        _vendor_pod(catalog.VENDOR_TABLE[0]),
    )
    examples[names.NODE_LOCK] = Example(
        node_lock.encode(NOW, "other", "holder").split(",")[0], _locked_node, one_gpu
    )
    examples[names.NODE_SCHEDULER_POLICY] = Example(
        "spread", _two_cards_one_used(names.NODE_SCHEDULER_POLICY), one_gpu
    )
    examples[names.GPU_SCHEDULER_POLICY] = Example(
        "binpack", _two_cards_one_used(names.GPU_SCHEDULER_POLICY), one_gpu
    )
    return examples


EXAMPLES = _examples()
TABLE = node_annotations.table()


def test_every_declared_key_has_an_example() -> None:
    assert {row.key for row in TABLE} == set(EXAMPLES)


def test_the_table_declares_each_key_once() -> None:
    keys = [row.key for row in TABLE]
    assert len(keys) == len(set(keys))


@pytest.mark.parametrize("key", sorted(EXAMPLES))
def test_a_key_that_changes_a_verdict_wakes_waiting_pods(key: str) -> None:
    example = EXAMPLES[key]
    without = _verdict(example.cluster(None), example.pod)
    with_value = _verdict(example.cluster(example.value), example.pod)
    assert with_value != without, f"the example for {key} does not change the verdict"
    row = next(row for row in TABLE if row.key == key)
    assert row.wakes, f"{key} changes a verdict ({row.decides}) but does not wake pods"
    node: Json = {"metadata": {"name": "n", "annotations": {}}}
    changed: Json = {"metadata": {"name": "n", "annotations": {key: example.value}}}
    assert pod_facts.node_fingerprint(node) != pod_facts.node_fingerprint(changed)


def test_the_engine_sees_no_undeclared_node_annotation() -> None:
    node = {
        "metadata": {
            "name": "n",
            "annotations": {
                names.NODE_DEVICE_CORDON: "GPU-0",
                "example.com/not-declared": "x",
                names.NODE_HANDSHAKE: "Reported_2026-11-27",
            },
        }
    }
    assert dict(NodeFacts.from_node(node).annotations) == {names.NODE_DEVICE_CORDON: "GPU-0"}


def test_an_undeclared_annotation_leaves_the_fingerprint_alone() -> None:
    node: Json = {"metadata": {"name": "n", "annotations": {}}}
    noisy: Json = {"metadata": {"name": "n", "annotations": {names.NODE_HANDSHAKE: "x"}}}
    assert pod_facts.node_fingerprint(node) == pod_facts.node_fingerprint(noisy)


def test_docs_architecture_lists_every_declared_key() -> None:
    doc = (Path(__file__).parents[3] / "docs" / "architecture.md").read_text()
    assert [row.key for row in TABLE if f"`{row.key}`" not in doc] == []
