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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any, Final

import structlog

from vgpu_operator.agent import sim_mig
from vgpu_operator.agent.nvml import NvmlReader
from vgpu_operator.agent.readings import MIB, MachineReading
from vgpu_operator.agent.sim_cards import (
    MAX_NVLINKS_PER_GPU,
    ServedCard,
    mig_uuid,
    served_cards,
    slices,
)
from vgpu_operator.agent.sim_machine import SimMachine, SimMigInstance, load_machine
from vgpu_operator.devices.links import P2PLevel
from vgpu_operator.errors import ConfigError

log = structlog.get_logger(__name__)


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
        self._cards: list[ServedCard] = []
        self._pcie: dict[tuple[int, int], P2PLevel] = {}
        self.update(machine)

    def update(self, machine: SimMachine) -> None:
        """Serve a new version of the machine (the file changed)."""
        cards = served_cards(machine, self._node_name, self._pinned_uuids)
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
            return mig_uuid(card.uuid, handle.mig_slot)
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

    def _place(self, card: ServedCard, profile: str, start: int | None) -> _GpuInstance:
        used = sum(slices(p) for p in card.gpu_instances.values())
        if start is None:
            start = sim_mig.first_start(profile, card.placed())
        if (
            start is None
            or used + slices(profile) > _COMPUTE_SLICES
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
        eighths = next(e for s, e in _GI_PROFILES.values() if s == slices(name))
        card.instances.append(
            SimMigInstance(
                profile=name,
                memory_mib=eighths * (card.memory_mib // 8) - 256,
                gpu_instance_id=gi,
                compute_instance_id=0,
                uuid=mig_uuid(card.uuid, f"gi{gi}"),
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

    def _system_call(self, name: str) -> None:
        if name in self._machine.unsupported:
            raise self._error(_ERROR_NOT_SUPPORTED)

    def _device_call(self, name: str, handle: _Handle) -> ServedCard:
        if not isinstance(handle, _Handle) or not 0 <= handle.index < len(self._cards):
            raise self._error(_ERROR_INVALID_ARGUMENT)
        card = self._cards[handle.index]
        if card.gpu.lost:
            raise self._error(_ERROR_GPU_IS_LOST)
        if name in card.unsupported:
            raise self._error(_ERROR_NOT_SUPPORTED)
        return card

    def _mig(self, card: ServedCard, handle: _Handle) -> SimMigInstance:
        assert handle.mig_slot is not None
        return card.instances[handle.mig_slot]

    def _link(self, card: ServedCard, link: int) -> tuple[str, bool]:
        if not 0 <= link < len(card.nvlinks):
            raise self._error(_ERROR_INVALID_ARGUMENT)
        return card.nvlinks[link]


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
