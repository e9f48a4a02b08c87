"""Reading the node configuration layer from a Node's annotations (issue 14)."""

from __future__ import annotations

import pytest

from vgpu_operator import names
from vgpu_operator.devices import hygon, nvidia
from vgpu_operator.kube.events import ObjectRef
from vgpu_operator.scheduling.policies import node_layer

SPECS = (nvidia.SPEC, hygon.SPEC)


def test_no_annotations_is_the_empty_layer() -> None:
    assert node_layer.read({"unrelated": "x"}, SPECS) == node_layer.EMPTY


@pytest.mark.parametrize(
    ("annotations", "node_policy", "gpu_policy"),
    [
        pytest.param({names.NODE_SCHEDULER_POLICY: " spread "}, "spread", None, id="node-trimmed"),
        pytest.param({names.GPU_SCHEDULER_POLICY: "binpack"}, None, "binpack", id="gpu"),
        pytest.param({names.GPU_SCHEDULER_POLICY: "numa, binpack"}, None, "numa,binpack",
                     id="gpu-chain"),
        pytest.param({names.NODE_SCHEDULER_POLICY: ""}, None, None, id="empty-is-unset"),
    ],
)  # fmt: skip
def test_policies_are_read(
    annotations: dict[str, str], node_policy: str | None, gpu_policy: str | None
) -> None:
    layer = node_layer.read(annotations, SPECS)
    assert (layer.node_policy, layer.gpu_policy, layer.problems) == (node_policy, gpu_policy, ())


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (names.NODE_SCHEDULER_POLICY, "packed"),
        (names.GPU_SCHEDULER_POLICY, "binpack,fastest"),
        (nvidia.USE_TYPE_ANNOTATION, " , "),
    ],
)
def test_unreadable_values_are_ignored_and_named(key: str, value: str) -> None:
    layer = node_layer.read({key: value, nvidia.NOUSE_UUID_ANNOTATION: "GPU-1"}, SPECS)
    assert (layer.node_policy, layer.gpu_policy) == (None, None)
    assert layer.restrictions == {nvidia.NOUSE_UUID_ANNOTATION: "GPU-1"}
    assert len(layer.problems) == 1
    assert key in layer.problems[0]


def test_restrictions_of_every_vendor_are_kept() -> None:
    annotations = {
        nvidia.USE_TYPE_ANNOTATION: "A100",
        nvidia.NOUSE_UUID_ANNOTATION: "GPU-1",
        hygon.USE_TYPE_ANNOTATION: "Z100",
        nvidia.USE_UUID_ANNOTATION: "",
    }
    layer = node_layer.read(annotations, SPECS)
    assert layer.restrictions == {
        nvidia.USE_TYPE_ANNOTATION: "A100",
        nvidia.NOUSE_UUID_ANNOTATION: "GPU-1",
        hygon.USE_TYPE_ANNOTATION: "Z100",
    }


def test_node_events_name_no_namespace_in_their_object() -> None:
    """kubectl describe node finds Events whose involvedObject has no namespace."""
    ref = ObjectRef.of({"metadata": {"name": "n1", "uid": "u"}}, kind="Node")
    assert "namespace" not in ref.as_wire()
    assert ref.namespace == "default"  # where the Event itself is written
