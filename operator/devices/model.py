"""The device data model shared by the codecs, the vendors and the scheduling engine.

Field names carry units (``memory_mib``, ``cores``: percent of one card's compute).
HAMi's wire names (``devmem``, ``devcore``, ``Usedmem``) appear only in the codecs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

#: HAMi's marker for "no gpumem-percentage given" (a real percentage is 1..100).
MEMORY_PERCENT_UNSET: Final = 101

MODE_HAMI_CORE: Final = "hami-core"
MODE_MIG: Final = "mig"
MODE_MPS: Final = "mps"


@dataclass(frozen=True, slots=True)
class MigTemplate:
    """One MIG instance shape of a geometry (seed 000 §2: name, core, memory, count)."""

    name: str
    memory_mib: int
    cores: int
    count: int


#: A geometry is an ordered list of templates that together partition one card.
Geometry = tuple[MigTemplate, ...]

#: Where a MIG instance sits on its card: (first memory slice, number of slices).
MigPlacement = tuple[int, int]


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One MIG profile a card offers, with every place an instance of it may take (HAMi
    v2.10's ``migProfiles`` entry of the node registration, from NVML)."""

    name: str
    memory_mib: int
    cores: int
    slice_count: int
    placements: tuple[MigPlacement, ...] = ()


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """One card as its node registers it (HAMi's register JSON entry)."""

    id: str
    index: int
    count: int
    memory_mib: int
    cores: int
    type: str
    numa: int
    health: bool
    mode: str = MODE_HAMI_CORE
    vendor: str = "NVIDIA"
    #: The MIG profiles the card publishes (HAMi v2.10); empty in the seed's form, where
    #: the device config's geometries describe MIG cards instead.
    mig_profiles: tuple[MigProfile, ...] = ()


#: Pair scores of one node: card UUID -> peer UUID -> score (higher is a faster link).
PairScores = Mapping[str, Mapping[str, int]]


@dataclass(frozen=True, slots=True)
class ContainerDevice:
    """One container's share of one card (an entry of ``vgpu-devices-allocated``).

    ``vendor`` is HAMi's ``Type`` field: the vendor's common word (``NVIDIA``), not the
    model. ``uuid`` may carry a seed-form MIG suffix ``[geometry-slot]``.
    """

    uuid: str
    vendor: str
    memory_mib: int
    cores: int


ContainerDevices = tuple[ContainerDevice, ...]
#: One vendor's allocation of a pod: one entry per container (init containers first).
PodSingleDevice = tuple[ContainerDevices, ...]
#: A pod's whole allocation, by vendor common word.
PodDevices = Mapping[str, PodSingleDevice]


@dataclass(frozen=True, slots=True)
class ContainerRequest:
    """What one container asks of one vendor (HAMi's ContainerDeviceRequest)."""

    count: int
    vendor: str
    memory_mib: int
    memory_percent: int
    cores: int

    @property
    def uses_percentage(self) -> bool:
        return self.memory_mib == 0 and self.memory_percent != MEMORY_PERCENT_UNSET


@dataclass(slots=True)
class MigState:
    """Which MIG instances a card holds.

    In the seed's form (``geometries``): the geometry the card runs, which of its
    instances are taken, and ``spots``, the slices of instances outside that geometry
    (placed by HAMi v2.10, which has no geometries). In HAMi v2.10's form (``profiles``,
    published by the card): every instance is a spot.
    """

    geometries: tuple[Geometry, ...] = ()
    active: int | None = None
    instances: list[MigTemplate] = field(default_factory=list)
    in_use: list[bool] = field(default_factory=list)
    spots: list[MigPlacement] = field(default_factory=list)
    profiles: tuple[MigProfile, ...] = ()

    def copy(self) -> MigState:
        return MigState(
            self.geometries,
            self.active,
            list(self.instances),
            list(self.in_use),
            list(self.spots),
            self.profiles,
        )


@dataclass(slots=True)
class DeviceUsage:
    """A card and what is booked on it, as the engine sees it during one decision."""

    id: str
    index: int
    count: int
    used: int
    total_memory_mib: int
    used_memory_mib: int
    total_cores: int
    used_cores: int
    type: str
    numa: int
    health: bool
    mode: str
    vendor: str = "NVIDIA"
    mig: MigState | None = None

    @classmethod
    def from_info(cls, info: DeviceInfo) -> DeviceUsage:
        return cls(
            id=info.id,
            index=info.index,
            count=info.count,
            used=0,
            total_memory_mib=info.memory_mib,
            used_memory_mib=0,
            total_cores=info.cores,
            used_cores=0,
            type=info.type,
            numa=info.numa,
            health=info.health,
            mode=info.mode,
            vendor=info.vendor,
        )

    def copy(self) -> DeviceUsage:
        return DeviceUsage(
            self.id,
            self.index,
            self.count,
            self.used,
            self.total_memory_mib,
            self.used_memory_mib,
            self.total_cores,
            self.used_cores,
            self.type,
            self.numa,
            self.health,
            self.mode,
            self.vendor,
            None if self.mig is None else self.mig.copy(),
        )

    @property
    def free_memory_mib(self) -> int:
        return self.total_memory_mib - self.used_memory_mib

    @property
    def free_cores(self) -> int:
        return self.total_cores - self.used_cores
