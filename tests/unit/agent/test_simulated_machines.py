"""The bundled simulated machines, read through the real NVML mapping into the inventory,
and the machine file format itself (validation, reloading, failure injection)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from agent_fakes import fake_pynvml, machine_dict

from vgpu_operator import resources
from vgpu_operator.agent import health, inventory, nvml, sim_machine, simulated
from vgpu_operator.agent.readings import MachineReading
from vgpu_operator.errors import ConfigError

NOW = datetime(2025, 7, 30, 10, 15, tzinfo=UTC)


@dataclass(frozen=True)
class Expected:
    gpus: int
    healthy: int
    type: str
    memory_mib: int
    numa: tuple[int | None, ...]
    modes: tuple[str, ...]
    #: Every distinct pair score seen on the machine.
    scores: frozenset[int]
    driver: str
    cuda: str


EXPECTED = {
    "h100-sxm-8": Expected(
        gpus=8,
        healthy=8,
        type="NVIDIA H100 80GB HBM3",
        memory_mib=81559,
        numa=(0, 0, 0, 0, 1, 1, 1, 1),
        modes=("hami-core",) * 8,
        scores=frozenset({20 + 1800, 10 + 1800}),
        driver="550.90.07",
        cuda="12.4",
    ),
    "l40s-pcie-4": Expected(
        gpus=4,
        healthy=4,
        type="NVIDIA L40S",
        memory_mib=46068,
        numa=(0, 0, 1, 1),
        modes=("hami-core",) * 4,
        scores=frozenset({50, 10}),
        driver="550.54.15",
        cuda="12.4",
    ),
    "a100-pcie-bridged": Expected(
        gpus=4,
        healthy=4,
        type="NVIDIA A100 80GB PCIe",
        memory_mib=81920,
        numa=(0, 0, 1, 1),
        modes=("hami-core",) * 4,
        scores=frozenset({50 + 1200, 10}),
        driver="550.90.07",
        cuda="12.4",
    ),
    "a100-mig": Expected(
        gpus=2,
        healthy=2,
        type="NVIDIA A100-SXM4-40GB",
        memory_mib=40960,
        numa=(0, 0),
        modes=("mig", "hami-core"),
        scores=frozenset({50 + 1200}),
        driver="535.183.01",
        cuda="12.2",
    ),
    "h100-pcie-failing": Expected(
        gpus=4,
        healthy=3,
        type="NVIDIA H100 PCIe",
        memory_mib=81559,
        numa=(0, 0, 1, 1),
        modes=("hami-core",) * 4,
        scores=frozenset({30, 10}),
        driver="550.90.07",
        cuda="12.4",
    ),
    "islands-16": Expected(
        gpus=16,
        healthy=16,
        type="NVIDIA H100 80GB HBM3",
        memory_mib=81559,
        numa=(0,) * 8 + (1,) * 8,
        modes=("hami-core",) * 16,
        # Inside an island: 18 NVLinks plus the PCIe level; across islands: PCIe only.
        scores=frozenset({40 + 1800, 20 + 1800, 10}),
        driver="550.90.07",
        cuda="12.4",
    ),
    "t4-legacy": Expected(
        gpus=2,
        healthy=2,
        type="NVIDIA-Tesla T4",
        memory_mib=15360,
        numa=(None, None),
        modes=("hami-core", "hami-core"),
        scores=frozenset({30}),
        driver="470.256.02",
        cuda="11.4",
    ),
}


def read_machine(name: str, node: str = "node-a") -> MachineReading:
    """Read a bundled machine through the real binding's shapes, health events included."""
    machine = sim_machine.load_machine(sim_machine.resolve_machine_path(name))
    module = fake_pynvml(machine, node)
    reader = nvml.NvmlReader(module, numa_from_bus_id=module.simulation.sysfs_numa_node)
    reader.open()
    while reader.watch_health(0.01):
        pass
    return reader.read()


def status_of(reading: MachineReading) -> resources.DeviceInventoryStatus:
    present = sum(g.present for g in reading.gpus)
    return inventory.build_status(
        reading,
        node_name="node-a",
        backend="sim:test",
        options=inventory.RegistrationOptions(),
        count=health.check_gpu_count(0, present),
        heartbeat=NOW,
    )


def test_every_bundled_machine_has_expectations() -> None:
    assert set(sim_machine.bundled_machines()) == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_bundled_machine_maps_to_the_expected_inventory(name: str) -> None:
    expected = EXPECTED[name]
    status = status_of(read_machine(name))
    devices, scores = resources.devices_from_status(status)

    assert status.summary.gpu_count == expected.gpus
    assert status.summary.healthy_count == expected.healthy
    assert (status.driver_version, status.cuda_version) == (expected.driver, expected.cuda)
    assert [d.index for d in status.devices] == list(range(expected.gpus))
    assert {d.type for d in status.devices} == {expected.type}
    assert {d.memory_mib for d in status.devices} == {expected.memory_mib}
    assert tuple(d.numa_node for d in status.devices) == expected.numa
    assert tuple(d.mode.value for d in status.devices) == expected.modes
    assert len({d.uuid for d in status.devices}) == expected.gpus
    # Every card links to every other card, and the scores are HAMi's.
    for device in status.devices:
        assert {link.peer for link in device.links} == {d.uuid for d in status.devices} - {
            device.uuid
        }
    assert {s for row in scores.values() for s in row.values()} == expected.scores
    assert [d.id for d in devices] == [d.uuid for d in status.devices]


def test_failing_machine_names_the_failed_card_and_why() -> None:
    status = status_of(read_machine("h100-pcie-failing"))
    sick = [d for d in status.devices if d.health is resources.DeviceHealth.UNHEALTHY]
    assert [(d.index, d.health_reason) for d in sick] == [(2, "critical XID 79")]
    (condition,) = status.conditions
    assert (condition.status, condition.reason) == (
        resources.ConditionStatus.FALSE,
        "DevicesUnhealthy",
    )


def test_mig_machine_reports_its_instances() -> None:
    status = status_of(read_machine("a100-mig"))
    mig = status.devices[0]
    assert [(m.profile, m.memory_mib, m.gpu_instance_id) for m in mig.mig_instances] == [
        ("3g.20gb", 19968, 2),
        ("2g.10gb", 9856, 3),
        ("1g.5gb", 4864, 9),
    ]
    assert status.devices[1].mig_instances == ()


def test_islands_put_eight_cards_together_only_inside_an_island() -> None:
    status = status_of(read_machine("islands-16"))
    _, scores = resources.devices_from_status(status)
    uuids = [d.uuid for d in status.devices]
    same_island = scores[uuids[0]][uuids[7]]
    across = scores[uuids[0]][uuids[8]]
    assert same_island > 100 * across


def test_uuids_a_file_leaves_out_differ_per_node() -> None:
    body = machine_dict(2)
    for gpu in body["gpus"]:
        del gpu["uuid"]
    machine = sim_machine.SimMachine.model_validate(body)
    first = nvml.NvmlReader(fake_pynvml(machine, "node-a"), numa_from_bus_id=lambda b: None)
    second = nvml.NvmlReader(fake_pynvml(machine, "node-b"), numa_from_bus_id=lambda b: None)
    first.open()
    second.open()
    a = [g.uuid for g in first.read().gpus]
    b = [g.uuid for g in second.read().gpus]
    assert len(set(a)) == 2
    assert all(u.startswith("GPU-") for u in a + b)
    assert not set(a) & set(b)
    # Stable: the same node reads the same UUIDs again.
    assert [g.uuid for g in first.read().gpus] == a


def _card_and_mig_uuids(machine: sim_machine.SimMachine, node: str, *, pinned: bool) -> list[str]:
    sim = simulated.SimulatedNvml(machine, node, pinned_uuids=pinned)
    reader = nvml.NvmlReader(sim.module(), numa_from_bus_id=sim.sysfs_numa_node)
    reader.open()
    gpus = reader.read().gpus
    return [g.uuid for g in gpus] + [m.uuid for g in gpus for m in g.mig_instances]


@pytest.mark.parametrize("name", sim_machine.bundled_machines())
def test_pinned_uuids_can_be_derived_per_node(name: str) -> None:
    machine = sim_machine.load_machine(sim_machine.resolve_machine_path(name))
    kept = _card_and_mig_uuids(machine, "node-a", pinned=True)
    a = _card_and_mig_uuids(machine, "node-a", pinned=False)
    b = _card_and_mig_uuids(machine, "node-b", pinned=False)
    # The bundled files pin their cards, so two nodes share UUIDs unless told otherwise.
    assert _card_and_mig_uuids(machine, "node-b", pinned=True) == kept
    assert {g.uuid for g in machine.gpus if g.uuid} <= set(kept)
    # Per node: as many distinct UUIDs, none shared with another node or with the pins.
    assert len(set(a)) == len(a) == len(kept)
    assert not set(a) & set(b)
    assert not set(a) & set(kept)
    assert all(u.startswith(("GPU-", "MIG-")) for u in a)
    assert [u[:4] for u in a] == [u[:4] for u in kept]
    # Stable: the same node derives the same UUIDs again.
    assert _card_and_mig_uuids(machine, "node-a", pinned=False) == a


@pytest.mark.parametrize(
    ("change", "field"),
    [
        pytest.param(
            {"pcie": [{"gpus": [0, 5], "level": "SameCPU"}]}, "pcie", id="index-out-of-range"
        ),
        pytest.param({"defaults": {}}, "gpus[0]", id="no-name-anywhere"),
        pytest.param({"pcie": [{"gpus": [0, 1], "level": "Nearby"}]}, "level", id="unknown-level"),
        pytest.param({"cudaVersion": "twelve"}, "cudaVersion", id="bad-cuda-version"),
        pytest.param({"colour": "red"}, "colour", id="unknown-key"),
        pytest.param(
            {"nvlink": {"direct": [{"gpus": [0, 1], "links": 0}]}}, "links", id="zero-links"
        ),
    ],
)
def test_malformed_machine_file_is_rejected_naming_the_field(
    write_machine: Callable[[dict[str, Any]], Path], change: dict[str, Any], field: str
) -> None:
    body = machine_dict(2)
    body.update(change)
    with pytest.raises(ConfigError) as caught:
        sim_machine.load_machine(write_machine(body))
    assert field in str(caught.value)


def test_too_many_nvlinks_on_one_card_is_rejected() -> None:
    body = machine_dict(
        2,
        nvlink={
            "switches": [{"gpus": [0, 1], "linksPerGpu": 30}],
            "direct": [{"gpus": [0, 1], "links": 8}],
        },
    )
    with pytest.raises(ConfigError, match="exceed 36"):
        simulated.SimulatedNvml(sim_machine.SimMachine.model_validate(body))


def test_repeated_bus_ids_are_rejected() -> None:
    body = machine_dict(2)
    body["gpus"][1]["pciBusId"] = body["gpus"][0]["pciBusId"]
    with pytest.raises(ConfigError, match="repeat"):
        simulated.SimulatedNvml(sim_machine.SimMachine.model_validate(body))


def test_unknown_bundled_machine_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="h100-sxm-8"):
        sim_machine.resolve_machine_path("no-such-machine")


def test_absent_calls_are_missing_from_the_module() -> None:
    machine = sim_machine.SimMachine.model_validate(
        machine_dict(1, absent=["nvmlDeviceGetNumaNodeId"])
    )
    module = simulated.SimulatedNvml(machine).module()
    assert not hasattr(module, "nvmlDeviceGetNumaNodeId")
    assert hasattr(module, "nvmlDeviceGetUUID")


# --- the backend: the file is re-read while the agent runs ----------------------------


def _rewrite(path: Path, body: dict[str, Any]) -> None:
    before = path.stat().st_mtime_ns
    path.write_text(yaml.safe_dump(body))
    while path.stat().st_mtime_ns == before:  # coarse file-system clocks
        time.sleep(0.01)
        path.write_text(yaml.safe_dump(body))


def test_backend_picks_up_a_failure_written_into_the_file(
    write_machine: Callable[[dict[str, Any]], Path],
) -> None:
    body = machine_dict(2)
    backend = simulated.SimulatedBackend(write_machine(body), "node-a")
    backend.open()
    try:
        assert backend.watch_health(0.01) is False
        assert all(g.healthy for g in backend.read().gpus)
        body["gpus"][1]["xid"] = [48]
        _rewrite(backend.path, body)
        assert backend.watch_health(0.5) is True
        gpus = backend.read().gpus
        assert [g.healthy for g in gpus] == [True, False]
        assert gpus[1].health_reason == "critical XID 48"
    finally:
        backend.close()


def test_backend_keeps_the_last_good_machine_when_the_file_breaks(
    write_machine: Callable[[dict[str, Any]], Path],
) -> None:
    body = machine_dict(2)
    backend = simulated.SimulatedBackend(write_machine(body), "node-a")
    backend.open()
    backend.path.write_text("gpus: [unterminated")
    assert len(backend.read().gpus) == 2
    body["gpus"].append({"uuid": "GPU-test-2", "pciBusId": "00000000:40:00.0"})
    _rewrite(backend.path, body)
    reading = backend.read()
    assert [g.uuid for g in reading.gpus] == ["GPU-test-0", "GPU-test-1", "GPU-test-2"]
    # The new card was linked too: the topology was scanned again after the reload.
    assert ("GPU-test-0", "GPU-test-2") in reading.topology


def test_backend_reports_its_source() -> None:
    backend = simulated.SimulatedBackend(sim_machine.resolve_machine_path("t4-legacy"), "n")
    assert backend.description.startswith("sim:")
    assert backend.description.endswith("t4-legacy.yaml")
