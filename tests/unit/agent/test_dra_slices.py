"""The DRA driver's slice: the same cards, memory and split count as the DeviceInventory,
one shareable device per card with HAMi's defaults, a taint on a sick card, and the pool
generation moving only when the devices change."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from vgpu_operator import dra_shapes as shapes
from vgpu_operator import resources
from vgpu_operator.agent import health, inventory, nodeconfig
from vgpu_operator.agent.dra import sysfs
from vgpu_operator.agent.dra.publisher import SlicePublisher
from vgpu_operator.agent.readings import MIB, GpuReading, LinkReading, MachineReading
from vgpu_operator.config import load_config_yaml
from vgpu_operator.devices import dra
from vgpu_operator.devices.links import P2PLevel

NOW = datetime(2026, 11, 1, tzinfo=UTC)


def gpu(index: int, **fields: object) -> GpuReading:
    values: dict[str, object] = {
        "index": index,
        "uuid": f"GPU-{index:08x}-aaaa-bbbb-cccc-{index:012x}",
        "name": "NVIDIA H100 80GB HBM3",
        "memory_total_bytes": 81559 * MIB,
        "pci_bus_id": f"00000000:{0x10 + index:02X}:00.0",
        "numa_node": index // 4,
        "mig_enabled": False,
    }
    values.update(fields)
    return GpuReading(**values)  # type: ignore[arg-type]


def status_of(
    reading: MachineReading, config: nodeconfig.NodeConfig | None = None
) -> resources.DeviceInventoryStatus:
    node_config = config or nodeconfig.from_flags(inventory.RegistrationOptions())
    selection = nodeconfig.select(reading, node_config)
    return inventory.build_status(
        selection.reading,
        node_name="node-a",
        backend="sim:test",
        options=node_config.registration,
        count=health.CountCheck(reported=len(reading.gpus), healthy=True, refresh=False),
        heartbeat=NOW,
    )


def nvlinked(gpus: tuple[GpuReading, ...], pairs: set[tuple[int, int]]) -> MachineReading:
    topology = {}
    for a in gpus:
        for b in gpus:
            if a.index == b.index:
                continue
            links = 12 if (a.index, b.index) in pairs or (b.index, a.index) in pairs else 0
            topology[(a.uuid, b.uuid)] = LinkReading(P2PLevel.SAME_CPU, links)
    return MachineReading(gpus=gpus, topology=topology)


def test_each_card_is_one_shareable_device_with_the_inventorys_numbers() -> None:
    config = load_config_yaml(
        """
nvidia:
  defaultMemory: 0
  defaultCores: 0
nodeconfig:
  - name: node-a
    devicesplitcount: 4
    devicememoryscaling: 2
    filterdevices:
      index: [1]
"""
    )
    node_config = nodeconfig.resolve(config, "node-a", inventory.RegistrationOptions())
    status = status_of(MachineReading(gpus=(gpu(0), gpu(1), gpu(2))), node_config)
    cards = shapes.card_shapes(status.devices, shapes.RequestDefaults())
    # nodeconfig's filter leaves card 1 out of both the inventory and the slice.
    assert [c.index for c in cards] == [d.index for d in status.devices] == [0, 2]
    device = dra.device_wire(cards[0])
    assert device["name"] == cards[0].uuid.lower()
    assert device["allowMultipleAllocations"] is True
    capacity = device["capacity"]
    # Scaled memory, as the inventory reports it: 81559 MiB x 2.
    assert status.devices[0].memory_mib == 163118
    assert capacity["memory"]["value"] == "163118Mi"
    assert capacity["memory"]["requestPolicy"]["validRange"] == {
        "min": "1Mi",
        "max": "163118Mi",
        "step": "1Mi",
    }
    assert capacity["cores"]["value"] == "100"
    assert capacity["shares"] == {
        "value": "4",
        "requestPolicy": {"default": "1", "validValues": ["1"]},
    }
    attributes = device["attributes"]
    assert attributes["uuid"] == {"string": cards[0].uuid}
    assert attributes["productName"] == {"string": "NVIDIA H100 80GB HBM3"}
    assert attributes["type"] == {"string": "NVIDIA H100 80GB HBM3"}
    assert attributes["index"] == {"int": 0}
    assert attributes["mode"] == {"string": "hami-core"}
    assert attributes["resource.kubernetes.io/numaNode"] == {"int": 0}
    # The kernel's form, as Kubernetes' standard attribute has it (NVML says 00000000:10:00.0).
    assert attributes["resource.kubernetes.io/pciBusID"] == {"string": "0000:10:00.0"}
    assert "taints" not in device


def test_request_defaults_are_hamis_count_only_request() -> None:
    card = shapes.card_shapes(
        status_of(MachineReading(gpus=(gpu(0),))).devices, shapes.RequestDefaults(0, 0)
    )[0]
    whole = dra.device_wire(card)["capacity"]
    # defaultMemory 0: a claim that names no memory gets the whole card, as HAMi does.
    assert whole["memory"]["requestPolicy"]["default"] == "81559Mi"
    assert whole["cores"]["requestPolicy"]["default"] == "0"
    card = shapes.card_shapes(
        status_of(MachineReading(gpus=(gpu(0),))).devices, shapes.RequestDefaults(8192, 30)
    )[0]
    shared = dra.device_wire(card)["capacity"]
    assert shared["memory"]["requestPolicy"]["default"] == "8192Mi"
    assert shared["cores"]["requestPolicy"]["default"] == "30"


def test_a_sick_card_is_tainted_not_dropped() -> None:
    reading = MachineReading(gpus=(gpu(0), gpu(1).unhealthy("XID 79: fallen off the bus")))
    devices = [
        dra.device_wire(c)
        for c in shapes.card_shapes(status_of(reading).devices, shapes.RequestDefaults())
    ]
    assert len(devices) == 2
    assert "taints" not in devices[0]
    assert devices[1]["taints"] == [
        {
            "key": "gpu.vgpu-operator.io/unhealthy",
            "value": "XID-79-fallen-off-the-bus",
            "effect": "NoSchedule",
        }
    ]


def test_mig_cards_are_left_out() -> None:
    reading = MachineReading(gpus=(gpu(0), gpu(1, mig_enabled=True)))
    assert [
        c.index for c in shapes.card_shapes(status_of(reading).devices, shapes.RequestDefaults())
    ] == [0]


def test_nvlink_islands_are_the_lowest_index_each_card_reaches() -> None:
    gpus = tuple(gpu(i) for i in range(5))
    reading = nvlinked(gpus, {(0, 1), (1, 2), (3, 4)})
    cards = shapes.card_shapes(status_of(reading).devices, shapes.RequestDefaults())
    assert [c.nvlink_island for c in cards] == [0, 0, 0, 3, 3]
    lonely = shapes.card_shapes(
        status_of(nvlinked(gpus[:2], set())).devices, shapes.RequestDefaults()
    )
    assert [c.nvlink_island for c in lonely] == [None, None]
    assert "nvlinkIsland" not in dra.device_wire(lonely[0])["attributes"]


def test_pcie_root_comes_from_the_sysfs_link(tmp_path: Any) -> None:
    root = tmp_path / "devices" / "pci0000:3a" / "0000:3a:00.0" / "0000:3b:00.0"
    root.mkdir(parents=True)
    links = tmp_path / "bus" / "pci" / "devices"
    links.mkdir(parents=True)
    (links / "0000:3b:00.0").symlink_to(root)
    assert sysfs.pcie_root("00000000:3B:00.0", tmp_path) == "pci0000:3a"
    assert sysfs.pcie_root("00000000:3C:00.0", tmp_path) is None
    assert sysfs.pcie_root("garbage", tmp_path) is None


def test_slice_is_the_nodes_one_pool_owned_by_its_inventory() -> None:
    cards = shapes.card_shapes(
        status_of(MachineReading(gpus=(gpu(0),))).devices, shapes.RequestDefaults()
    )
    owner = {
        "apiVersion": "vgpu-operator.io/v1",
        "kind": "DeviceInventory",
        "name": "node-a",
        "uid": "u",
    }
    body = dra.slice_wire("node-a", cards, 7, owner)
    assert body["apiVersion"] == "resource.k8s.io/v1"
    assert body["metadata"]["ownerReferences"] == [owner]
    assert body["spec"]["driver"] == "gpu.vgpu-operator.io"
    assert body["spec"]["nodeName"] == "node-a"
    assert body["spec"]["pool"] == {"name": "node-a", "generation": 7, "resourceSliceCount": 1}


class FakeStore:
    def __init__(self, existing: list[dict[str, Any]] | None = None) -> None:
        self.slices: dict[str, dict[str, Any]] = {s["metadata"]["name"]: s for s in existing or []}
        self.puts: list[dict[str, Any]] = []

    async def list_slices(self, driver: str, node: str) -> list[dict[str, Any]]:
        return list(self.slices.values())

    async def put_slice(self, wanted: Mapping[str, Any]) -> None:
        self.puts.append(dict(wanted))
        self.slices[wanted["metadata"]["name"]] = dict(wanted)

    async def delete_slice(self, name: str) -> None:
        self.slices.pop(name, None)

    async def owner(self, node: str) -> Mapping[str, Any] | None:
        return None


def test_generation_moves_on_each_change_and_only_then() -> None:
    stale = {"metadata": {"name": "old-name"}, "spec": {"pool": {"generation": 4}}}
    store = FakeStore([stale])
    publisher = SlicePublisher("node-a", store, shapes.RequestDefaults())

    async def scenario() -> list[int]:
        publisher.set_status(status_of(MachineReading(gpus=(gpu(0), gpu(1)))))
        assert await publisher.publish()
        publisher.set_status(status_of(MachineReading(gpus=(gpu(0), gpu(1)))))
        assert not await publisher.publish()  # nothing changed: no write
        publisher.set_status(status_of(MachineReading(gpus=(gpu(0), gpu(1).unhealthy("XID 48")))))
        assert await publisher.publish()
        publisher.set_defaults(shapes.RequestDefaults(4096, 0))
        assert await publisher.publish()
        return [p["spec"]["pool"]["generation"] for p in store.puts]

    # Above any generation the server holds for the pool, then one more per change.
    assert asyncio.run(scenario()) == [5, 6, 7]
    assert "old-name" not in store.slices
    assert set(publisher.cards()) == {gpu(0).uuid.lower(), gpu(1).uuid.lower()}


@pytest.mark.parametrize("uuid", ["GPU-Ü", "GPU_with_underscore", ""])
def test_a_uuid_that_makes_no_device_name_is_refused(uuid: str) -> None:
    from vgpu_operator.errors import CodecError

    with pytest.raises(CodecError):
        dra.device_name(uuid)


def test_the_deviceclass_manifests_are_the_drivers_own() -> None:
    import yaml

    path = Path(__file__).resolve().parents[3] / "manifests" / "dra-deviceclasses.yaml"
    assert list(yaml.safe_load_all(path.read_text())) == dra.device_classes()
    assert [c["metadata"]["name"] for c in dra.device_classes()] == [
        dra.SHARED_CLASS,
        dra.EXCLUSIVE_CLASS,
        dra.MIG_CLASS,
    ]


def test_a_slice_deleted_on_the_server_is_written_again_one_generation_up() -> None:
    store = FakeStore()
    publisher = SlicePublisher("node-a", store, shapes.RequestDefaults())

    async def scenario() -> list[int]:
        publisher.set_status(status_of(MachineReading(gpus=(gpu(0),))))
        assert await publisher.publish()
        await publisher.check_server_copy()
        assert not await publisher.publish()  # the server holds it as written
        store.slices.clear()  # kubelet wipes the node's slices when it starts
        await publisher.check_server_copy()
        assert await publisher.publish()
        return [p["spec"]["pool"]["generation"] for p in store.puts]

    assert asyncio.run(scenario()) == [1, 2]


def test_nothing_is_published_before_the_first_status() -> None:
    store = FakeStore()
    publisher = SlicePublisher("node-a", store, shapes.RequestDefaults())
    assert not asyncio.run(publisher.publish())
    assert store.puts == []


def test_a_lost_card_is_tainted_no_execute_under_its_own_key() -> None:
    carried = health.carry_disappeared(
        (gpu(0), gpu(1).unhealthy(health.OFF_THE_BUS_REASON)),
        {g.uuid: g for g in (gpu(0), gpu(1), gpu(2).unhealthy("critical XID 48"))},
    )
    reading = MachineReading(gpus=carried)
    cards = shapes.card_shapes(status_of(reading).devices, shapes.RequestDefaults())
    assert [(c.index, c.healthy, c.lost) for c in cards] == [
        (0, True, False),
        (1, False, True),
        (2, False, True),
    ]
    taints = [dra.device_wire(c).get("taints") for c in cards]
    assert taints == [
        None,
        [{"key": "gpu.vgpu-operator.io/lost", "value": "GPU-is-lost-fell-off-the-bus",
          "effect": "NoExecute"}],
        [{"key": "gpu.vgpu-operator.io/lost",
          "value": "GPU-disappeared-NVML-no-longer-reports-it", "effect": "NoExecute"}],
    ]  # fmt: skip
