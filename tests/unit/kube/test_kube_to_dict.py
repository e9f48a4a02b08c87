"""kube.client.to_dict: library model objects become the API server's JSON shape."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from kubernetes_asyncio import client

from vgpu_operator.kube.client import to_dict


def test_models_use_wire_names_and_drop_unset_fields() -> None:
    node = client.V1Node(
        metadata=client.V1ObjectMeta(
            name="gpu-0",
            uid="u-1",
            creation_timestamp=datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC),
            annotations={"hami.io/node-handshake": "Requesting_x"},
        ),
        status=client.V1NodeStatus(allocatable={"nvidia.com/gpu": "8"}),
    )
    assert to_dict(node) == {
        "metadata": {
            "name": "gpu-0",
            "uid": "u-1",
            "creationTimestamp": "2025-01-02T03:04:05+00:00",
            "annotations": {"hami.io/node-handshake": "Requesting_x"},
        },
        "status": {"allocatable": {"nvidia.com/gpu": "8"}},
    }


@pytest.mark.parametrize(
    "value",
    [
        pytest.param({"a": [1, {"b": None}]}, id="plain-dict"),
        pytest.param([1, "x", True, None], id="plain-list"),
        pytest.param("text", id="string"),
    ],
)
def test_plain_data_passes_through(value: object) -> None:
    assert to_dict(value) == value


def test_lists_of_models_are_converted() -> None:
    items = [client.V1ObjectMeta(name="a"), client.V1ObjectMeta(name="b")]
    assert to_dict(items) == [{"name": "a"}, {"name": "b"}]


def test_unknown_objects_are_refused() -> None:
    with pytest.raises(TypeError, match="object"):
        to_dict(object())
