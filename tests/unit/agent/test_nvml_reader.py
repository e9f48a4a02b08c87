"""NvmlReader over a fake of the pynvml module: the real binding's constants and error
classes, with functions answered from a machine description (no GPU needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from agent_fakes import fake_pynvml, machine_dict, nvml_error

from vgpu_operator.agent import health, nvml
from vgpu_operator.agent.readings import MIB
from vgpu_operator.agent.sim_machine import SimMachine
from vgpu_operator.devices.links import P2PLevel


def open_reader(module: Any, **kwargs: Any) -> nvml.NvmlReader:
    reader = nvml.NvmlReader(module, **kwargs)
    reader.open()
    return reader


def no_sysfs(bus_id: str) -> int | None:
    return None


# --- small pure helpers ------------------------------------------------------------


@pytest.mark.parametrize(
    ("nvml_bus_id", "expected"),
    [
        pytest.param("00000000:3B:00.0", "0000:3b:00.0", id="8-digit-domain"),
        pytest.param("0000:3b:00.0", "0000:3b:00.0", id="already-sysfs-form"),
        pytest.param(" 00000001:AF:00.1 ", "0001:af:00.1", id="other-domain-trimmed"),
    ],
)
def test_sysfs_bus_id_matches_sysfs_names(nvml_bus_id: str, expected: str) -> None:
    assert nvml.sysfs_bus_id(nvml_bus_id) == expected


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        pytest.param("1\n", 1, id="socket-1"),
        pytest.param("0", 0, id="socket-0"),
        pytest.param("-1\n", None, id="unknown"),
        pytest.param("garbage", None, id="unparsable"),
        pytest.param(None, None, id="no-such-device"),
    ],
)
def test_sysfs_numa_node_reads_the_pci_device(
    tmp_path: Path, content: str | None, expected: int | None
) -> None:
    device = tmp_path / "bus" / "pci" / "devices" / "0000:3b:00.0"
    if content is not None:
        device.mkdir(parents=True)
        (device / "numa_node").write_text(content)
    assert nvml.read_sysfs_numa_node("00000000:3B:00.0", tmp_path) == expected


@pytest.mark.parametrize(
    ("name", "profile"),
    [
        pytest.param("NVIDIA A100-SXM4-40GB MIG 1g.5gb", "1g.5gb", id="a100"),
        pytest.param("NVIDIA H100 80GB HBM3 MIG 3g.40gb", "3g.40gb", id="h100"),
        pytest.param("NVIDIA A100-SXM4-40GB", None, id="not-a-mig-name"),
    ],
)
def test_mig_profile_comes_from_the_instance_name(name: str, profile: str | None) -> None:
    assert nvml.mig_profile_from_name(name) == profile


@pytest.mark.parametrize(
    ("version", "text"),
    [pytest.param(12040, "12.4", id="12.4"), pytest.param(11080, "11.8", id="11.8")],
)
def test_cuda_version_is_major_dot_minor(version: int, text: str) -> None:
    assert nvml.cuda_version_text(version) == text


# --- reading cards -------------------------------------------------------------------


def test_reading_maps_every_basic_field() -> None:
    module = fake_pynvml(
        machine_dict(
            1,
            driverVersion="550.54.15",
            cudaVersion="12.4",
            defaults={
                "name": "NVIDIA A10",
                "memoryMiB": 23028,
                "numaNode": 1,
                "memoryUsedMiB": 100,
                "utilization": 0.25,
                "temperatureC": 41,
                "powerW": 60.5,
            },
        )
    )
    reading = open_reader(module, numa_from_bus_id=no_sysfs).read()
    (gpu,) = reading.gpus
    assert (gpu.index, gpu.uuid, gpu.name) == (0, "GPU-test-0", "NVIDIA A10")
    assert gpu.memory_total_bytes == 23028 * MIB
    assert gpu.memory_total_mib == 23028
    assert gpu.pci_bus_id == "00000000:10:00.0"
    assert gpu.numa_node == 1
    assert gpu.mig_enabled is False
    assert gpu.healthy
    assert gpu.present
    assert gpu.memory_used_bytes == 100 * MIB
    assert gpu.utilization_ratio == pytest.approx(0.25)
    assert gpu.temperature_celsius == 41
    assert gpu.power_watts == pytest.approx(60.5)
    assert (reading.driver_version, reading.cuda_version) == ("550.54.15", "12.4")


@pytest.mark.parametrize(
    ("how", "sysfs_answer", "expected"),
    [
        pytest.param("unsupported", 1, 1, id="not-supported-falls-back-to-sysfs"),
        pytest.param("absent", 1, 1, id="old-binding-falls-back-to-sysfs"),
        pytest.param("unsupported", None, None, id="sysfs-unknown-too"),
    ],
)
def test_numa_degrades_to_sysfs_then_unknown(
    how: str, sysfs_answer: int | None, expected: int | None
) -> None:
    module = fake_pynvml(machine_dict(1, **{how: ["nvmlDeviceGetNumaNodeId"]}))
    asked: list[str] = []

    def sysfs(bus_id: str) -> int | None:
        asked.append(bus_id)
        return sysfs_answer

    (gpu,) = open_reader(module, numa_from_bus_id=sysfs).read().gpus
    assert gpu.numa_node == expected
    assert asked == ["00000000:10:00.0"]


@pytest.mark.parametrize(
    "calls",
    [
        pytest.param(["nvmlDeviceGetPciInfo"], id="pci"),
        pytest.param(["nvmlDeviceGetMigMode"], id="mig-mode"),
        pytest.param(["nvmlDeviceGetUtilizationRates"], id="utilisation"),
        pytest.param(["nvmlDeviceGetTemperature", "nvmlDeviceGetPowerUsage"], id="sensors"),
        pytest.param(["nvmlSystemGetDriverVersion"], id="driver-version"),
        pytest.param(["nvmlSystemGetCudaDriverVersion"], id="cuda-version"),
        pytest.param(["nvmlDeviceGetTopologyCommonAncestor"], id="topology"),
        pytest.param(["nvmlDeviceGetNvLinkState"], id="nvlink"),
    ],
)
@pytest.mark.parametrize("how", ["unsupported", "absent"])
def test_unsupported_or_absent_calls_read_as_unknown(calls: list[str], how: str) -> None:
    module = fake_pynvml(machine_dict(2, **{how: calls}))
    reading = open_reader(module, numa_from_bus_id=no_sysfs).read()
    assert len(reading.gpus) == 2
    assert all(gpu.healthy for gpu in reading.gpus)
    first = reading.gpus[0]
    unknown = {
        "nvmlDeviceGetPciInfo": first.pci_bus_id,
        "nvmlDeviceGetMigMode": first.mig_enabled,
        "nvmlDeviceGetUtilizationRates": first.utilization_ratio,
        "nvmlDeviceGetTemperature": first.temperature_celsius,
        "nvmlDeviceGetPowerUsage": first.power_watts,
        "nvmlSystemGetDriverVersion": reading.driver_version,
        "nvmlSystemGetCudaDriverVersion": reading.cuda_version,
    }
    for call in calls:
        if call in unknown:
            assert unknown[call] is None, call
    link = reading.topology[("GPU-test-0", "GPU-test-1")]
    if "nvmlDeviceGetTopologyCommonAncestor" in calls:
        assert link.p2p_level is P2PLevel.UNKNOWN
    if "nvmlDeviceGetNvLinkState" in calls:
        assert link.nvlinks == 0


def test_old_binding_strings_as_bytes_are_decoded() -> None:
    module = fake_pynvml(machine_dict(1))
    text_calls = ("nvmlDeviceGetUUID", "nvmlDeviceGetName", "nvmlSystemGetDriverVersion")
    for name in text_calls:
        original = getattr(module, name)
        setattr(module, name, lambda *a, _f=original: _f(*a).encode())
    reading = open_reader(module, numa_from_bus_id=no_sysfs).read()
    assert reading.gpus[0].uuid == "GPU-test-0"
    assert reading.gpus[0].name == "NVIDIA A10"
    assert reading.driver_version == "550.90.07"


def test_unknown_topology_value_reads_as_unknown_level() -> None:
    module = fake_pynvml(machine_dict(2))
    module.nvmlDeviceGetTopologyCommonAncestor = lambda a, b: 70
    reading = open_reader(module, numa_from_bus_id=no_sysfs).read()
    assert reading.topology[("GPU-test-0", "GPU-test-1")].p2p_level is P2PLevel.UNKNOWN


@pytest.mark.parametrize(
    ("level", "expected"),
    [
        pytest.param("SameBoard", P2PLevel.SAME_BOARD, id="internal"),
        pytest.param("SingleSwitch", P2PLevel.SINGLE_SWITCH, id="single"),
        pytest.param("MultiSwitch", P2PLevel.MULTI_SWITCH, id="multiple"),
        pytest.param("HostBridge", P2PLevel.HOST_BRIDGE, id="hostbridge"),
        pytest.param("SameCPU", P2PLevel.SAME_CPU, id="node"),
        pytest.param("CrossCPU", P2PLevel.CROSS_CPU, id="system"),
    ],
)
def test_common_ancestor_maps_to_hami_link_type(level: str, expected: P2PLevel) -> None:
    module = fake_pynvml(machine_dict(2, pcie=[{"gpus": [0, 1], "level": level}]))
    topology = open_reader(module, numa_from_bus_id=no_sysfs).read().topology
    assert topology[("GPU-test-0", "GPU-test-1")].p2p_level is expected
    assert topology[("GPU-test-1", "GPU-test-0")].p2p_level is expected


def test_other_nvml_errors_of_optional_calls_read_as_unknown() -> None:
    module = fake_pynvml(machine_dict(1))

    def broken(handle: Any) -> Any:
        raise nvml_error("UNKNOWN")

    module.nvmlDeviceGetUtilizationRates = broken
    (gpu,) = open_reader(module, numa_from_bus_id=no_sysfs).read().gpus
    assert gpu.utilization_ratio is None
    assert gpu.healthy


# --- NVLink counting -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("nvlink", "expected"),
    [
        pytest.param(
            {"direct": [{"gpus": [0, 1], "links": 12}]}, {(0, 1): 12, (0, 2): 0}, id="bridge"
        ),
        pytest.param(
            {"switches": [{"gpus": [0, 1, 2], "linksPerGpu": 18}]},
            {(0, 1): 18, (1, 2): 18},
            id="one-fabric",
        ),
        pytest.param(
            {
                "switches": [
                    {"gpus": [0, 1], "linksPerGpu": 18},
                    {"gpus": [2], "linksPerGpu": 12},
                ]
            },
            {(0, 1): 18, (0, 2): 0, (2, 1): 0},
            id="separate-islands",
        ),
        pytest.param(
            {
                "direct": [{"gpus": [0, 1], "links": 4}],
                "switches": [{"gpus": [0, 1, 2], "linksPerGpu": 6}],
            },
            {(0, 1): 4, (0, 2): 6, (1, 2): 6},
            id="direct-links-win-over-switch",
        ),
    ],
)
def test_nvlinks_are_counted_per_pair(
    nvlink: dict[str, Any], expected: dict[tuple[int, int], int]
) -> None:
    module = fake_pynvml(machine_dict(3, nvlink=nvlink))
    topology = open_reader(module, numa_from_bus_id=no_sysfs).read().topology
    for (a, b), links in expected.items():
        assert topology[(f"GPU-test-{a}", f"GPU-test-{b}")].nvlinks == links, (a, b)
        assert topology[(f"GPU-test-{b}", f"GPU-test-{a}")].nvlinks == links, (b, a)


def test_switch_links_without_addresses_count_as_one_fabric_like_hami() -> None:
    module = fake_pynvml(
        machine_dict(
            2,
            nvlink={
                "switches": [{"gpus": [0], "linksPerGpu": 18}, {"gpus": [1], "linksPerGpu": 12}]
            },
            unsupported=["nvmlDeviceGetNvLinkRemotePciInfo"],
        )
    )
    topology = open_reader(module, numa_from_bus_id=no_sysfs).read().topology
    assert topology[("GPU-test-0", "GPU-test-1")].nvlinks == 12


def test_topology_is_scanned_again_only_when_the_card_set_changes() -> None:
    module = fake_pynvml(machine_dict(2))
    calls: list[int] = []
    original = module.nvmlDeviceGetTopologyCommonAncestor

    def counting(a: Any, b: Any) -> int:
        calls.append(1)
        return int(original(a, b))

    module.nvmlDeviceGetTopologyCommonAncestor = counting
    reader = open_reader(module, numa_from_bus_id=no_sysfs)
    reader.read()
    reader.read()
    assert len(calls) == 2  # both directions, once
    reader.invalidate_topology()
    reader.read()
    assert len(calls) == 4


# --- MIG -----------------------------------------------------------------------------


def test_mig_instances_are_read_and_empty_slots_skipped() -> None:
    instances = [
        {"profile": "3g.20gb", "memoryMiB": 19968, "gpuInstanceId": 2, "uuid": "MIG-a"},
        {"profile": "1g.5gb", "memoryMiB": 4864, "gpuInstanceId": 9, "computeInstanceId": 1},
    ]
    body = machine_dict(2)
    body["gpus"][0].update(migMode=True, migInstances=instances)
    (mig_card, plain) = open_reader(fake_pynvml(body), numa_from_bus_id=no_sysfs).read().gpus
    assert mig_card.mig_enabled is True
    assert [
        (m.profile, m.memory_total_bytes, m.gpu_instance_id, m.compute_instance_id)
        for m in mig_card.mig_instances
    ] == [
        ("3g.20gb", 19968 * MIB, 2, 0),
        ("1g.5gb", 4864 * MIB, 9, 1),
    ]
    assert mig_card.mig_instances[0].uuid == "MIG-a"
    assert mig_card.mig_instances[1].uuid.startswith("MIG-")
    assert plain.mig_enabled is False
    assert plain.mig_instances == ()


# --- health --------------------------------------------------------------------------


def test_critical_xid_marks_that_card_unhealthy_and_it_stays_so() -> None:
    body = machine_dict(3)
    body["gpus"][1]["xid"] = 79
    module = fake_pynvml(body)
    reader = open_reader(module, numa_from_bus_id=no_sysfs)
    assert reader.watch_health(0.01) is True
    assert reader.watch_health(0.01) is False  # delivered once; the timeout is not an error
    gpus = reader.read().gpus
    assert [g.healthy for g in gpus] == [True, False, True]
    assert gpus[1].health_reason == "critical XID 79"
    # The event is not repeated, yet the card stays unhealthy (sticky, like HAMi's plugin).
    assert [g.healthy for g in reader.read().gpus] == [True, False, True]


@pytest.mark.parametrize("xid", [13, 31, 43, 45, 68, 109])
def test_application_xids_do_not_mark_cards_unhealthy(xid: int) -> None:
    body = machine_dict(1)
    body["gpus"][0]["xid"] = xid
    reader = open_reader(fake_pynvml(body), numa_from_bus_id=no_sysfs)
    assert reader.watch_health(0.01) is False
    assert reader.read().gpus[0].healthy


def test_failing_event_wait_marks_every_card_unhealthy() -> None:
    module = fake_pynvml(machine_dict(2))

    def failing_wait(event_set: Any, timeout_ms: int) -> Any:
        raise nvml_error("UNKNOWN")

    module.nvmlEventSetWait = failing_wait
    reader = open_reader(module, numa_from_bus_id=no_sysfs)
    assert reader.watch_health(0.01) is True
    assert reader.watch_health(0.01) is False
    gpus = reader.read().gpus
    assert not any(g.healthy for g in gpus)
    assert all("health event wait failed" in (g.health_reason or "") for g in gpus)


@pytest.mark.parametrize(
    "missing",
    [
        pytest.param({"unsupported": ["nvmlEventSetCreate"]}, id="event-sets-unsupported"),
        pytest.param({"absent": ["nvmlEventSetCreate"]}, id="event-sets-absent"),
        pytest.param({"unsupported": ["nvmlDeviceGetSupportedEventTypes"]}, id="no-xid-events"),
    ],
)
def test_without_health_events_watching_waits_instead_of_spinning(missing: dict[str, Any]) -> None:
    slept: list[float] = []
    reader = open_reader(
        fake_pynvml(machine_dict(1, **missing)), numa_from_bus_id=no_sysfs, sleep=slept.append
    )
    assert reader.watch_health(0.5) is False
    assert reader.watch_health(0.5) is False
    assert slept == [0.5, 0.5]


def test_lost_card_keeps_its_last_reading_marked_unhealthy() -> None:
    body = machine_dict(2)
    module = fake_pynvml(body)
    reader = open_reader(module, numa_from_bus_id=no_sysfs)
    assert all(g.healthy for g in reader.read().gpus)
    body["gpus"][1]["lost"] = True
    module.simulation.update(SimMachine.model_validate(body))
    gpus = reader.read().gpus
    assert [g.uuid for g in gpus] == ["GPU-test-0", "GPU-test-1"]
    assert gpus[1].healthy is False
    assert gpus[1].health_reason == "GPU is lost (fell off the bus)"
    assert gpus[1].present  # NVML still counts it


def test_card_lost_before_it_was_ever_read_is_left_out() -> None:
    body = machine_dict(2)
    body["gpus"][0]["lost"] = True
    gpus = open_reader(fake_pynvml(body), numa_from_bus_id=no_sysfs).read().gpus
    assert [g.uuid for g in gpus] == ["GPU-test-1"]


def test_card_that_disappears_stays_listed_unhealthy_and_not_present() -> None:
    body = machine_dict(3)
    module = fake_pynvml(body)
    reader = open_reader(module, numa_from_bus_id=no_sysfs)
    reader.read()
    del body["gpus"][1]
    module.simulation.update(SimMachine.model_validate(body))
    gpus = reader.read().gpus
    assert [(g.uuid, g.healthy, g.present) for g in gpus] == [
        ("GPU-test-0", True, True),
        ("GPU-test-2", True, True),
        ("GPU-test-1", False, False),
    ]
    # No links to or from the vanished card; the others were scanned again.
    topology = reader.read().topology
    assert ("GPU-test-0", "GPU-test-2") in topology
    assert not any("GPU-test-1" in pair for pair in topology)


def test_a_sick_card_that_is_then_lost_says_lost() -> None:
    # The loss replaces the XID as the reason: the DRA driver taints a lost card NoExecute
    # and a sick one NoSchedule, and the reason is all the inventory keeps.
    body = machine_dict(3)
    body["gpus"][1]["xid"] = 79
    body["gpus"][2]["xid"] = 48
    module = fake_pynvml(body)
    reader = open_reader(module, numa_from_bus_id=no_sysfs)
    assert reader.watch_health(0.01) is True
    reader.watch_health(0.01)
    assert [g.health_reason for g in reader.read().gpus][1:] == [
        "critical XID 79",
        "critical XID 48",
    ]
    body["gpus"][1]["lost"] = True
    del body["gpus"][2]
    module.simulation.update(SimMachine.model_validate(body))
    gpus = {g.uuid: g for g in reader.read().gpus}
    assert gpus["GPU-test-1"].health_reason == health.OFF_THE_BUS_REASON
    assert gpus["GPU-test-2"].health_reason == health.DISAPPEARED_REASON
    assert health.is_lost(gpus["GPU-test-1"].health_reason)
    assert not health.is_lost("critical XID 79")
