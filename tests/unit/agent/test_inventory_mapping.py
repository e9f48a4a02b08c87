"""From readings to the DeviceInventory status: HAMi's registration rules, summary,
conditions, and change detection."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from vgpu_operator import resources
from vgpu_operator.agent import health, inventory
from vgpu_operator.agent.readings import MIB, GpuReading, LinkReading, MachineReading
from vgpu_operator.devices.links import P2PLevel
from vgpu_operator.errors import ConfigError

NOW = datetime(2025, 7, 30, 10, 15, tzinfo=UTC)


def gpu(index: int, **fields: object) -> GpuReading:
    values: dict[str, object] = {
        "index": index,
        "uuid": f"GPU-{index}",
        "name": "NVIDIA A100-SXM4-80GB",
        "memory_total_bytes": 81920 * MIB,
        "pci_bus_id": f"00000000:{0x10 + index:02X}:00.0",
        "numa_node": 0,
        "mig_enabled": False,
    }
    values.update(fields)
    return GpuReading(**values)  # type: ignore[arg-type]


def machine(*gpus: GpuReading, linked: bool = True) -> MachineReading:
    topology = {}
    if linked:
        for a in gpus:
            for b in gpus:
                if a.uuid != b.uuid and a.present and b.present:
                    topology[(a.uuid, b.uuid)] = LinkReading(P2PLevel.SAME_CPU, 12)
    return MachineReading(gpus=gpus, topology=topology, driver_version="550", cuda_version="12.4")


def build(
    reading: MachineReading,
    options: inventory.RegistrationOptions | None = None,
    *,
    count: health.CountCheck | None = None,
    heartbeat: datetime = NOW,
    previous: resources.DeviceInventoryStatus | None = None,
) -> resources.DeviceInventoryStatus:
    present = sum(g.present for g in reading.gpus)
    return inventory.build_status(
        reading,
        node_name="node-a",
        backend="nvml",
        options=options or inventory.RegistrationOptions(),
        count=count or health.check_gpu_count(present, present),
        heartbeat=heartbeat,
        previous=previous,
    )


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        pytest.param("Tesla T4", "NVIDIA-Tesla T4", id="no-prefix"),
        pytest.param("NVIDIA A40", "NVIDIA A40", id="has-prefix"),
        pytest.param("NVIDIA-H100", "NVIDIA-H100", id="dash-prefix"),
        pytest.param("Quadro RTX 8000", "NVIDIA-Quadro RTX 8000", id="quadro"),
        pytest.param("nvidia lowercase", "NVIDIA-nvidia lowercase", id="case-sensitive"),
    ],
)
def test_hami_type_prefixes_only_when_missing(name: str, expected: str) -> None:
    assert inventory.hami_type(name) == expected


@pytest.mark.parametrize(
    ("options", "mig", "memory_mib", "cores", "count"),
    [
        pytest.param(inventory.RegistrationOptions(), False, 81920, 100, 10, id="defaults"),
        pytest.param(
            inventory.RegistrationOptions(split_count=4, memory_scaling=1.5, core_scaling=2.0),
            False,
            122880,
            200,
            4,
            id="scaled-oversubscribed",
        ),
        pytest.param(
            inventory.RegistrationOptions(memory_scaling=0.5, core_scaling=0.5),
            False,
            40960,
            50,
            10,
            id="scaled-down",
        ),
        pytest.param(
            inventory.RegistrationOptions(split_count=7, memory_scaling=2.0, core_scaling=2.0),
            True,
            81920,
            100,
            7,
            id="mig-is-not-scaled",
        ),
    ],
)
def test_registration_follows_the_device_plugin_settings(
    options: inventory.RegistrationOptions, mig: bool, memory_mib: int, cores: int, count: int
) -> None:
    status = build(machine(gpu(0, mig_enabled=mig)), options)
    (device,) = status.devices
    assert (device.memory_mib, device.cores, device.split_count) == (memory_mib, cores, count)
    assert device.mode is (resources.DeviceMode.MIG if mig else resources.DeviceMode.HAMI_CORE)


def test_memory_is_whole_mib_rounded_down() -> None:
    reading = machine(gpu(0, memory_total_bytes=81920 * MIB + MIB - 1))
    assert build(reading).devices[0].memory_mib == 81920


@pytest.mark.parametrize(
    ("field", "value"),
    [
        pytest.param("split_count", 0, id="split-count"),
        pytest.param("memory_scaling", 0.0, id="memory-scaling"),
        pytest.param("core_scaling", -1.0, id="core-scaling"),
    ],
)
def test_registration_options_reject_nonsense(field: str, value: float) -> None:
    with pytest.raises(ConfigError):
        inventory.RegistrationOptions(**{field: value})  # type: ignore[arg-type]


def test_unknown_mig_mode_registers_a_whole_card() -> None:
    (device,) = build(machine(gpu(0, mig_enabled=None))).devices
    assert device.mode is resources.DeviceMode.HAMI_CORE


def test_links_go_to_every_read_peer_with_index_level_and_count() -> None:
    status = build(machine(gpu(0), gpu(1), gpu(2)))
    links = status.devices[1].links
    assert [(link.peer, link.peer_index, link.p2p_level, link.nvlinks) for link in links] == [
        ("GPU-0", 0, P2PLevel.SAME_CPU, 12),
        ("GPU-2", 2, P2PLevel.SAME_CPU, 12),
    ]


def test_summary_counts_cards_health_models_and_memory() -> None:
    reading = machine(
        gpu(0),
        gpu(1, name="NVIDIA A10", memory_total_bytes=23028 * MIB),
        gpu(2, healthy=False, health_reason="critical XID 79"),
    )
    summary = build(reading).summary
    assert summary.gpu_count == 3
    assert summary.healthy_count == 2
    assert summary.model == "NVIDIA A100-SXM4-80GB, NVIDIA A10"
    assert summary.total_memory_mib == 81920 * 2 + 23028


@pytest.mark.parametrize(
    ("gpus", "count", "status", "reason"),
    [
        pytest.param((gpu(0), gpu(1)), (2, 2), "True", "AllDevicesHealthy", id="all-healthy"),
        pytest.param(
            (gpu(0), gpu(1, healthy=False, health_reason="critical XID 48")),
            (2, 2),
            "False",
            "DevicesUnhealthy",
            id="one-unhealthy",
        ),
        pytest.param((), (0, 0), "True", "NoDevices", id="no-gpus-yet"),
        pytest.param(
            (gpu(0, healthy=False, present=False),),
            (1, 0),
            "False",
            "GPUsDisappeared",
            id="all-disappeared",
        ),
        pytest.param(
            (gpu(0, healthy=False, present=False),),
            (0, 0),
            "False",
            "GPUsDisappeared",
            id="still-disappeared-on-later-polls",
        ),
    ],
)
def test_healthy_condition_follows_cards_and_count(
    gpus: tuple[GpuReading, ...], count: tuple[int, int], status: str, reason: str
) -> None:
    result = build(machine(*gpus), count=health.check_gpu_count(*count))
    (condition,) = result.conditions
    assert condition.type == "Healthy"
    assert (condition.status.value, condition.reason) == (status, reason)


def test_condition_keeps_its_transition_time_while_unchanged() -> None:
    first = build(machine(gpu(0)))
    later = NOW + timedelta(minutes=5)
    second = build(machine(gpu(0)), heartbeat=later, previous=first)
    assert second.conditions[0].last_transition_time == NOW
    third = build(
        machine(gpu(0, healthy=False, health_reason="x")),
        heartbeat=later + timedelta(minutes=1),
        previous=second,
    )
    assert third.conditions[0].last_transition_time == later + timedelta(minutes=1)


def test_same_report_ignores_heartbeat_and_transition_times_only() -> None:
    first = build(machine(gpu(0)))
    assert inventory.same_report(first, build(machine(gpu(0)), heartbeat=NOW + timedelta(hours=1)))
    assert not inventory.same_report(None, first)
    changed = build(machine(gpu(0, numa_node=1)))
    assert not inventory.same_report(first, changed)
    unhealthy = build(machine(gpu(0, healthy=False, health_reason="lost")))
    assert not inventory.same_report(first, unhealthy)


def test_telemetry_does_not_count_as_a_change() -> None:
    busy = replace(gpu(0), utilization_ratio=0.9, memory_used_bytes=MIB, temperature_celsius=80)
    assert inventory.same_report(build(machine(gpu(0))), build(machine(busy)))


def test_wire_status_nulls_absent_top_level_fields_for_merge_patches() -> None:
    reading = MachineReading(gpus=(gpu(0, pci_bus_id=None, numa_node=None),))
    wire = resources.status_to_wire(build(reading))
    assert wire["driverVersion"] is None
    assert wire["cudaVersion"] is None
    device = wire["devices"][0]
    # Inside lists nothing needs a null: merge patches replace lists whole.
    assert "numaNode" not in device
    assert "pciBusId" not in device
    assert wire["heartbeat"] == "2025-07-30T10:15:00Z"
    assert wire["summary"] == {
        "gpuCount": 1,
        "healthyCount": 1,
        "model": "NVIDIA A100-SXM4-80GB",
        "totalMemoryMiB": 81920,
    }
