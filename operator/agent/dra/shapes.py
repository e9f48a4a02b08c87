"""From the status the agent reports to the cards its DRA driver publishes (pure).

The slice is built from the very status written into the node's DeviceInventory, so the
two always agree: the same cards (``nodeconfig`` filtering), the same memory
(``deviceMemoryScaling``), the same compute and split count, the same health.

Cards in MIG mode are published apart (``mig_card_shapes``): as partitionable devices, a
counter set per card and a device per profile placement (``devices.dra_mig``). A MIG card
whose model has no known geometry is not published at all.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

import structlog

from vgpu_operator import resources
from vgpu_operator.agent import health
from vgpu_operator.agent.dra.sysfs import sysfs_bus_id
from vgpu_operator.devices import dra, dra_mig

log = structlog.get_logger("vgpu_operator.dra")


@dataclass(frozen=True, slots=True)
class RequestDefaults:
    """What a claim that names no amount consumes (the device config's nvidia section)."""

    #: HAMi's defaultMemory in MiB; 0 means the whole card.
    memory_mib: int = 0
    #: HAMi's defaultCores.
    cores: int = 0


def nvlink_islands(devices: Sequence[resources.Device]) -> dict[str, int]:
    """Card UUID -> its NVLink island: the lowest index among the cards it reaches over
    NVLink, directly or through others. Cards with no NVLink have no island."""
    by_uuid = {d.uuid: d for d in devices}
    parent = {d.uuid: d.uuid for d in devices}

    def find(uuid: str) -> str:
        while parent[uuid] != uuid:
            parent[uuid] = parent[parent[uuid]]
            uuid = parent[uuid]
        return uuid

    linked: set[str] = set()
    for device in devices:
        for link in device.links:
            if link.nvlinks > 0 and link.peer in by_uuid:
                linked.update((device.uuid, link.peer))
                a, b = find(device.uuid), find(link.peer)
                if a != b:
                    parent[max(a, b)] = min(a, b)
    lowest: dict[str, int] = {}
    for uuid in linked:
        root = find(uuid)
        lowest[root] = min(lowest.get(root, by_uuid[uuid].index), by_uuid[uuid].index)
    return {uuid: lowest[find(uuid)] for uuid in linked}


def card_shapes(
    status: resources.DeviceInventoryStatus,
    defaults: RequestDefaults,
    pcie_root: Callable[[str], str | None] = lambda bus_id: None,
) -> list[dra.CardShape]:
    """The cards to publish, in index order. ``pcie_root`` maps a PCI bus ID to its
    root complex (``pci<domain>:<bus>``), or None where it cannot be read."""
    islands = nvlink_islands(status.devices)
    shapes = []
    for device in sorted(status.devices, key=lambda d: d.index):
        if device.mode is not resources.DeviceMode.HAMI_CORE:
            continue
        shapes.append(
            dra.CardShape(
                uuid=device.uuid,
                index=device.index,
                product=device.model,
                hami_type=device.type,
                memory_mib=device.memory_mib,
                cores=device.cores,
                split_count=device.split_count,
                mode=device.mode.value,
                healthy=device.health is resources.DeviceHealth.HEALTHY,
                health_reason=device.health_reason,
                lost=device.health is not resources.DeviceHealth.HEALTHY
                and health.is_lost(device.health_reason),
                numa_node=device.numa_node,
                # Kubernetes' pciBusID is the kernel's form (0000:3b:00.0), not NVML's.
                pci_bus_id=None if device.pci_bus_id is None else sysfs_bus_id(device.pci_bus_id),
                pcie_root=None if device.pci_bus_id is None else pcie_root(device.pci_bus_id),
                nvlink_island=islands.get(device.uuid),
                default_memory_mib=defaults.memory_mib,
                default_cores=defaults.cores,
            )
        )
    return shapes


def by_name(shapes: Iterable[dra.CardShape]) -> Mapping[str, dra.CardShape]:
    """Device name -> card, as Prepare looks them up."""
    return {shape.name: shape for shape in shapes}


def mig_card_shapes(
    status: resources.DeviceInventoryStatus, own: Collection[str] = frozenset()
) -> list[dra_mig.MigCardShape]:
    """The MIG-mode cards to publish as partitionable devices, in index order. ``own``:
    the UUIDs of the instances this driver made for claims (their claims' allocations
    hold their counters); every other instance on a card is taken out of its counters."""
    return [
        dra_mig.MigCardShape(
            uuid=device.uuid,
            index=device.index,
            product=device.model,
            hami_type=device.type,
            memory_mib=device.memory_mib,
            healthy=device.health is resources.DeviceHealth.HEALTHY,
            numa_node=device.numa_node,
            taken=taken_placements(device.mig_instances, own),
        )
        for device in sorted(status.devices, key=lambda d: d.index)
        if device.mode is resources.DeviceMode.MIG and dra_mig.has_geometry(device.model)
    ]


def taken_placements(
    instances: Iterable[resources.MigInstance], own: Collection[str]
) -> tuple[tuple[int, int, int], ...] | None:
    """(start, memory slices, compute slices) of each instance that is not ``own``; None
    when one's placement or profile cannot be read (the card is then offered whole to
    nobody: an unreadable instance never becomes free room)."""
    taken = []
    for instance in instances:
        if instance.uuid in own:
            continue
        parsed = None if instance.profile is None else dra_mig.parse_profile(instance.profile)
        start, size = instance.placement_start, instance.placement_size
        if parsed is None or start is None or size is None:
            log.warning("mig_instance_placement_unknown", instance=instance.uuid)
            return None
        taken.append((start, size, parsed[0]))
    return tuple(taken)
