"""The inventory the agent builds from a (simulated) machine, against nvidia-smi's recorded
outputs: agreement where they agree, every mismatch with both values, and nothing counted
as agreement that nvidia-smi could not confirm."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from gpu_check.compare import FieldCheck, compare_inventory, mismatches
from gpu_check.inventory_check import judge
from gpu_check.outcome import Status
from gpu_check_fixtures import FIXTURES, simulated_status, snapshot

from vgpu_operator import resources

A100 = "sim:a100-mig"


@pytest.fixture
def a100(tmp_path: Path) -> resources.DeviceInventoryStatus:
    return simulated_status(A100, tmp_path)


def by_field(checks: list[FieldCheck], subject_part: str, field: str) -> FieldCheck:
    (found,) = [c for c in checks if subject_part in c.subject and c.field == field]
    return found


def test_the_simulated_a100_agrees_with_its_recorded_nvidia_smi(
    a100: resources.DeviceInventoryStatus,
) -> None:
    checks = compare_inventory(a100, snapshot("a100-mig"))
    assert mismatches(checks) == []
    assert all(c.ok for c in checks), [c for c in checks if not c.ok]
    fields = {c.field for c in checks}
    assert {
        "driverVersion",
        "uuid",
        "cudaVersion",
        "model",
        "memoryMiB",
        "pciBusId",
        "numaNode",
        "mode (MIG mode)",
        "migInstances (GPU, compute instance ids)",
        "migInstances (UUID, profile)",
        "nvlinks",
        "p2pLevel",
    } <= fields
    assert by_field(checks, "#0 -> #1", "nvlinks").agent == "12"
    assert by_field(checks, "#0 -> #1", "p2pLevel").smi == "PIX (SingleSwitch)"
    assert by_field(checks, "d000 MIG 9/0", "memoryMiB").smi == "4864"


def test_every_mismatch_is_reported_with_both_values(a100: resources.DeviceInventoryStatus) -> None:
    bad = {
        (c.subject.split(" ")[0], c.field): (c.agent, c.smi)
        for c in mismatches(compare_inventory(a100, snapshot("a100-mig-mismatch")))
    }
    assert bad == {
        ("#1", "memoryMiB"): ("40960", "40536"),
        ("#1", "numaNode"): ("0", "1"),
        ("#0", "nvlinks"): ("12", "8"),
        ("#1", "nvlinks"): ("12", "8"),
        ("#0", "migInstances (UUID, profile)"): (
            "[('MIG-7c1b2d3e-0000-4a5b-9c8d-a10000000002', '3g.20gb'), "
            "('MIG-7c1b2d3e-0000-4a5b-9c8d-a10000000003', '2g.10gb'), "
            "('MIG-7c1b2d3e-0000-4a5b-9c8d-a10000000009', '1g.5gb')]",
            "[('MIG-7c1b2d3e-0000-4a5b-9c8d-a10000000002', '3g.20gb'), "
            "('MIG-7c1b2d3e-0000-4a5b-9c8d-a10000000003', '2g.10gb'), "
            "('MIG-7c1b2d3e-0000-4a5b-9c8d-a10000000009', '1g.10gb')]",
        ),
    }


def test_the_verdict_fails_and_its_summary_names_both_values(
    a100: resources.DeviceInventoryStatus,
) -> None:
    result = judge(a100, snapshot("a100-mig-mismatch"))
    assert result.status is Status.FAIL
    assert result.summary.startswith("5 mismatch(es)")
    assert "memoryMiB: agent 40960, nvidia-smi 40536" in result.summary
    assert any("**MISMATCH**" in line and "40536" in line for line in result.details)


def test_cards_only_one_side_knows_are_mismatches(a100: resources.DeviceInventoryStatus) -> None:
    recorded = snapshot("a100-mig")
    assert recorded.log is not None
    first, second = recorded.log.gpus
    other = replace(second, uuid="GPU-someone-else")
    checks = compare_inventory(
        a100, replace(recorded, log=replace(recorded.log, gpus=(first, other)))
    )
    missing = [(c.agent, c.smi) for c in mismatches(checks) if c.field == "uuid"]
    assert missing == [
        ("GPU-3a9d1f70-2b4c-4e55-8f10-a1000000d001", "absent from nvidia-smi"),
        ("absent from the inventory", "GPU-someone-else"),
    ]


def test_without_topo_output_numa_and_links_are_not_checked_rather_than_agreed(
    a100: resources.DeviceInventoryStatus,
) -> None:
    checks = compare_inventory(
        a100, replace(snapshot("a100-mig"), topology=None, pcie_topology=None)
    )
    numa = [c for c in checks if c.field == "numaNode"]
    assert [c.ok for c in numa] == [None, None]
    assert by_field(checks, "links", "links").ok is None
    result = judge(a100, replace(snapshot("a100-mig"), topology=None))
    assert result.status is Status.PASS
    assert "not checked" in result.summary


def test_an_nvlink_cell_hides_the_pcie_level_unless_topo_mp_tells_it(
    a100: resources.DeviceInventoryStatus,
) -> None:
    checks = compare_inventory(a100, replace(snapshot("a100-mig"), pcie_topology=None))
    level = by_field(checks, "#0 -> #1", "p2pLevel")
    assert (level.ok, level.smi) == (None, "NV12")


def test_no_query_output_fails_the_comparison_with_nvidia_smis_problem(
    a100: resources.DeviceInventoryStatus,
) -> None:
    broken = replace(
        snapshot("a100-mig"), log=None, problems=("nvidia-smi -q -x: exit 9: no driver",)
    )
    result = judge(a100, broken)
    assert result.status is Status.FAIL
    assert any("no driver" in line for line in result.details)


def test_one_vm_card_with_unknown_numa_agrees_with_nvidia_smis_na(tmp_path: Path) -> None:
    status = simulated_status(f"sim:{FIXTURES / 'h100-single' / 'machine.yaml'}", tmp_path)
    checks = compare_inventory(status, snapshot("h100-single"))
    assert mismatches(checks) == []
    numa = by_field(checks, "#0", "numaNode")
    assert (numa.agent, numa.smi, numa.ok) == ("null", "N/A", True)
    assert not [c for c in checks if c.field in ("nvlinks", "p2pLevel")]  # one card: no pairs
