"""Simulated machines: the NVML readings of a whole machine, from a YAML or JSON file.

A machine file describes cards, their PCIe and NVLink topology, and failures. It is
served through ``SimulatedNvml``, an object shaped like the ``pynvml`` module, to the
same ``NvmlReader`` that reads real GPUs; so ``make demo`` and the tests exercise the
real mapping, including calls a card does not support (``unsupported``) and functions a
binding lacks (``absent``). The file is re-read whenever it changes, so a test can make
a card fail while the agent runs. The format is documented in docs/agent.md.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid as uuid_lib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from importlib import resources as package_files
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any, Final, TypeVar

import structlog
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from vgpu_operator.agent import sim_mig
from vgpu_operator.agent.nvml import NvmlReader
from vgpu_operator.agent.readings import MIB, MachineReading
from vgpu_operator.devices.links import P2PLevel
from vgpu_operator.errors import ConfigError

log = structlog.get_logger(__name__)

_T = TypeVar("_T")

#: NVML's per-card link limit (nvml.h NVML_NVLINK_MAX_LINKS).
MAX_NVLINKS_PER_GPU: Final = 36
#: Prefix for a bundled machine in ``--backend sim:NAME``.
_BUNDLED_SUFFIXES: Final = (".yaml", ".json")

# nvmlReturn_t values the simulation raises, and other nvml.h constants it serves.
_ERROR_INVALID_ARGUMENT: Final = 2
_ERROR_NOT_SUPPORTED: Final = 3
_ERROR_NOT_FOUND: Final = 6
_ERROR_TIMEOUT: Final = 10
_ERROR_GPU_IS_LOST: Final = 15
_ERROR_IN_USE: Final = 19
_ERROR_INSUFFICIENT_RESOURCES: Final = 23
#: MIG: GPU instance profile id -> (compute slices, memory eighths), as on A100/H100; a
#: card has 7 compute slices. CI profile ids number the same slice counts.
_GI_PROFILES: Final = {0: (1, 1), 1: (2, 2), 2: (3, 4), 3: (4, 4), 4: (7, 8)}
_COMPUTE_SLICES: Final = 7
_EVENT_XID_CRITICAL: Final = 0x8
_EVENT_SINGLE_BIT_ECC: Final = 0x1
_EVENT_DOUBLE_BIT_ECC: Final = 0x2
_NO_INSTANCE: Final = 0xFFFFFFFF
_NVML_LEVELS: Final = {
    P2PLevel.SAME_BOARD: 0,
    P2PLevel.SINGLE_SWITCH: 10,
    P2PLevel.MULTI_SWITCH: 20,
    P2PLevel.HOST_BRIDGE: 30,
    P2PLevel.SAME_CPU: 40,
    P2PLevel.CROSS_CPU: 50,
}
_UUID_NAMESPACE: Final = uuid_lib.UUID("6f0c2b1e-7a4d-4c38-9a51-2f1f0d0e5a17")


# --- The file format ------------------------------------------------------------------


class _File(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="forbid", frozen=True)


class SimMigInstance(_File):
    """A MIG instance on a card with MIG enabled."""

    profile: str = Field(min_length=1)
    memory_mib: int = Field(alias="memoryMiB", ge=0)
    gpu_instance_id: int = Field(alias="gpuInstanceId", ge=0)
    compute_instance_id: int = Field(0, alias="computeInstanceId", ge=0)
    uuid: str | None = None
    #: Its GPU instance's first memory slice; none: placed as NVML would (``sim_mig``).
    placement_start: int | None = Field(None, alias="placementStart", ge=0, le=7)


class SimCard(_File):
    """Fields a card may set; ``defaults`` holds the same fields for every card."""

    name: str | None = None
    memory_mib: int | None = Field(None, alias="memoryMiB", ge=0)
    numa_node: int | None = Field(None, alias="numaNode", ge=0)
    memory_used_mib: int | None = Field(None, alias="memoryUsedMiB", ge=0)
    utilization: float | None = Field(None, ge=0, le=1)
    temperature_celsius: float | None = Field(None, alias="temperatureC")
    power_watts: float | None = Field(None, alias="powerW", ge=0)
    unsupported: tuple[str, ...] = ()


class SimGpu(SimCard):
    """One card. Its NVML index is its position in the list."""

    uuid: str | None = None
    pci_bus_id: str | None = Field(None, alias="pciBusId")
    mig_mode: bool | None = Field(False, alias="migMode")
    mig_instances: tuple[SimMigInstance, ...] = Field((), alias="migInstances")
    xid: tuple[int, ...] = Field((), description="Critical XIDs this card raises.")
    lost: bool = Field(False, description="The card fell off the bus.")

    @model_validator(mode="before")
    @classmethod
    def _one_xid(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("xid"), int):
            return {**data, "xid": [data["xid"]]}
        return data


class PcieRule(_File):
    """Every pair among ``gpus`` shares this PCIe ancestor (later rules win)."""

    gpus: tuple[int, ...] = Field(min_length=2)
    level: P2PLevel


class DirectNvlinks(_File):
    """Every pair among ``gpus`` is joined by ``links`` NVLinks (a bridge, a mesh)."""

    gpus: tuple[int, ...] = Field(min_length=2)
    links: int = Field(ge=1)


class NvswitchFabric(_File):
    """Cards attached to one NVSwitch fabric with ``linksPerGpu`` links each."""

    gpus: tuple[int, ...] = Field(min_length=1)
    links_per_gpu: int = Field(alias="linksPerGpu", ge=1)


class SimNvlink(_File):
    direct: tuple[DirectNvlinks, ...] = ()
    switches: tuple[NvswitchFabric, ...] = ()


class SimMachine(_File):
    """A whole machine file."""

    name: str = Field(min_length=1)
    description: str = ""
    driver_version: str | None = Field("550.90.07", alias="driverVersion")
    cuda_version: str | None = Field("12.4", alias="cudaVersion", pattern=r"^\d+\.\d+$")
    defaults: SimCard = SimCard()
    gpus: tuple[SimGpu, ...] = ()
    pcie: tuple[PcieRule, ...] = ()
    nvlink: SimNvlink = SimNvlink()
    unsupported: tuple[str, ...] = Field((), description="Calls answering NOT_SUPPORTED.")
    absent: tuple[str, ...] = Field((), description="Calls missing from the binding.")

    @model_validator(mode="after")
    def _check(self) -> SimMachine:
        count = len(self.gpus)
        rules: list[tuple[str, Sequence[int]]] = [("pcie", r.gpus) for r in self.pcie]
        rules += [("nvlink.direct", r.gpus) for r in self.nvlink.direct]
        rules += [("nvlink.switches", r.gpus) for r in self.nvlink.switches]
        for where, indices in rules:
            bad = [i for i in indices if not 0 <= i < count]
            if bad:
                raise ValueError(f"{where}: GPU indices {bad} are not in 0..{count - 1}")
        for index, gpu in enumerate(self.gpus):
            if (gpu.name or self.defaults.name) is None:
                raise ValueError(f"gpus[{index}]: no name here or in defaults")
            if (gpu.memory_mib if gpu.memory_mib is not None else self.defaults.memory_mib) is None:
                raise ValueError(f"gpus[{index}]: no memoryMiB here or in defaults")
        return self


def load_machine(path: Path) -> SimMachine:
    """Parse a machine file; ``ConfigError`` names the file and the bad field."""
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(str(path), f"cannot read machine file: {exc}") from None
    try:
        return SimMachine.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise ConfigError(f"{path}:{where}", first["msg"]) from None


def bundled_machines() -> list[str]:
    """Names of the machines shipped with the package (``sim:NAME``)."""
    folder = package_files.files("vgpu_operator.agent") / "machines"
    return sorted(
        entry.name.rsplit(".", 1)[0]
        for entry in folder.iterdir()
        if entry.name.endswith(_BUNDLED_SUFFIXES)
    )


def resolve_machine_path(spec: str) -> Path:
    """A path to a machine file, or the name of a bundled machine (``h100-sxm-8``)."""
    path = Path(spec)
    if path.exists():
        return path
    folder = package_files.files("vgpu_operator.agent") / "machines"
    for suffix in _BUNDLED_SUFFIXES:
        candidate = folder / f"{spec}{suffix}"
        if candidate.is_file():
            return Path(str(candidate))
    raise ConfigError(
        "backend", f"no machine file {spec!r} (bundled: {', '.join(bundled_machines())})"
    )


# --- The pynvml-shaped simulation ---------------------------------------------------


class SimulatedNvmlError(Exception):
    """Raised like pynvml's NVMLError: ``value`` is the nvmlReturn_t code."""

    def __init__(self, value: int) -> None:
        super().__init__(f"simulated NVML error {value}")
        self.value = value


@dataclass(frozen=True, slots=True)
class _Handle:
    index: int
    mig_slot: int | None = None


@dataclass(frozen=True, slots=True)
class _GpuInstance:
    index: int
    gpu_instance_id: int


@dataclass(frozen=True, slots=True)
class _ComputeInstance:
    index: int
    gpu_instance_id: int
    compute_instance_id: int


class _PlacementStruct:
    """pynvml's ``c_nvmlGpuInstancePlacement_t``: a start and a size."""

    start: int = 0
    size: int = 0


@dataclass(slots=True)
class _Card:
    index: int
    uuid: str
    name: str
    memory_mib: int
    bus_id: str
    numa_node: int | None
    gpu: SimGpu
    telemetry: SimCard
    unsupported: frozenset[str]
    nvlinks: list[tuple[str, bool]] = field(default_factory=list)  # (remote bus, to switch)
    #: MIG: every GPU instance (id -> profile), and the instances with a compute
    #: instance, which are the MIG devices NVML lists. Start as the file says; the
    #: agent's MIG calls change them (until the file changes).
    gpu_instances: dict[int, str] = field(default_factory=dict)
    instances: list[SimMigInstance] = field(default_factory=list)
    #: Each GPU instance's first memory slice (``sim_mig``: NVML's placement).
    starts: dict[int, int] = field(default_factory=dict)

    def placed(self) -> list[sim_mig.Placement]:
        return [(s, sim_mig.size_of(self.gpu_instances[gi])) for gi, s in self.starts.items()]


class SimulatedNvml:
    """Serves one ``SimMachine`` through the subset of pynvml that NvmlReader uses.

    ``node_name`` seeds the UUIDs a file leaves out, so one file on many (KWOK) nodes
    still gives every card a cluster-wide unique UUID. ``pinned_uuids=False`` derives the
    UUIDs a file does pin from the node name too (the pinned one seeds it), so a bundled
    machine on a thousand nodes is a thousand sets of cards rather than one set a thousand
    times; the demo keeps the pins, which its examples name. ``error`` builds the exception
    for an NVML return code: ``SimulatedNvmlError`` by default; tests pass the real
    binding's ``NVMLError`` (which picks the code's subclass) to check that the reader
    copes with the real exception classes.
    """

    def __init__(
        self,
        machine: SimMachine,
        node_name: str = "sim",
        *,
        pinned_uuids: bool = True,
        error: type[Exception] = SimulatedNvmlError,
    ) -> None:
        self._node_name = node_name
        self._pinned_uuids = pinned_uuids
        self._error = error
        self._changed = threading.Condition()
        self._emitted: set[tuple[str, int]] = set()
        self._machine = machine
        self._cards: list[_Card] = []
        self._pcie: dict[tuple[int, int], P2PLevel] = {}
        self.update(machine)

    def update(self, machine: SimMachine) -> None:
        """Serve a new version of the machine (the file changed)."""
        cards = [self._card(index, gpu, machine) for index, gpu in enumerate(machine.gpus)]
        _attach_nvlinks(cards, machine.nvlink)
        pcie = {
            (a, b): rule.level
            for rule in machine.pcie
            for a, b in itertools.permutations(rule.gpus, 2)
        }
        with self._changed:
            self._machine, self._cards, self._pcie = machine, cards, pcie
            self._changed.notify_all()

    def sysfs_numa_node(self, bus_id: str) -> int | None:
        """What /sys/bus/pci/devices/<bus>/numa_node would say on this machine."""
        for card in self._cards:
            if card.bus_id.lower() == bus_id.lower():
                return card.numa_node
        return None

    def module(self) -> ModuleType:
        """A module object with pynvml's names, minus the ones the file marks absent."""
        module = ModuleType("pynvml_simulated", "Simulated NVML (vgpu-operator)")
        constants: dict[str, Any] = {
            "NVMLError": self._error,
            "NVML_ERROR_INVALID_ARGUMENT": _ERROR_INVALID_ARGUMENT,
            "NVML_ERROR_NOT_SUPPORTED": _ERROR_NOT_SUPPORTED,
            "NVML_ERROR_NOT_FOUND": _ERROR_NOT_FOUND,
            "NVML_ERROR_TIMEOUT": _ERROR_TIMEOUT,
            "NVML_ERROR_GPU_IS_LOST": _ERROR_GPU_IS_LOST,
            "NVML_ERROR_IN_USE": _ERROR_IN_USE,
            "NVML_ERROR_INSUFFICIENT_RESOURCES": _ERROR_INSUFFICIENT_RESOURCES,
            "NVML_GPU_INSTANCE_PROFILE_COUNT": 0x12,
            "NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED": 0,
            **{f"NVML_COMPUTE_INSTANCE_PROFILE_{n}_SLICE": i for i, (n, _) in _GI_PROFILES.items()},
            "NVML_FEATURE_DISABLED": 0,
            "NVML_FEATURE_ENABLED": 1,
            "NVML_DEVICE_MIG_DISABLE": 0,
            "NVML_DEVICE_MIG_ENABLE": 1,
            "NVML_NVLINK_MAX_LINKS": MAX_NVLINKS_PER_GPU,
            "NVML_NVLINK_DEVICE_TYPE_GPU": 0,
            "NVML_NVLINK_DEVICE_TYPE_SWITCH": 2,
            "NVML_TEMPERATURE_GPU": 0,
            "nvmlEventTypeXidCriticalError": _EVENT_XID_CRITICAL,
            "c_nvmlGpuInstancePlacement_t": _PlacementStruct,
        }
        vars(module).update(constants)
        absent = set(self._machine.absent)
        for name in dir(self):
            if name.startswith("nvml") and name not in absent:
                setattr(module, name, getattr(self, name))
        return module

    # --- system (method names are pynvml's) -----------------------------------------

    def nvmlInit(self) -> None:
        self._system_call("nvmlInit")

    def nvmlShutdown(self) -> None:
        self._system_call("nvmlShutdown")

    def nvmlSystemGetDriverVersion(self) -> str:
        self._system_call("nvmlSystemGetDriverVersion")
        if self._machine.driver_version is None:
            raise self._error(_ERROR_NOT_SUPPORTED)
        return self._machine.driver_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._system_call("nvmlSystemGetCudaDriverVersion")
        if self._machine.cuda_version is None:
            raise self._error(_ERROR_NOT_SUPPORTED)
        major, minor = (int(part) for part in self._machine.cuda_version.split("."))
        return major * 1000 + minor * 10

    def nvmlDeviceGetCount(self) -> int:
        self._system_call("nvmlDeviceGetCount")
        return len(self._cards)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._system_call("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self._cards):
            raise self._error(_ERROR_INVALID_ARGUMENT)
        return _Handle(index)

    # --- one card -------------------------------------------------------------------

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        card = self._device_call("nvmlDeviceGetUUID", handle)
        if handle.mig_slot is not None:
            pinned = self._mig(card, handle).uuid
            if pinned is not None and self._pinned_uuids:
                return pinned
            # Unpinned, a MIG instance follows its card's (per-node) UUID.
            return _mig_uuid(card.uuid, handle.mig_slot)
        return card.uuid

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        card = self._device_call("nvmlDeviceGetName", handle)
        if handle.mig_slot is not None:
            return f"{card.name} MIG {self._mig(card, handle).profile}"
        return card.name

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle, version: Any = None) -> SimpleNamespace:
        card = self._device_call("nvmlDeviceGetMemoryInfo", handle)
        if handle.mig_slot is not None:
            total = self._mig(card, handle).memory_mib * MIB
            return SimpleNamespace(total=total, used=0, free=total)
        total = card.memory_mib * MIB
        used = (card.telemetry.memory_used_mib or 0) * MIB
        return SimpleNamespace(total=total, used=used, free=total - used)

    def nvmlDeviceGetPciInfo(self, handle: _Handle) -> SimpleNamespace:
        card = self._device_call("nvmlDeviceGetPciInfo", handle)
        return SimpleNamespace(busId=card.bus_id, busIdLegacy=card.bus_id[4:])

    def nvmlDeviceGetNumaNodeId(self, handle: _Handle) -> int:
        card = self._device_call("nvmlDeviceGetNumaNodeId", handle)
        if card.numa_node is None:
            raise self._error(_ERROR_NOT_SUPPORTED)
        return card.numa_node

    def nvmlDeviceGetMigMode(self, handle: _Handle) -> tuple[int, int]:
        card = self._device_call("nvmlDeviceGetMigMode", handle)
        if card.gpu.mig_mode is None:
            raise self._error(_ERROR_NOT_SUPPORTED)
        mode = int(card.gpu.mig_mode)
        return mode, mode

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: _Handle) -> int:
        card = self._device_call("nvmlDeviceGetMaxMigDeviceCount", handle)
        return 7 if card.gpu.mig_mode else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: _Handle, slot: int) -> _Handle:
        card = self._device_call("nvmlDeviceGetMigDeviceHandleByIndex", handle)
        if not card.gpu.mig_mode or not 0 <= slot < len(card.instances):
            raise self._error(_ERROR_NOT_FOUND)
        return _Handle(handle.index, slot)

    def nvmlDeviceGetGpuInstanceId(self, handle: _Handle) -> int:
        card = self._device_call("nvmlDeviceGetGpuInstanceId", handle)
        return self._mig(card, handle).gpu_instance_id

    def nvmlDeviceGetComputeInstanceId(self, handle: _Handle) -> int:
        card = self._device_call("nvmlDeviceGetComputeInstanceId", handle)
        return self._mig(card, handle).compute_instance_id

    # --- MIG management (the calls the agent makes to create instances) -------------

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> _Handle:
        self._system_call("nvmlDeviceGetHandleByUUID")
        text = uuid.decode() if isinstance(uuid, bytes) else uuid
        for card in self._cards:
            if card.uuid == text:
                return _Handle(card.index)
        raise self._error(_ERROR_NOT_FOUND)

    def nvmlDeviceGetGpuInstanceProfileInfo(
        self, handle: _Handle, profile: int, version: int = 2
    ) -> SimpleNamespace:
        card = self._device_call("nvmlDeviceGetGpuInstanceProfileInfo", handle)
        if not card.gpu.mig_mode or profile not in _GI_PROFILES:
            raise self._error(_ERROR_NOT_SUPPORTED)
        slices, eighths = _GI_PROFILES[profile]
        memory_mb = eighths * (card.memory_mib // 8) - 256
        name = f"{slices}g.{-(-memory_mb // 1024)}gb"
        return SimpleNamespace(
            id=profile, sliceCount=slices, memorySizeMB=memory_mb, name=f"MIG {name}"
        )

    def nvmlDeviceCreateGpuInstance(self, handle: _Handle, profile: int) -> _GpuInstance:
        card = self._device_call("nvmlDeviceCreateGpuInstance", handle)
        name = self.nvmlDeviceGetGpuInstanceProfileInfo(handle, profile).name
        return self._place(card, name.removeprefix("MIG "), None)

    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self, handle: _Handle, profile: int, placement: Any
    ) -> _GpuInstance:
        card = self._device_call("nvmlDeviceCreateGpuInstanceWithPlacement", handle)
        name = self.nvmlDeviceGetGpuInstanceProfileInfo(handle, profile).name
        return self._place(card, name.removeprefix("MIG "), int(placement.start))

    def _place(self, card: _Card, profile: str, start: int | None) -> _GpuInstance:
        used = sum(_slices(p) for p in card.gpu_instances.values())
        if start is None:
            start = sim_mig.first_start(profile, card.placed())
        if (
            start is None
            or used + _slices(profile) > _COMPUTE_SLICES
            or not sim_mig.fits_at(profile, start, card.placed())
        ):
            raise self._error(_ERROR_INSUFFICIENT_RESOURCES)
        gi = next(i for i in itertools.count(1) if i not in card.gpu_instances)
        card.gpu_instances[gi] = profile
        card.starts[gi] = start
        return _GpuInstance(card.index, gi)

    def nvmlGpuInstanceGetInfo(self, gpu_instance: _GpuInstance) -> SimpleNamespace:
        card = self._cards[gpu_instance.index]
        gi = gpu_instance.gpu_instance_id
        if gi not in card.gpu_instances:
            raise self._error(_ERROR_NOT_FOUND)
        size = sim_mig.size_of(card.gpu_instances[gi])
        placement = SimpleNamespace(start=card.starts[gi], size=size)
        return SimpleNamespace(id=gi, placement=placement)

    def nvmlDeviceGetGpuInstanceById(self, handle: _Handle, gi: int) -> _GpuInstance:
        card = self._device_call("nvmlDeviceGetGpuInstanceById", handle)
        if gi not in card.gpu_instances:
            raise self._error(_ERROR_NOT_FOUND)
        return _GpuInstance(card.index, gi)

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, gpu_instance: _GpuInstance, profile: int, engine: int, version: int = 2
    ) -> SimpleNamespace:
        if profile not in _GI_PROFILES:
            raise self._error(_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(id=profile, sliceCount=_GI_PROFILES[profile][0])

    def nvmlGpuInstanceCreateComputeInstance(
        self, gpu_instance: _GpuInstance, profile: int
    ) -> _ComputeInstance:
        card = self._cards[gpu_instance.index]
        gi = gpu_instance.gpu_instance_id
        name = card.gpu_instances.get(gi)
        if name is None:
            raise self._error(_ERROR_NOT_FOUND)
        if any(m.gpu_instance_id == gi for m in card.instances):
            raise self._error(_ERROR_INSUFFICIENT_RESOURCES)
        eighths = next(e for s, e in _GI_PROFILES.values() if s == _slices(name))
        card.instances.append(
            SimMigInstance(
                profile=name,
                memory_mib=eighths * (card.memory_mib // 8) - 256,
                gpu_instance_id=gi,
                compute_instance_id=0,
                uuid=_mig_uuid(card.uuid, f"gi{gi}"),
            )
        )
        return _ComputeInstance(card.index, gi, 0)

    def nvmlGpuInstanceGetComputeInstanceById(
        self, gpu_instance: _GpuInstance, ci: int
    ) -> _ComputeInstance:
        card = self._cards[gpu_instance.index]
        gi = gpu_instance.gpu_instance_id
        if not any(m.gpu_instance_id == gi and m.compute_instance_id == ci for m in card.instances):
            raise self._error(_ERROR_NOT_FOUND)
        return _ComputeInstance(card.index, gi, ci)

    def nvmlComputeInstanceDestroy(self, compute_instance: _ComputeInstance) -> None:
        card = self._cards[compute_instance.index]
        card.instances = [
            m for m in card.instances if m.gpu_instance_id != compute_instance.gpu_instance_id
        ]

    def nvmlGpuInstanceDestroy(self, gpu_instance: _GpuInstance) -> None:
        card = self._cards[gpu_instance.index]
        gi = gpu_instance.gpu_instance_id
        if any(m.gpu_instance_id == gi for m in card.instances):
            raise self._error(_ERROR_IN_USE)
        card.gpu_instances.pop(gi, None)
        card.starts.pop(gi, None)

    def nvmlDeviceGetUtilizationRates(self, handle: _Handle) -> SimpleNamespace:
        card = self._device_call("nvmlDeviceGetUtilizationRates", handle)
        if card.telemetry.utilization is None:
            raise self._error(_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(gpu=round(card.telemetry.utilization * 100), memory=0)

    def nvmlDeviceGetTemperature(self, handle: _Handle, sensor: int) -> int:
        card = self._device_call("nvmlDeviceGetTemperature", handle)
        if card.telemetry.temperature_celsius is None:
            raise self._error(_ERROR_NOT_SUPPORTED)
        return round(card.telemetry.temperature_celsius)

    def nvmlDeviceGetPowerUsage(self, handle: _Handle) -> int:
        card = self._device_call("nvmlDeviceGetPowerUsage", handle)
        if card.telemetry.power_watts is None:
            raise self._error(_ERROR_NOT_SUPPORTED)
        return round(card.telemetry.power_watts * 1000)

    # --- pairs and links ------------------------------------------------------------

    def nvmlDeviceGetTopologyCommonAncestor(self, first: _Handle, second: _Handle) -> int:
        a = self._device_call("nvmlDeviceGetTopologyCommonAncestor", first)
        b = self._device_call("nvmlDeviceGetTopologyCommonAncestor", second)
        level = self._pcie.get((a.index, b.index))
        if level is None or level is P2PLevel.UNKNOWN:
            # Without a rule: same socket or not, as on a plain two-socket server.
            same = a.numa_node is not None and a.numa_node == b.numa_node
            level = P2PLevel.SAME_CPU if same else P2PLevel.CROSS_CPU
        return _NVML_LEVELS[level]

    def nvmlDeviceGetNvLinkState(self, handle: _Handle, link: int) -> int:
        card = self._device_call("nvmlDeviceGetNvLinkState", handle)
        if not card.nvlinks:
            raise self._error(_ERROR_NOT_SUPPORTED)
        if not 0 <= link < MAX_NVLINKS_PER_GPU:
            raise self._error(_ERROR_INVALID_ARGUMENT)
        return 1 if link < len(card.nvlinks) else 0

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: _Handle, link: int) -> SimpleNamespace:
        card = self._device_call("nvmlDeviceGetNvLinkRemotePciInfo", handle)
        return SimpleNamespace(busId=self._link(card, link)[0])

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: _Handle, link: int) -> int:
        card = self._device_call("nvmlDeviceGetNvLinkRemoteDeviceType", handle)
        return 2 if self._link(card, link)[1] else 0

    # --- health events --------------------------------------------------------------

    def nvmlEventSetCreate(self) -> object:
        self._system_call("nvmlEventSetCreate")
        return SimpleNamespace(handles=[])

    def nvmlEventSetFree(self, event_set: Any) -> None:
        self._system_call("nvmlEventSetFree")

    def nvmlDeviceGetSupportedEventTypes(self, handle: _Handle) -> int:
        self._device_call("nvmlDeviceGetSupportedEventTypes", handle)
        return _EVENT_XID_CRITICAL | _EVENT_SINGLE_BIT_ECC | _EVENT_DOUBLE_BIT_ECC

    def nvmlDeviceRegisterEvents(self, handle: _Handle, mask: int, event_set: Any) -> None:
        card = self._device_call("nvmlDeviceRegisterEvents", handle)
        event_set.handles.append(card.uuid)

    def nvmlEventSetWait(self, event_set: Any, timeout_ms: int) -> SimpleNamespace:
        """The next XID the file lists that was not delivered yet, or TIMEOUT."""
        self._system_call("nvmlEventSetWait")
        deadline = time.monotonic() + timeout_ms / 1000
        with self._changed:
            while True:
                for card in self._cards:
                    if card.uuid not in event_set.handles:
                        continue
                    for xid in card.gpu.xid:
                        if (card.uuid, xid) not in self._emitted:
                            self._emitted.add((card.uuid, xid))
                            return SimpleNamespace(
                                eventType=_EVENT_XID_CRITICAL,
                                eventData=xid,
                                device=_Handle(card.index),
                                gpuInstanceId=_NO_INSTANCE,
                                computeInstanceId=_NO_INSTANCE,
                            )
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._error(_ERROR_TIMEOUT)
                self._changed.wait(left)

    # --- plumbing -------------------------------------------------------------------

    def _card(self, index: int, gpu: SimGpu, machine: SimMachine) -> _Card:
        defaults = machine.defaults
        memory_mib = gpu.memory_mib if gpu.memory_mib is not None else defaults.memory_mib
        telemetry = SimCard(
            memory_used_mib=_first(gpu.memory_used_mib, defaults.memory_used_mib),
            utilization=_first(gpu.utilization, defaults.utilization),
            temperature_celsius=_first(gpu.temperature_celsius, defaults.temperature_celsius),
            power_watts=_first(gpu.power_watts, defaults.power_watts),
        )
        return _Card(
            index=index,
            uuid=self._card_uuid(index, gpu, machine),
            name=gpu.name or defaults.name or "",
            memory_mib=memory_mib or 0,
            bus_id=gpu.pci_bus_id or f"00000000:{0x18 + 0x10 * index:02X}:00.0",
            numa_node=_first(gpu.numa_node, defaults.numa_node),
            gpu=gpu,
            telemetry=telemetry,
            unsupported=frozenset(machine.unsupported + defaults.unsupported + gpu.unsupported),
            gpu_instances={m.gpu_instance_id: m.profile for m in gpu.mig_instances},
            instances=list(gpu.mig_instances),
            starts=_starts(gpu.mig_instances),
        )

    def _card_uuid(self, index: int, gpu: SimGpu, machine: SimMachine) -> str:
        if gpu.uuid is not None and self._pinned_uuids:
            return gpu.uuid
        # The pinned UUID (else the card's index) tells the cards of one machine apart.
        seed = gpu.uuid if gpu.uuid is not None else str(index)
        return _derived_uuid(self._node_name, machine.name, seed)

    def _system_call(self, name: str) -> None:
        if name in self._machine.unsupported:
            raise self._error(_ERROR_NOT_SUPPORTED)

    def _device_call(self, name: str, handle: _Handle) -> _Card:
        if not isinstance(handle, _Handle) or not 0 <= handle.index < len(self._cards):
            raise self._error(_ERROR_INVALID_ARGUMENT)
        card = self._cards[handle.index]
        if card.gpu.lost:
            raise self._error(_ERROR_GPU_IS_LOST)
        if name in card.unsupported:
            raise self._error(_ERROR_NOT_SUPPORTED)
        return card

    def _mig(self, card: _Card, handle: _Handle) -> SimMigInstance:
        assert handle.mig_slot is not None
        return card.instances[handle.mig_slot]

    def _link(self, card: _Card, link: int) -> tuple[str, bool]:
        if not 0 <= link < len(card.nvlinks):
            raise self._error(_ERROR_INVALID_ARGUMENT)
        return card.nvlinks[link]


def _attach_nvlinks(cards: list[_Card], nvlink: SimNvlink) -> None:
    for rule in nvlink.direct:
        for a, b in itertools.permutations(rule.gpus, 2):
            cards[a].nvlinks.extend([(cards[b].bus_id, False)] * rule.links)
    for number, fabric in enumerate(nvlink.switches):
        # One address per fabric stands for its switches: what matters to the reader is
        # which cards reach the same ones. PCI domain 0xFFFF keeps it apart from the cards.
        switch_bus_id = f"0000FFFF:{number:02X}:00.0"
        for index in fabric.gpus:
            cards[index].nvlinks.extend([(switch_bus_id, True)] * fabric.links_per_gpu)
    bus_ids = [card.bus_id.lower() for card in cards]
    if len(set(bus_ids)) != len(bus_ids):
        raise ConfigError("gpus", f"PCI bus ids repeat: {bus_ids}")
    for card in cards:
        if len(card.nvlinks) > MAX_NVLINKS_PER_GPU:
            raise ConfigError(
                f"gpus[{card.index}]", f"{len(card.nvlinks)} NVLinks exceed {MAX_NVLINKS_PER_GPU}"
            )


def _starts(instances: Iterable[SimMigInstance]) -> dict[int, int]:
    """Each file instance's start: as the file says, else where NVML would place it
    beside those placed before it (``sim_mig``); one that fits nowhere is refused."""
    starts: dict[int, int] = {}
    placed: list[sim_mig.Placement] = []
    for m in instances:
        start = m.placement_start
        if start is None:
            start = sim_mig.first_start(m.profile, placed)
        if start is None or not sim_mig.fits_at(m.profile, start, placed):
            raise ConfigError(
                "migInstances", f"GPU instance {m.gpu_instance_id} ({m.profile}) fits at no start"
            )
        starts[m.gpu_instance_id] = start
        placed.append((start, sim_mig.size_of(m.profile)))
    return starts


def _derived_uuid(node_name: str, machine_name: str, seed: str) -> str:
    return "GPU-" + str(uuid_lib.uuid5(_UUID_NAMESPACE, f"{node_name}/{machine_name}/{seed}"))


def _mig_uuid(gpu_uuid: str, key: int | str) -> str:
    return "MIG-" + str(uuid_lib.uuid5(_UUID_NAMESPACE, f"{gpu_uuid}/mig/{key}"))


def _slices(profile: str) -> int:
    """``3g.20gb`` -> 3."""
    head = profile.split("g.", 1)[0]
    return int(head) if head.isdigit() else 0


def _first(*values: _T | None) -> _T | None:
    return next((v for v in values if v is not None), None)


# --- The backend --------------------------------------------------------------------


class SimulatedBackend:
    """The agent backend for ``--backend sim:FILE``: re-reads FILE when it changes."""

    def __init__(
        self,
        path: Path,
        node_name: str,
        *,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.path = path
        self.description = f"sim:{path}"
        self._node_name = node_name
        self._sleep = sleep
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._sim: SimulatedNvml | None = None
        self._reader: NvmlReader | None = None

    def open(self) -> None:
        machine = load_machine(self.path)
        self._stamp = _stamp(self.path)
        self._sim = SimulatedNvml(machine, self._node_name)
        self._reader = NvmlReader(
            self._sim.module(),
            numa_from_bus_id=self._sim.sysfs_numa_node,
            description=self.description,
            sleep=self._sleep,
        )
        self._reader.open()

    def read(self) -> MachineReading:
        self._reload_if_changed()
        return self._opened_reader().read()

    def watch_health(self, timeout_s: float) -> bool:
        self._reload_if_changed()
        return self._opened_reader().watch_health(timeout_s)

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()

    def nvml_module(self) -> Any:
        """The simulation's pynvml-shaped module (MIG instances are made through it)."""
        self._reload_if_changed()
        return self._opened_reader().nvml_module()

    def _opened_reader(self) -> NvmlReader:
        if self._reader is None:
            raise RuntimeError("SimulatedBackend.open() was not called")
        return self._reader

    def _reload_if_changed(self) -> None:
        with self._lock:
            stamp = _stamp(self.path)
            if stamp is None or stamp == self._stamp or self._sim is None:
                return
            try:
                machine = load_machine(self.path)
                self._sim.update(machine)
            except ConfigError as exc:
                # Half-written files are normal while a test rewrites one; keep serving
                # the last good version and try again next time.
                log.warning("machine_file_rejected", path=str(self.path), error=str(exc))
                return
            self._stamp = stamp
            reader = self._opened_reader()
            reader.nvml = self._sim.module()
            reader.invalidate_topology()
            log.info("machine_file_reloaded", path=str(self.path), gpus=len(machine.gpus))


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size
