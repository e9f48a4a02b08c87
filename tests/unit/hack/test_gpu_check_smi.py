"""Reading nvidia-smi's outputs: the recorded ones of fixtures/, and what is not one."""

from __future__ import annotations

import pytest
from gpu_check.smi import (
    SmiParseError,
    numa_nodes,
    nvlinks_of,
    parse_listing,
    parse_query_xml,
    parse_topology,
)
from gpu_check_fixtures import text


def test_a_full_query_of_one_h100_gives_its_identity_memory_and_mig_mode() -> None:
    log = parse_query_xml(text("h100-single", "nvidia-smi-q-x.xml"))
    assert (log.driver_version, log.cuda_version, log.attached_gpus) == ("580.159.04", "13.0", 1)
    (gpu,) = log.gpus
    assert gpu.uuid == "GPU-5e0c6a0f-9d1e-4f7a-b8a2-0123456789ab"
    assert gpu.name == "NVIDIA H100 80GB HBM3"
    assert gpu.pci_bus_id == "00000000:00:05.0"
    # The card's total, not BAR1's nor the confidential-computing memory's.
    assert gpu.memory_total_mib == 81559
    assert gpu.mig_enabled is False
    assert gpu.mig_devices == ()


def test_mig_devices_keep_their_instance_ids_and_memory() -> None:
    log = parse_query_xml(text("a100-mig", "nvidia-smi-q-x.xml"))
    first, second = log.gpus
    assert first.mig_enabled is True
    assert [
        (m.gpu_instance_id, m.compute_instance_id, m.memory_total_mib) for m in first.mig_devices
    ] == [
        (2, 0, 19968),
        (3, 0, 9856),
        (9, 0, 4864),
    ]
    assert second.mig_enabled is False
    assert second.memory_total_mib == 40960
    assert [g.position for g in log.gpus] == [0, 1]


def test_a_card_without_mig_reads_as_unknown_mig_mode() -> None:
    document = (
        "<nvidia_smi_log><gpu id='00000000:01:00.0'><uuid>GPU-x</uuid>"
        "<mig_mode><current_mig>N/A</current_mig></mig_mode>"
        "<fb_memory_usage><total>N/A</total></fb_memory_usage></gpu></nvidia_smi_log>"
    )
    (gpu,) = parse_query_xml(document).gpus
    assert gpu.mig_enabled is None
    assert gpu.memory_total_mib is None
    assert gpu.pci_bus_id == "00000000:01:00.0"  # from the id attribute


@pytest.mark.parametrize(
    ("document", "says"),
    [
        ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver", "not XML"),
        ("<other/>", "<other>"),
        ("<nvidia_smi_log><gpu><product_name>x</product_name></gpu></nvidia_smi_log>", "no <uuid>"),
    ],
)
def test_what_is_not_a_query_is_refused_saying_why(document: str, says: str) -> None:
    with pytest.raises(SmiParseError, match=says):
        parse_query_xml(document)


def test_the_listing_gives_mig_uuids_and_profiles_under_their_card() -> None:
    first, second = parse_listing(text("a100-mig", "nvidia-smi-L.txt"))
    assert first.uuid == "GPU-3a9d1f70-2b4c-4e55-8f10-a1000000d000"
    assert [(m.profile, m.device_index, m.uuid[-4:]) for m in first.migs] == [
        ("3g.20gb", 0, "0002"),
        ("2g.10gb", 1, "0003"),
        ("1g.5gb", 2, "0009"),
    ]
    assert (second.index, second.migs) == (1, ())


def test_a_listing_line_of_another_shape_is_refused() -> None:
    with pytest.raises(SmiParseError, match="unexpected line"):
        parse_listing("No devices were found\n")


def test_the_topology_of_an_hgx_box_with_nics_gives_gpu_pairs_and_numa() -> None:
    header = "\tGPU0\tGPU1\tGPU2\tNIC0\tNIC1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID"
    rows = [
        "GPU0\t X \tNV18\tNV18\tPXB\tSYS\t0-55,112-167\t0\t\tN/A",
        "GPU1\tNV18\t X \tNV18\tNODE\tSYS\t0-55,112-167\t0\t\tN/A",
        "GPU2\tNV18\tNV18\t X \tSYS\tPXB\t56-111,168-223\t1\t\tN/A",
        "NIC0\tPXB\tNODE\tSYS\t X \tSYS",
        "",
        "Legend:",
        "  X    = Self",
    ]
    topology = parse_topology("\n".join([header, *rows]))
    assert topology.cells[(0, 1)] == "NV18"
    assert topology.cells[(2, 0)] == "NV18"
    assert (0, 0) not in topology.cells
    assert len(topology.cells) == 6  # GPU pairs only, no NIC columns
    assert topology.numa_affinity == {0: "0", 1: "0", 2: "1"}


def test_the_topology_of_one_card_in_a_vm_has_no_pairs_and_unknown_numa() -> None:
    topology = parse_topology(text("h100-single", "topo-m.txt"))
    assert topology.cells == {}
    assert topology.numa_affinity == {0: "N/A"}
    assert numa_nodes(topology.numa_affinity[0]) is None


def test_a_topology_without_gpus_is_refused() -> None:
    with pytest.raises(SmiParseError, match="GPU0"):
        parse_topology("No devices were found")


def test_cells_and_affinities_read_as_values() -> None:
    assert nvlinks_of("NV12") == 12
    assert nvlinks_of("PIX") is None
    assert numa_nodes("0") == {0}
    assert numa_nodes("0-1") == {0, 1}
    assert numa_nodes("0,2") == {0, 2}
    assert numa_nodes("N/A") is None
