"""From the cards the agent reports to the cards its DRA driver publishes (pure).

The slice is built from the very devices written into the node's DeviceInventory, so the
two always agree: the same cards (``nodeconfig`` filtering), the same memory
(``deviceMemoryScaling``), the same compute and split count, the same health.

Cards in MIG mode are published apart (``mig_card_shapes``): as partitionable devices, a
counter set per card and a device per profile placement (``devices.dra_mig``). A MIG card
whose model has no known geometry is not published at all.

Below the runtime (``control``) as well as the agent: the autoscaler's catalogue builds
from an instance type's cards the slice a node of that type would publish
(``control.autoscale_catalogue``), by this same code.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from vgpu_operator import resources
from vgpu_operator.devices import dra, dra_mig

#: Why a card NVML stopped counting is unhealthy.
DISAPPEARED_REASON: Final = "GPU disappeared: NVML no longer reports it"
#: Why a card whose calls answer GPU_IS_LOST is unhealthy.
OFF_THE_BUS_REASON: Final = "GPU is lost (fell off the bus)"
#: The reasons that say the card is gone, not merely sick: work on it cannot go on (the
#: DRA driver taints such a card NoExecute; a sick one NoSchedule).
LOST_REASONS: Final = (DISAPPEARED_REASON, OFF_THE_BUS_REASON)

_BUS_ID: Final = re.compile(
    r"^(?:[0-9a-fA-F]*?)([0-9a-fA-F]{4}):([0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])$"
)


def is_lost(health_reason: str | None) -> bool:
    """Whether an unhealthy card's reported reason says the card is lost (the reason is
    all the DeviceInventory keeps of it)."""
    return health_reason in LOST_REASONS


def sysfs_bus_id(bus_id: str) -> str | None:
    """NVML's ``00000000:3B:00.0`` -> sysfs's ``0000:3b:00.0``; None when unreadable."""
    match = _BUS_ID.match(bus_id)
    if match is None:
        return None
    return f"{match.group(1)}:{match.group(2)}".lower()


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
    devices: Sequence[resources.Device],
    defaults: RequestDefaults,
    pcie_root: Callable[[str], str | None] = lambda bus_id: None,
) -> list[dra.CardShape]:
    """The cards to publish (of the devices a DeviceInventory's status lists), in index
    order. ``pcie_root`` maps a PCI bus ID to its root complex (``pci<domain>:<bus>``),
    or None where it cannot be read."""
    islands = nvlink_islands(devices)
    shapes = []
    for device in sorted(devices, key=lambda d: d.index):
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
                and is_lost(device.health_reason),
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
    devices: Sequence[resources.Device], own: Collection[str] = frozenset()
) -> list[dra_mig.MigCardShape]:
    """The MIG-mode cards (of the devices a status lists) to publish as partitionable
    devices, in index order. ``own``: the UUIDs of the instances this driver made for
    claims (their claims' allocations hold their counters); every other instance on a
    card is taken out of its counters. A card with an instance whose placement cannot be
    read has ``taken`` None (``unreadable_instances`` names them)."""
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
        for device in sorted(devices, key=lambda d: d.index)
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
            return None
        taken.append((start, size, parsed[0]))
    return tuple(taken)


def unreadable_instances(
    instances: Iterable[resources.MigInstance], own: Collection[str]
) -> list[str]:
    """The UUIDs of the instances (not ``own``) whose placement or profile cannot be read:
    why ``taken_placements`` offers their card to nobody (the agent logs them)."""
    out = []
    for instance in instances:
        if instance.uuid in own:
            continue
        parsed = None if instance.profile is None else dra_mig.parse_profile(instance.profile)
        if parsed is None or instance.placement_start is None or instance.placement_size is None:
            out.append(instance.uuid)
    return out
