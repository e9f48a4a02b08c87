"""What the agent read from one machine, before any Kubernetes shape is given to it.

Plain frozen values. ``None`` always means "the driver could not tell" (a call the card
does not support, or a binding too old to have it), never zero.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from vgpu_operator.devices.links import P2PLevel

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class MigInstanceReading:
    """One MIG instance present on a card."""

    uuid: str
    profile: str | None = None
    memory_total_bytes: int | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    #: Its GPU instance's placement on the card: the first memory slice and how many.
    placement_start: int | None = None
    placement_size: int | None = None


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One physical card."""

    index: int
    uuid: str
    name: str
    memory_total_bytes: int
    pci_bus_id: str | None = None
    numa_node: int | None = None
    mig_enabled: bool | None = None
    mig_instances: tuple[MigInstanceReading, ...] = ()
    healthy: bool = True
    health_reason: str | None = None
    #: False for a card seen earlier that NVML no longer counts.
    present: bool = True
    # Telemetry for metrics only; never part of the inventory (it changes every poll).
    memory_used_bytes: int | None = None
    utilization_ratio: float | None = None
    temperature_celsius: float | None = None
    power_watts: float | None = None

    @property
    def memory_total_mib(self) -> int:
        return self.memory_total_bytes // MIB

    def unhealthy(self, reason: str) -> GpuReading:
        """This card marked unhealthy; the first reason recorded is kept."""
        if not self.healthy:
            return self
        return replace(self, healthy=False, health_reason=reason)


@dataclass(frozen=True, slots=True)
class LinkReading:
    """The connection from one card to a peer, seen from the first card."""

    p2p_level: P2PLevel = P2PLevel.UNKNOWN
    nvlinks: int = 0


#: Ordered pair of card UUIDs (a, b) -> the link seen from a.
Topology = Mapping[tuple[str, str], LinkReading]


@dataclass(frozen=True, slots=True)
class MachineReading:
    """Everything read from one machine in one poll."""

    gpus: tuple[GpuReading, ...]
    topology: Topology = field(default_factory=dict)
    driver_version: str | None = None
    cuda_version: str | None = None
