"""From a machine reading to the DeviceInventory status (pure).

The registration rules are HAMi's device plugin's (hami-semantics §4.1): the type string
is the NVML name with ``NVIDIA-`` prefixed unless it already starts with ``NVIDIA``;
memory is the total in MiB scaled by ``deviceMemoryScaling``; compute is 100 scaled by
``deviceCoreScaling``; each card may be shared by ``deviceSplitCount`` tasks. Cards in
MIG mode are registered unscaled, as HAMi does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from vgpu_operator import resources
from vgpu_operator.agent.health import CountCheck
from vgpu_operator.agent.readings import MIB, GpuReading, LinkReading, MachineReading
from vgpu_operator.devices import nvidia
from vgpu_operator.errors import ConfigError

VENDOR: Final = nvidia.COMMON_WORD
HAMI_TYPE_PREFIX: Final = nvidia.COMMON_WORD

CONDITION_HEALTHY: Final = "Healthy"


@dataclass(frozen=True, slots=True)
class RegistrationOptions:
    """The device plugin settings that shape what a card registers as."""

    split_count: int = 10
    memory_scaling: float = 1.0
    core_scaling: float = 1.0

    def __post_init__(self) -> None:
        if self.split_count < 1:
            raise ConfigError("deviceSplitCount", "must be at least 1")
        if self.memory_scaling <= 0:
            raise ConfigError("deviceMemoryScaling", "must be greater than 0")
        if self.core_scaling <= 0:
            raise ConfigError("deviceCoreScaling", "must be greater than 0")


def hami_type(name: str) -> str:
    """HAMi's type string: ``Tesla T4`` -> ``NVIDIA-Tesla T4``; ``NVIDIA A40`` stays."""
    return name if name.startswith(HAMI_TYPE_PREFIX) else f"{HAMI_TYPE_PREFIX}-{name}"


def build_device(
    gpu: GpuReading,
    peers: Sequence[GpuReading],
    reading: MachineReading,
    options: RegistrationOptions,
) -> resources.Device:
    """One card's inventory entry, with a link to each peer whose connection was read
    (a card that is lost or gone has no links)."""
    mig = bool(gpu.mig_enabled)
    memory_mib = gpu.memory_total_mib
    cores = 100
    if not mig:
        memory_mib = int(memory_mib * options.memory_scaling)
        cores = int(100 * options.core_scaling)
    links = tuple(
        _link(peer, reading.topology[(gpu.uuid, peer.uuid)])
        for peer in peers
        if (gpu.uuid, peer.uuid) in reading.topology
    )
    return resources.Device(
        uuid=gpu.uuid,
        index=gpu.index,
        vendor=VENDOR,
        model=gpu.name,
        type=hami_type(gpu.name),
        memory_mib=memory_mib,
        cores=cores,
        split_count=options.split_count,
        numa_node=gpu.numa_node,
        pci_bus_id=gpu.pci_bus_id,
        health=resources.DeviceHealth.HEALTHY if gpu.healthy else resources.DeviceHealth.UNHEALTHY,
        health_reason=gpu.health_reason,
        mode=resources.DeviceMode.MIG if mig else resources.DeviceMode.HAMI_CORE,
        mig_instances=tuple(
            resources.MigInstance(
                uuid=m.uuid,
                profile=m.profile,
                memory_mib=None if m.memory_total_bytes is None else m.memory_total_bytes // MIB,
                gpu_instance_id=m.gpu_instance_id,
                compute_instance_id=m.compute_instance_id,
                placement_start=m.placement_start,
                placement_size=m.placement_size,
            )
            for m in gpu.mig_instances
        ),
        links=links,
    )


def _link(peer: GpuReading, link: LinkReading) -> resources.Link:
    return resources.Link(
        peer=peer.uuid, peer_index=peer.index, p2p_level=link.p2p_level, nvlinks=link.nvlinks
    )


def summarise(devices: Sequence[resources.Device]) -> resources.InventorySummary:
    """The totals shown by ``kubectl get dinv``."""
    models = list(dict.fromkeys(d.model for d in devices))
    return resources.InventorySummary(
        gpu_count=len(devices),
        healthy_count=sum(d.health is resources.DeviceHealth.HEALTHY for d in devices),
        model=", ".join(models),
        total_memory_mib=sum(d.memory_mib for d in devices),
    )


def healthy_condition(
    devices: Sequence[resources.Device], gpus_vanished: bool
) -> tuple[resources.ConditionStatus, str, str]:
    """Status, reason and message of the node-level ``Healthy`` condition."""
    if gpus_vanished:
        return resources.ConditionStatus.FALSE, "GPUsDisappeared", "no GPU is reported any more"
    sick = [d for d in devices if d.health is not resources.DeviceHealth.HEALTHY]
    if sick:
        detail = "; ".join(f"{d.uuid}: {d.health_reason or 'unhealthy'}" for d in sick)
        return resources.ConditionStatus.FALSE, "DevicesUnhealthy", detail
    if not devices:
        return resources.ConditionStatus.TRUE, "NoDevices", "no GPU found on this node"
    return resources.ConditionStatus.TRUE, "AllDevicesHealthy", f"{len(devices)} GPUs healthy"


def build_status(
    reading: MachineReading,
    *,
    node_name: str,
    backend: str,
    options: RegistrationOptions,
    count: CountCheck,
    heartbeat: datetime,
    previous: resources.DeviceInventoryStatus | None = None,
) -> resources.DeviceInventoryStatus:
    """The status to report. Conditions keep their transition time from ``previous``
    while their status stays the same."""
    devices = tuple(build_device(gpu, reading.gpus, reading, options) for gpu in reading.gpus)
    # Seed 000 §9 flags the poll on which the count drops to zero; the cards stay listed
    # (unhealthy, not present), so later polls still say why.
    vanished = not count.healthy or (
        bool(reading.gpus) and not any(gpu.present for gpu in reading.gpus)
    )
    status, reason, message = healthy_condition(devices, vanished)
    transition = heartbeat
    if previous is not None:
        for old in previous.conditions:
            if old.type == CONDITION_HEALTHY and old.status is status:
                transition = old.last_transition_time
    return resources.DeviceInventoryStatus(
        node_name=node_name,
        backend=backend,
        driver_version=reading.driver_version,
        cuda_version=reading.cuda_version,
        heartbeat=heartbeat,
        devices=devices,
        summary=summarise(devices),
        conditions=(
            resources.Condition(
                type=CONDITION_HEALTHY,
                status=status,
                reason=reason,
                message=message,
                last_transition_time=transition,
            ),
        ),
    )


def same_report(
    first: resources.DeviceInventoryStatus | None, second: resources.DeviceInventoryStatus
) -> bool:
    """Whether two statuses say the same, ignoring the heartbeat and transition times."""
    if first is None:
        return False
    return _comparable(first) == _comparable(second)


def _comparable(status: resources.DeviceInventoryStatus) -> object:
    body = status.model_dump(exclude={"heartbeat"})
    for condition in body["conditions"]:
        condition.pop("last_transition_time", None)
    return body
