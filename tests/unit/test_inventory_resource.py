"""The DeviceInventory resource as the operator reads it: devices_from_inventory and
friends, the CRD rendering, and the manifest the agent creates."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vgpu_operator import names, resources
from vgpu_operator.devices import links, model
from vgpu_operator.errors import CodecError
from vgpu_operator.kube import inventory as kube_inventory


def wire_device(index: int, **fields: Any) -> dict[str, Any]:
    device: dict[str, Any] = {
        "uuid": f"GPU-{index}",
        "index": index,
        "vendor": "NVIDIA",
        "model": "Tesla T4",
        "type": "NVIDIA-Tesla T4",
        "memoryMiB": 15360,
        "cores": 100,
        "splitCount": 10,
        "numaNode": index % 2,
        "pciBusId": f"00000000:{0x10 + index:02X}:00.0",
        "health": "Healthy",
        "mode": "hami-core",
        "links": [],
    }
    device.update(fields)
    return device


def inventory_object(devices: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": resources.API_VERSION,
        "kind": names.DEVICE_INVENTORY_KIND,
        "metadata": {"name": "node-a", "resourceVersion": "7"},
        "spec": spec,
        "status": {
            "nodeName": "node-a",
            "backend": "nvml",
            "heartbeat": "2025-07-30T10:15:00Z",
            "devices": devices,
            "summary": {"gpuCount": len(devices), "healthyCount": 0, "totalMemoryMiB": 0},
        },
    }


def linked_pair(level: str, a_to_b: int, b_to_a: int) -> list[dict[str, Any]]:
    return [
        wire_device(
            0, links=[{"peer": "GPU-1", "peerIndex": 1, "p2pLevel": level, "nvlinks": a_to_b}]
        ),
        wire_device(
            1, links=[{"peer": "GPU-0", "peerIndex": 0, "p2pLevel": level, "nvlinks": b_to_a}]
        ),
    ]


def test_devices_are_what_hami_would_register() -> None:
    obj = inventory_object(
        [
            wire_device(0),
            wire_device(
                1,
                health="Unhealthy",
                healthReason="critical XID 79",
                mode="mig",
                numaNode=None,
                cores=200,
                splitCount=4,
                memoryMiB=30720,
            ),
        ]
    )
    devices, _ = resources.devices_from_inventory(obj)
    assert devices == [
        model.DeviceInfo(
            id="GPU-0",
            index=0,
            count=10,
            memory_mib=15360,
            cores=100,
            type="NVIDIA-Tesla T4",
            numa=0,
            health=True,
            mode="hami-core",
            vendor="NVIDIA",
        ),
        model.DeviceInfo(
            id="GPU-1",
            index=1,
            count=4,
            memory_mib=30720,
            cores=200,
            type="NVIDIA-Tesla T4",
            numa=0,  # unknown NUMA registers as 0, as in HAMi
            health=False,
            mode="mig",
            vendor="NVIDIA",
        ),
    ]


@pytest.mark.parametrize(
    ("level", "a_to_b", "b_to_a", "score"),
    [
        pytest.param("HostBridge", 12, 12, 30 + 1200, id="hami-example-1230"),
        pytest.param("CrossCPU", 0, 0, 10, id="pcie-only"),
        pytest.param("SameBoard", 18, 18, 60 + 1800, id="eighteen-links"),
        pytest.param("SameCPU", 4, 0, 0, id="asymmetric-nvlink-scores-zero"),
        pytest.param("Unknown", 0, 0, 0, id="unknown-level"),
    ],
)
def test_pair_scores_follow_hami_rules(level: str, a_to_b: int, b_to_a: int, score: int) -> None:
    _, scores = resources.devices_from_inventory(
        inventory_object(linked_pair(level, a_to_b, b_to_a))
    )
    assert scores["GPU-0"]["GPU-1"] == score
    assert scores["GPU-1"]["GPU-0"] == score


def test_pair_scores_cover_every_pair_even_without_links() -> None:
    _, scores = resources.devices_from_inventory(inventory_object([wire_device(0), wire_device(1)]))
    assert scores == {"GPU-0": {"GPU-1": 0}, "GPU-1": {"GPU-0": 0}}


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        pytest.param(lambda o: o.pop("status"), "status", id="no-status-yet"),
        pytest.param(lambda o: o["metadata"].pop("name"), "metadata.name", id="no-name"),
        pytest.param(
            lambda o: o["status"]["devices"][0].update(memoryMiB=-1),
            "memoryMiB",
            id="negative-memory",
        ),
        pytest.param(
            lambda o: o["status"]["devices"][0].update(health="Sick"), "health", id="bad-health"
        ),
        pytest.param(lambda o: o["status"]["devices"][0].pop("uuid"), "uuid", id="missing-uuid"),
        pytest.param(
            lambda o: o["status"]["devices"][0].update(
                links=[{"peer": "GPU-1", "peerIndex": 1, "p2pLevel": "Warp", "nvlinks": 0}]
            ),
            "p2pLevel",
            id="bad-link-level",
        ),
        pytest.param(
            lambda o: o["status"]["devices"].append(wire_device(0)),
            "status.devices",
            id="repeated-uuid",
        ),
        pytest.param(
            lambda o: o["status"].update(heartbeat="yesterday"), "heartbeat", id="bad-heartbeat"
        ),
    ],
)
def test_malformed_inventory_raises_codec_error_naming_the_field(mutate: Any, field: str) -> None:
    obj = inventory_object([wire_device(0), wire_device(1)])
    mutate(obj)
    with pytest.raises(CodecError) as caught:
        resources.devices_from_inventory(obj)
    assert field in caught.value.field


def test_cordoned_devices_and_heartbeat_are_read_from_the_object() -> None:
    obj = inventory_object([wire_device(0)], cordonedDevices=["GPU-0", "GPU-9"])
    assert resources.cordoned_devices(obj) == frozenset({"GPU-0", "GPU-9"})
    assert resources.heartbeat_of(obj) == datetime(2025, 7, 30, 10, 15, tzinfo=UTC)
    bare = {"metadata": {"name": "node-a"}}
    assert resources.cordoned_devices(bare) == frozenset()
    assert resources.heartbeat_of(bare) is None


def test_unknown_fields_from_a_newer_agent_are_ignored() -> None:
    obj = inventory_object([wire_device(0, futureField=1)])
    obj["status"]["somethingNew"] = {"x": 1}
    devices, _ = resources.devices_from_inventory(obj)
    assert [d.id for d in devices] == ["GPU-0"]


_levels = st.sampled_from(list(links.P2PLevel))


@st.composite
def statuses(draw: st.DrawFn) -> resources.DeviceInventoryStatus:
    """Small, valid statuses: up to four cards with links to each other."""
    count = draw(st.integers(0, 4))
    uuids = [f"GPU-{i}" for i in range(count)]
    devices = []
    for i, uuid in enumerate(uuids):
        devices.append(
            resources.Device(
                uuid=uuid,
                index=i,
                model="NVIDIA H100",
                type="NVIDIA H100",
                memory_mib=draw(st.integers(0, 200_000)),
                cores=draw(st.integers(0, 400)),
                split_count=draw(st.integers(1, 64)),
                numa_node=draw(st.none() | st.integers(0, 7)),
                health=draw(st.sampled_from(list(resources.DeviceHealth))),
                mode=draw(st.sampled_from(list(resources.DeviceMode))),
                links=tuple(
                    resources.Link(
                        peer=peer,
                        peer_index=j,
                        p2p_level=draw(_levels),
                        nvlinks=draw(st.integers(0, 18)),
                    )
                    for j, peer in enumerate(uuids)
                    if peer != uuid
                ),
            )
        )
    return resources.DeviceInventoryStatus(
        node_name="node-a",
        heartbeat=datetime(2025, 1, 1, tzinfo=UTC),
        devices=tuple(devices),
        summary=resources.InventorySummary(gpu_count=count, healthy_count=0, total_memory_mib=0),
        driver_version=draw(st.none() | st.just("550.1")),
    )


@given(statuses())
def test_status_survives_the_wire(status: resources.DeviceInventoryStatus) -> None:
    obj = {"metadata": {"name": "node-a"}, "status": resources.status_to_wire(status)}
    parsed = resources.parse_inventory(obj).status
    assert parsed == status
    devices, scores = resources.devices_from_inventory(obj)
    assert [d.id for d in devices] == [d.uuid for d in status.devices]
    assert set(scores) == {d.uuid for d in status.devices}
    for device in status.devices:
        for link in device.links:
            peer_links = status.devices[link.peer_index].links
            back = next(other for other in peer_links if other.peer == device.uuid)
            expected = links.symmetric_pair_score(
                link.p2p_level, link.nvlinks, back.nvlinks, level_b_to_a=back.p2p_level
            )
            assert scores[device.uuid][link.peer] == expected


# --- the CRD --------------------------------------------------------------------------


def _version(crd: dict[str, Any]) -> dict[str, Any]:
    (version,) = crd["spec"]["versions"]
    return version


def test_crd_names_and_scope() -> None:
    crd = resources.render_crd()
    assert crd["metadata"]["name"] == "deviceinventories.vgpu-operator.io"
    spec = crd["spec"]
    assert spec["group"] == "vgpu-operator.io"
    assert spec["scope"] == "Cluster"
    assert spec["names"]["kind"] == "DeviceInventory"
    assert spec["names"]["shortNames"] == ["dinv"]
    version = _version(crd)
    assert version["name"] == "v1alpha1"
    assert version["subresources"] == {"status": {}}


def test_crd_columns_show_node_counts_model_memory_and_last_report_age() -> None:
    columns = {c["name"]: c for c in _version(resources.render_crd())["additionalPrinterColumns"]}
    assert columns["Node"]["jsonPath"] == ".status.nodeName"
    assert columns["GPUs"]["jsonPath"] == ".status.summary.gpuCount"
    assert columns["Healthy"]["jsonPath"] == ".status.summary.healthyCount"
    assert columns["Model"]["jsonPath"] == ".status.summary.model"
    assert columns["Memory MiB"]["jsonPath"] == ".status.summary.totalMemoryMiB"
    # status.heartbeat moves only with a report now: the column must not promise liveness,
    # and says where liveness is.
    assert "Heartbeat" not in columns
    report = columns["Last Report"]
    assert (report["type"], report["jsonPath"]) == ("date", ".status.heartbeat")
    assert "kubectl get leases -n vgpu-node-leases" in report["description"]


def _walk(schema: Any) -> list[dict[str, Any]]:
    found = []
    if isinstance(schema, dict):
        found.append(schema)
        for value in schema.values():
            found.extend(_walk(value))
    elif isinstance(schema, list):
        for value in schema:
            found.extend(_walk(value))
    return found


def test_crd_schema_is_structural() -> None:
    schema = _version(resources.render_crd())["schema"]["openAPIV3Schema"]
    for node in _walk(schema):
        assert "$ref" not in node
        assert "anyOf" not in node
        assert "title" not in node
        assert "default" not in node
        if "properties" in node:
            assert node.get("type") == "object"
            assert "additionalProperties" not in node
    device = schema["properties"]["status"]["properties"]["devices"]["items"]
    for name, prop in device["properties"].items():
        assert "type" in prop, name


def test_crd_schema_rejects_malformed_reports() -> None:
    status = _version(resources.render_crd())["schema"]["openAPIV3Schema"]["properties"]["status"]
    device = status["properties"]["devices"]["items"]
    props = device["properties"]
    assert set(status["required"]) >= {"nodeName", "heartbeat", "summary"}
    assert set(device["required"]) >= {
        "uuid",
        "index",
        "type",
        "memoryMiB",
        "cores",
        "splitCount",
        "health",
    }
    assert props["memoryMiB"]["minimum"] == 0
    assert props["splitCount"]["minimum"] == 1
    assert props["health"]["enum"] == ["Healthy", "Unhealthy"]
    assert props["mode"]["enum"] == ["hami-core", "mig", "mps"]
    assert props["numaNode"]["nullable"] is True
    assert set(props["links"]["items"]["properties"]["p2pLevel"]["enum"]) == {
        level.value for level in links.P2PLevel
    }
    assert status["properties"]["heartbeat"]["format"] == "date-time"


def test_agent_creates_an_inventory_owned_by_its_node() -> None:
    manifest = kube_inventory.inventory_manifest("gpu-node-1", "uid-123")
    assert manifest["apiVersion"] == "vgpu-operator.io/v1alpha1"
    assert manifest["kind"] == "DeviceInventory"
    assert manifest["metadata"]["name"] == "gpu-node-1"
    assert manifest["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "gpu-node-1", "uid": "uid-123"}
    ]
    assert "status" not in manifest


def test_parse_does_not_modify_its_input() -> None:
    obj = inventory_object([wire_device(0)])
    before = copy.deepcopy(obj)
    resources.devices_from_inventory(obj)
    assert obj == before
