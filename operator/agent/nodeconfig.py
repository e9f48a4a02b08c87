"""This node's settings from the device config (seed 000 §1), and what they do to a reading.

Precedence, per setting: the ``nodeconfig`` entry named after this node, then the value the
``nvidia`` section sets (HAMi's node defaults), then the agent's own flag, which is only a
fallback for a setting the ConfigMap does not name, or for a cluster without the ConfigMap.
A value the ConfigMap leaves out is the flag's, not pydantic's default: an administrator
who sets ``--device-split-count=4`` and writes no ``deviceSplitCount`` gets 4.

Pure: the agent hands in the parsed config and gets a ``NodeConfig``; ``select`` applies
``filterdevices`` and ``operatingmode`` to a reading, so the inventory and the device
plugin (which advertises what the inventory reports) leave out the same cards.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Final

from vgpu_operator import names
from vgpu_operator.agent.inventory import RegistrationOptions
from vgpu_operator.agent.readings import MachineReading
from vgpu_operator.config import DeviceConfig, NodeOverride
from vgpu_operator.devices import model, nvidia
from vgpu_operator.scheduling.mig import mig
from vgpu_operator.scheduling.vendors import geometry_table

HAMI_CORE: Final = "hami-core"
MIG: Final = "mig"
#: HAMi's operating modes; ``mps`` needs NVIDIA's MPS daemon, which this agent does not run.
OPERATING_MODES: Final = (HAMI_CORE, MIG)
#: NVIDIA's MIG strategies. Only ``none`` is HAMi's path (MIG cards shared through the
#: count resource, instances chosen by the scheduler's geometries); ``single`` and
#: ``mixed`` expose MIG devices as resources of their own, which this agent does not do.
MIG_STRATEGIES: Final = ("none",)


@dataclass(frozen=True, slots=True)
class NodeConfig:
    """What this agent reports and serves, from the device config or its flags."""

    registration: RegistrationOptions = field(default_factory=RegistrationOptions)
    filter_uuids: frozenset[str] = frozenset()
    filter_indices: frozenset[int] = frozenset()
    #: None: each card in the mode NVML reads (MIG on or off); else only cards in it.
    operating_mode: str | None = None
    mig_strategy: str = "none"
    #: HAMi's gpuCorePolicy; ``disable`` turns HAMi-core's compute limit off.
    core_policy: str = "default"
    #: knownMigGeometries: which instance a ``[geometry-slot]`` entry names.
    mig_geometries: tuple[mig.KnownGeometries, ...] = ()
    #: Settings the config named that this agent cannot honour, said once per change.
    ignored: tuple[str, ...] = ()
    #: The schedulers whose placements the device plugin serves (this one and those an
    #: administrator opted in: ``scheduler.trustedSchedulerNames``).
    schedulers: frozenset[str] = frozenset({names.SCHEDULER_NAME})
    #: HAMi's defaultMemory (MiB, 0: the whole card) and defaultCores: what a DRA claim
    #: that names no amount consumes (the request policies' defaults).
    default_memory_mib: int = 0
    default_cores: int = 0

    def geometries_for(self, card_type: str) -> tuple[model.Geometry, ...]:
        return mig.geometries_for(card_type, self.mig_geometries)


def from_flags(registration: RegistrationOptions) -> NodeConfig:
    """No ConfigMap (or none readable yet): the flags alone."""
    return NodeConfig(registration=registration)


def resolve(config: DeviceConfig, node: str, flags: RegistrationOptions) -> NodeConfig:
    """This node's settings: its ``nodeconfig`` entry over the nvidia section over flags."""
    section = nvidia.section(config)
    explicit = section.model_fields_set
    override = config.node_override(node) or NodeOverride(name=node)

    def pick(name: str, entry: float | None, section: float, flag: float) -> float:
        if entry is not None:
            return entry
        return section if name in explicit else flag

    registration = RegistrationOptions(
        split_count=int(
            pick(
                "device_split_count",
                override.device_split_count,
                section.device_split_count,
                flags.split_count,
            )
        ),
        memory_scaling=pick(
            "device_memory_scaling",
            override.device_memory_scaling,
            section.device_memory_scaling,
            flags.memory_scaling,
        ),
        core_scaling=pick(
            "device_core_scaling",
            override.device_core_scaling,
            section.device_core_scaling,
            flags.core_scaling,
        ),
    )
    ignored: list[str] = []
    mode = override.operating_mode or None
    if mode is not None and mode not in OPERATING_MODES:
        ignored.append(
            f"operatingmode {mode!r} (this agent offers {', '.join(OPERATING_MODES)}); "
            "each card is offered in the mode NVML reads"
        )
        mode = None
    strategy = override.mig_strategy or "none"
    if strategy not in MIG_STRATEGIES:
        ignored.append(
            f"migstrategy {strategy!r} (only 'none', HAMi's scheduler-driven MIG, is served)"
        )
        strategy = "none"
    return NodeConfig(
        registration=registration,
        filter_uuids=frozenset(override.filter_devices.uuid),
        filter_indices=frozenset(override.filter_devices.index),
        operating_mode=mode,
        mig_strategy=strategy,
        core_policy=section.gpu_core_policy,
        mig_geometries=geometry_table(section),
        ignored=tuple(ignored),
        schedulers=config.scheduler.trusted_names(),
        default_memory_mib=section.default_memory,
        default_cores=section.default_cores,
    )


@dataclass(frozen=True, slots=True)
class Selection:
    """The reading with only the cards this node offers, and why the others are left out."""

    reading: MachineReading
    left_out: tuple[tuple[str, str], ...]  # (uuid, why)


def select(reading: MachineReading, config: NodeConfig) -> Selection:
    """Leave out the cards ``filterdevices`` names and those not in ``operatingmode``."""
    kept = []
    left_out: list[tuple[str, str]] = []
    for gpu in reading.gpus:
        why = _left_out_because(gpu.uuid, gpu.index, gpu.mig_enabled, config)
        if why is None:
            kept.append(gpu)
        else:
            left_out.append((gpu.uuid, why))
    if not left_out:
        return Selection(reading, ())
    return Selection(replace(reading, gpus=tuple(kept)), tuple(left_out))


def _left_out_because(
    uuid: str, index: int, mig_enabled: bool | None, config: NodeConfig
) -> str | None:
    if uuid in config.filter_uuids:
        return "filterdevices.uuid names it"
    if index in config.filter_indices:
        return "filterdevices.index names it"
    if config.operating_mode == HAMI_CORE and mig_enabled:
        return "MIG is on and operatingmode is hami-core (turn MIG off to share it so)"
    if config.operating_mode == MIG and not mig_enabled:
        return "MIG is off and operatingmode is mig (turn MIG on: nvidia-smi -i <index> -mig 1)"
    return None


def describe(config: NodeConfig) -> dict[str, object]:
    """The settings, for the log line that says which are in force."""
    return {
        "split_count": config.registration.split_count,
        "memory_scaling": config.registration.memory_scaling,
        "core_scaling": config.registration.core_scaling,
        "filter_uuids": sorted(config.filter_uuids),
        "filter_indices": sorted(config.filter_indices),
        "operating_mode": config.operating_mode or "per card",
        "mig_strategy": config.mig_strategy,
        "core_policy": config.core_policy,
        "schedulers": sorted(config.schedulers),
    }
