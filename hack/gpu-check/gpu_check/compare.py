"""The DeviceInventory the agent would write, field by field against nvidia-smi.

Each comparison is a ``FieldCheck`` holding both values as text, so a mismatch prints what
the agent said and what nvidia-smi said. A field nvidia-smi cannot speak to (no ``topo``
output, a PCIe level hidden behind an NVLink cell) is "not checked", with the reason, and
never counted as agreement.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from gpu_check.smi import ListedGpu, SmiGpu, SmiSnapshot, numa_nodes, nvlinks_of
from vgpu_operator import resources
from vgpu_operator.devices.links import P2PLevel

#: ``nvidia-smi topo`` PCIe cells as the agent names the level (HAMi's names).
TOPO_LEVELS: Final = {
    "PIX": P2PLevel.SINGLE_SWITCH,
    "PXB": P2PLevel.MULTI_SWITCH,
    "PHB": P2PLevel.HOST_BRIDGE,
    "NODE": P2PLevel.SAME_CPU,
    "SYS": P2PLevel.CROSS_CPU,
    "SOC": P2PLevel.CROSS_CPU,  # older drivers' name for SYS
}
#: nvidia-smi has no cell of its own for NVML's INTERNAL level (two GPUs on one board);
#: it prints the switch between them.
_ALSO_ACCEPTED: Final = {P2PLevel.SAME_BOARD: frozenset({"PIX"})}


@dataclass(frozen=True, slots=True)
class FieldCheck:
    """One field: the agent's value, nvidia-smi's, and whether they agree (None: not
    checked, ``note`` says why)."""

    subject: str
    field: str
    agent: str
    smi: str
    ok: bool | None
    note: str = ""


def mismatches(checks: Iterable[FieldCheck]) -> list[FieldCheck]:
    return [c for c in checks if c.ok is False]


def _show(value: object) -> str:
    return "null" if value is None else str(value)


def normal_bus_id(bus_id: str | None) -> str | None:
    """``00000000:3B:00.0`` and ``0000:3b:00.0`` alike: lower case, 8-digit domain."""
    if bus_id is None:
        return None
    domain, sep, rest = bus_id.strip().lower().partition(":")
    return f"{domain.zfill(8)}{sep}{rest}" if sep else bus_id.strip().lower()


def _subject(device: resources.Device) -> str:
    return f"#{device.index} {device.uuid}"


def compare_inventory(
    status: resources.DeviceInventoryStatus, snapshot: SmiSnapshot
) -> list[FieldCheck]:
    """Every field of ``status`` that nvidia-smi can confirm, and the cards each side lacks."""
    checks: list[FieldCheck] = []
    log = snapshot.log
    if log is None:
        return [
            FieldCheck("machine", "nvidia-smi -q -x", "", "", None, "; ".join(snapshot.problems))
        ]
    checks.append(_same("machine", "driverVersion", status.driver_version, log.driver_version))
    checks.append(_same("machine", "cudaVersion", status.cuda_version, log.cuda_version))
    checks.append(_same("machine", "GPU count", len(status.devices), len(log.gpus)))
    by_uuid = {gpu.uuid: gpu for gpu in log.gpus}
    listed = {gpu.uuid: gpu for gpu in snapshot.listing or ()}
    for device in status.devices:
        gpu = by_uuid.get(device.uuid)
        if gpu is None:
            checks.append(
                FieldCheck(_subject(device), "uuid", device.uuid, "absent from nvidia-smi", False)
            )
            continue
        checks.extend(_card(device, gpu, snapshot, listed))
    reported = {d.uuid for d in status.devices}
    for gpu in log.gpus:
        if gpu.uuid not in reported:
            checks.append(
                FieldCheck(
                    f"#{gpu.position} {gpu.uuid}",
                    "uuid",
                    "absent from the inventory",
                    gpu.uuid,
                    False,
                )
            )
    checks.extend(_links(status.devices, snapshot))
    return checks


def _same(subject: str, name: str, agent: object, smi: object, note: str = "") -> FieldCheck:
    return FieldCheck(subject, name, _show(agent), _show(smi), agent == smi, note)


def _card(
    device: resources.Device,
    gpu: SmiGpu,
    snapshot: SmiSnapshot,
    listed: Mapping[str, ListedGpu],
) -> list[FieldCheck]:
    subject = _subject(device)
    checks = [
        _same(subject, "uuid", device.uuid, gpu.uuid),
        _same(subject, "index", device.index, gpu.position, "nvidia-smi -q -x order"),
        _same(subject, "model", device.model, gpu.name),
        _same(subject, "memoryMiB", device.memory_mib, gpu.memory_total_mib),
        _same(subject, "pciBusId", normal_bus_id(device.pci_bus_id), normal_bus_id(gpu.pci_bus_id)),
        FieldCheck(
            subject,
            "mode (MIG mode)",
            str(device.mode),
            {True: "Enabled", False: "Disabled", None: "N/A"}[gpu.mig_enabled],
            (device.mode is resources.DeviceMode.MIG) == bool(gpu.mig_enabled),
        ),
        _numa(device, snapshot),
    ]
    listed_gpu = listed.get(device.uuid)
    if listed_gpu is not None:
        checks.append(_same(subject, "index", device.index, listed_gpu.index, "nvidia-smi -L"))
    checks.extend(_mig(device, gpu, listed_gpu))
    return checks


def _numa(device: resources.Device, snapshot: SmiSnapshot) -> FieldCheck:
    subject = _subject(device)
    topology = snapshot.topology
    if topology is None:
        return FieldCheck(
            subject, "numaNode", _show(device.numa_node), "", None, "no nvidia-smi topo -m output"
        )
    affinity = topology.numa_affinity.get(device.index)
    nodes = numa_nodes(affinity)
    if nodes is None:
        ok = device.numa_node is None
    else:
        ok = device.numa_node in nodes
    note = "" if nodes is None or len(nodes) == 1 else "the card is near several NUMA nodes"
    return FieldCheck(subject, "numaNode", _show(device.numa_node), _show(affinity), ok, note)


def _mig(device: resources.Device, gpu: SmiGpu, listing: ListedGpu | None) -> list[FieldCheck]:
    """The MIG instances: ids and memory against -q -x, UUIDs and profiles against -L."""
    if not device.mig_instances and not gpu.mig_devices:
        return []
    subject = _subject(device)
    agent_ids = sorted((m.gpu_instance_id, m.compute_instance_id) for m in device.mig_instances)
    smi_ids = sorted((m.gpu_instance_id, m.compute_instance_id) for m in gpu.mig_devices)
    checks = [
        FieldCheck(
            subject,
            "migInstances (GPU, compute instance ids)",
            _show(agent_ids),
            _show(smi_ids),
            agent_ids == smi_ids,
        )
    ]
    smi_memory = {
        (m.gpu_instance_id, m.compute_instance_id): m.memory_total_mib for m in gpu.mig_devices
    }
    for instance in device.mig_instances:
        key = (instance.gpu_instance_id, instance.compute_instance_id)
        if key in smi_memory:
            checks.append(
                _same(
                    f"{subject} MIG {key[0]}/{key[1]}",
                    "memoryMiB",
                    instance.memory_mib,
                    smi_memory[key],
                )
            )
    if listing is None:
        checks.append(
            FieldCheck(
                subject, "migInstances (UUID, profile)", "", "", None, "no nvidia-smi -L output"
            )
        )
        return checks
    agent_migs = sorted((m.uuid, _show(m.profile)) for m in device.mig_instances)
    smi_migs = sorted((m.uuid, m.profile) for m in listing.migs)
    checks.append(
        FieldCheck(
            subject,
            "migInstances (UUID, profile)",
            _show(agent_migs),
            _show(smi_migs),
            agent_migs == smi_migs,
        )
    )
    return checks


def _links(devices: Sequence[resources.Device], snapshot: SmiSnapshot) -> list[FieldCheck]:
    """Each ordered pair: NVLinks against ``topo -m``, the PCIe level against ``topo -mp``."""
    checks: list[FieldCheck] = []
    topology = snapshot.topology
    if len(devices) < 2:
        return checks
    if topology is None:
        return [FieldCheck("links", "links", "", "", None, "no nvidia-smi topo -m output")]
    by_index = {d.index: d for d in devices}
    for device in devices:
        peers = {link.peer_index: link for link in device.links}
        for peer_index, peer in sorted(by_index.items()):
            if peer_index == device.index:
                continue
            subject = f"#{device.index} -> #{peer_index} ({peer.uuid})"
            cell = topology.cells.get((device.index, peer_index))
            link = peers.get(peer_index)
            if link is None:
                checks.append(
                    FieldCheck(subject, "links", "no link entry", _show(cell), cell is None)
                )
                continue
            if cell is None:
                checks.append(
                    FieldCheck(
                        subject,
                        "links",
                        f"{link.p2p_level}, {link.nvlinks} NVLinks",
                        "no cell in topo -m",
                        None,
                        "nvidia-smi does not show this pair",
                    )
                )
                continue
            checks.append(
                _same(
                    subject, "nvlinks", link.nvlinks, nvlinks_of(cell) or 0, f"topo -m says {cell}"
                )
            )
            checks.append(_level(subject, link.p2p_level, cell, snapshot, device.index, peer_index))
    return checks


def _level(
    subject: str, level: P2PLevel, cell: str, snapshot: SmiSnapshot, a: int, b: int
) -> FieldCheck:
    pcie = snapshot.pcie_topology.cells.get((a, b)) if snapshot.pcie_topology else None
    source = "topo -mp"
    if pcie is None and nvlinks_of(cell) is None:
        pcie, source = cell, "topo -m"
    if pcie is None:
        return FieldCheck(
            subject,
            "p2pLevel",
            str(level),
            cell,
            None,
            "topo -m shows the NVLink only and topo -mp gave nothing",
        )
    expected = TOPO_LEVELS.get(pcie)
    ok = expected is level or pcie in _ALSO_ACCEPTED.get(level, frozenset())
    shown = f"{pcie} ({expected})" if expected is not None else pcie
    return FieldCheck(subject, "p2pLevel", str(level), shown, ok, source)
