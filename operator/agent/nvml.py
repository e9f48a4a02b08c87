"""Reading GPUs through NVML: the only module that imports pynvml.

``NvmlReader`` talks to any object shaped like the ``pynvml`` module (nvidia-ml-py):
the real one, imported lazily in ``open()``, or the simulated machine of
``agent.simulated``. Calls a card or a binding does not support (NUMA on many PCIe
boards, NVLink on consumer cards, functions missing from old bindings) degrade to
"unknown" (``None``); they never stop the reading of the other cards.

Health comes from NVML's critical-XID events (``watch_health``) and from cards that
stop answering (lost) or vanish from the count; both are sticky until the agent
restarts, as with HAMi's device plugin.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Final

import structlog

from vgpu_operator.agent import health
from vgpu_operator.agent.readings import (
    GpuReading,
    LinkReading,
    MachineReading,
    MigInstanceReading,
    Topology,
)
from vgpu_operator.devices.links import P2PLevel

log = structlog.get_logger(__name__)

# NVML return codes (nvml.h), used when a binding does not define the constant.
_NOT_SUPPORTED: Final = 3
_NO_PERMISSION: Final = 4
_NOT_FOUND: Final = 6
_TIMEOUT: Final = 10
_FUNCTION_NOT_FOUND: Final = 13
_GPU_IS_LOST: Final = 15
_INVALID_ARGUMENT: Final = 2

_FEATURE_ENABLED: Final = 1
_MIG_ENABLE: Final = 1
_NVLINK_DEVICE_TYPE_SWITCH: Final = 2
_TEMPERATURE_GPU: Final = 0
_EVENT_XID_CRITICAL: Final = 0x8
#: nvml.h has 36 since NVLink 5; older Python bindings define 18.
_DEFAULT_MAX_NVLINKS: Final = 18


def load_pynvml() -> Any:
    """Import the real binding (nvidia-ml-py). Kept lazy so that importing this
    module needs neither the package's native library nor a GPU."""
    import pynvml

    return pynvml


def sysfs_bus_id(nvml_bus_id: str) -> str:
    """NVML's ``00000000:3B:00.0`` as sysfs names it: ``0000:3b:00.0``."""
    text = nvml_bus_id.strip().lower()
    domain, sep, rest = text.partition(":")
    if sep and len(domain) == 8:
        domain = domain[4:]
    return f"{domain}{sep}{rest}"


def read_sysfs_numa_node(bus_id: str, sysfs_root: Path = Path("/sys")) -> int | None:
    """The NUMA node of a PCI device from sysfs, or None when unknown (-1 or absent)."""
    path = sysfs_root / "bus" / "pci" / "devices" / sysfs_bus_id(bus_id) / "numa_node"
    try:
        value = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return value if value >= 0 else None


def mig_profile_from_name(name: str) -> str | None:
    """``NVIDIA A100-SXM4-40GB MIG 1g.5gb`` -> ``1g.5gb``."""
    _, sep, profile = name.rpartition(" MIG ")
    return profile.strip() or None if sep else None


def cuda_version_text(version: int) -> str:
    """NVML's integer CUDA version (12040) as text (``12.4``)."""
    return f"{version // 1000}.{version % 1000 // 10}"


def _text(value: Any) -> str:
    # Very old bindings return bytes where current ones return str.
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlReader:
    """Reads one machine through a pynvml-shaped module.

    Not thread-safe in general, except that ``watch_health`` may run in one thread
    while ``read`` runs in another (NVML itself is thread-safe; the shared health
    ledger is guarded by a lock).
    """

    def __init__(
        self,
        nvml: Any | None = None,
        *,
        numa_from_bus_id: Callable[[str], int | None] = read_sysfs_numa_node,
        description: str = "nvml",
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.nvml = nvml
        self.description = description
        self._numa_from_bus_id = numa_from_bus_id
        self._sleep = sleep
        self._lock = threading.Lock()
        self._failures: dict[str, str] = {}
        self._fail_all: str | None = None
        self._last_seen: dict[str, GpuReading] = {}
        self._last_by_index: dict[int, GpuReading] = {}
        self._topology_key: tuple[str, ...] | None = None
        self._topology: Topology = {}
        self._events: Any | None = None
        self._events_ready = False
        self._opened = False
        self._logged_failures: set[str] = set()

    # --- lifecycle ---------------------------------------------------------------

    def open(self) -> None:
        """Initialise NVML (importing the real binding if none was given)."""
        if self.nvml is None:
            self.nvml = load_pynvml()
        self.nvml.nvmlInit()
        self._opened = True

    def close(self) -> None:
        if self.nvml is None or not self._opened:
            return
        if self._events is not None:
            self._optional("nvmlEventSetFree", self._events)
            self._events = None
        self._opened = False
        self.nvml.nvmlShutdown()

    def invalidate_topology(self) -> None:
        """Forget the cached links so the next ``read`` scans them again."""
        self._topology_key = None

    # --- reading -----------------------------------------------------------------

    def read(self) -> MachineReading:
        """One full reading of the machine."""
        nvml = self._module()
        present: list[GpuReading] = []
        handles: dict[str, Any] = {}
        for index in range(int(nvml.nvmlDeviceGetCount())):
            handle, gpu = self._read_gpu(index)
            if gpu is None:
                continue
            present.append(gpu)
            if handle is not None:
                handles[gpu.uuid] = handle
        with self._lock:
            marked = [self._apply_failures(gpu) for gpu in present]
        for gpu in marked:
            self._last_seen[gpu.uuid] = gpu
            self._last_by_index[gpu.index] = gpu
        gpus = health.carry_disappeared(marked, self._last_seen)
        with self._lock:
            # A card that vanished stays unhealthy even if it comes back later.
            for gpu in gpus[len(marked) :]:
                self._failures.setdefault(gpu.uuid, gpu.health_reason or "GPU disappeared")
        return MachineReading(
            gpus=gpus,
            topology=self._links(handles, present),
            driver_version=self._driver_version(),
            cuda_version=self._cuda_version(),
        )

    def _read_gpu(self, index: int) -> tuple[Any | None, GpuReading | None]:
        nvml = self._module()
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            return handle, self._read_handle(index, handle)
        except nvml.NVMLError as exc:
            return None, self._unreadable(index, exc)

    def _read_handle(self, index: int, handle: Any) -> GpuReading:
        nvml = self._module()
        uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        name = _text(nvml.nvmlDeviceGetName(handle))
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        pci = self._optional("nvmlDeviceGetPciInfo", handle)
        bus_id = None if pci is None else _text(pci.busId)
        mig_enabled = self._mig_enabled(handle)
        utilization = self._optional("nvmlDeviceGetUtilizationRates", handle)
        temperature = self._optional(
            "nvmlDeviceGetTemperature",
            handle,
            getattr(nvml, "NVML_TEMPERATURE_GPU", _TEMPERATURE_GPU),
        )
        power_mw = self._optional("nvmlDeviceGetPowerUsage", handle)
        return GpuReading(
            index=index,
            uuid=uuid,
            name=name,
            memory_total_bytes=int(memory.total),
            pci_bus_id=bus_id,
            numa_node=self._numa_node(handle, bus_id),
            mig_enabled=mig_enabled,
            mig_instances=self._mig_instances(handle) if mig_enabled else (),
            memory_used_bytes=_int_or_none(getattr(memory, "used", None)),
            utilization_ratio=None if utilization is None else float(utilization.gpu) / 100,
            temperature_celsius=None if temperature is None else float(temperature),
            power_watts=None if power_mw is None else float(power_mw) / 1000,
        )

    def _unreadable(self, index: int, exc: Exception) -> GpuReading | None:
        """A card that fails its basic calls: keep its last reading, marked unhealthy."""
        code = getattr(exc, "value", None)
        lost = code == self._code("NVML_ERROR_GPU_IS_LOST", _GPU_IS_LOST)
        reason = health.OFF_THE_BUS_REASON if lost else f"NVML error: {exc}"
        previous = self._last_by_index.get(index)
        log.warning("gpu_unreadable", index=index, error=str(exc), known=previous is not None)
        if previous is None:
            return None
        with self._lock:
            if lost:
                # A loss replaces an earlier reason (an XID): the card is gone now.
                self._failures[previous.uuid] = reason
                return replace(previous, healthy=False, health_reason=reason)
            self._failures.setdefault(previous.uuid, reason)
        return previous.unhealthy(reason)

    def _apply_failures(self, gpu: GpuReading) -> GpuReading:
        if self._fail_all is not None:
            gpu = gpu.unhealthy(self._fail_all)
        reason = self._failures.get(gpu.uuid)
        return gpu if reason is None else gpu.unhealthy(reason)

    def _numa_node(self, handle: Any, bus_id: str | None) -> int | None:
        node = self._optional("nvmlDeviceGetNumaNodeId", handle)
        if isinstance(node, int) and node >= 0:
            return node
        # Most PCIe machines answer NOT_SUPPORTED (the call only covers GPUs that are
        # NUMA nodes themselves); the PCI device's sysfs entry knows the socket.
        return None if bus_id is None else self._numa_from_bus_id(bus_id)

    def _mig_enabled(self, handle: Any) -> bool | None:
        modes = self._optional("nvmlDeviceGetMigMode", handle)
        if modes is None:
            return None
        current = modes[0] if isinstance(modes, Sequence) else modes
        return bool(current == getattr(self.nvml, "NVML_DEVICE_MIG_ENABLE", _MIG_ENABLE))

    def _mig_instances(self, handle: Any) -> tuple[MigInstanceReading, ...]:
        slots = self._optional("nvmlDeviceGetMaxMigDeviceCount", handle) or 0
        instances: list[MigInstanceReading] = []
        for slot in range(int(slots)):
            # An empty slot answers NOT_FOUND, which _optional turns into None.
            mig = self._optional("nvmlDeviceGetMigDeviceHandleByIndex", handle, slot)
            if mig is None:
                continue
            uuid = self._optional("nvmlDeviceGetUUID", mig)
            if uuid is None:
                continue
            name = self._optional("nvmlDeviceGetName", mig)
            memory = self._optional("nvmlDeviceGetMemoryInfo", mig)
            gpu_instance = _int_or_none(self._optional("nvmlDeviceGetGpuInstanceId", mig))
            start, size = self._placement(handle, gpu_instance)
            instances.append(
                MigInstanceReading(
                    uuid=_text(uuid),
                    profile=None if name is None else mig_profile_from_name(_text(name)),
                    memory_total_bytes=None if memory is None else int(memory.total),
                    gpu_instance_id=gpu_instance,
                    compute_instance_id=_int_or_none(
                        self._optional("nvmlDeviceGetComputeInstanceId", mig)
                    ),
                    placement_start=start,
                    placement_size=size,
                )
            )
        return tuple(instances)

    def _placement(self, handle: Any, gpu_instance: int | None) -> tuple[int | None, int | None]:
        """Where the GPU instance sits on the card (first memory slice, slices); (None,
        None) where NVML cannot say (a driver without the call, an instance just gone)."""
        if gpu_instance is None:
            return None, None
        found = self._optional("nvmlDeviceGetGpuInstanceById", handle, gpu_instance)
        info = None if found is None else self._optional("nvmlGpuInstanceGetInfo", found)
        placement = getattr(info, "placement", None)
        start = _int_or_none(getattr(placement, "start", None))
        size = _int_or_none(getattr(placement, "size", None))
        if start is None or size is None or start < 0 or size < 1 or start + size > 8:
            return None, None  # not a placement of the 8 memory slices we publish
        return start, size

    def _driver_version(self) -> str | None:
        version = self._optional("nvmlSystemGetDriverVersion")
        return None if version is None else _text(version)

    def _cuda_version(self) -> str | None:
        version = self._optional("nvmlSystemGetCudaDriverVersion")
        return None if version is None else cuda_version_text(int(version))

    # --- topology ----------------------------------------------------------------

    def _links(self, handles: dict[str, Any], present: Sequence[GpuReading]) -> Topology:
        """Links between the present cards; scanned again only when the set changes
        (a change in the GPU count is seed 000 §9's signal to re-read the devices)."""
        key = tuple(gpu.uuid for gpu in present if gpu.uuid in handles)
        if key == self._topology_key:
            return self._topology
        by_uuid = {gpu.uuid: gpu for gpu in present}
        nvlinks = {uuid: self._nvlink_ends(handles[uuid]) for uuid in key}
        topology: dict[tuple[str, str], LinkReading] = {}
        for a in key:
            for b in key:
                if a == b:
                    continue
                topology[(a, b)] = LinkReading(
                    p2p_level=self._p2p_level(handles[a], handles[b]),
                    nvlinks=_count_nvlinks(nvlinks[a], nvlinks[b], by_uuid[b].pci_bus_id),
                )
        self._topology_key, self._topology = key, topology
        return topology

    def _p2p_level(self, first: Any, second: Any) -> P2PLevel:
        level = self._optional("nvmlDeviceGetTopologyCommonAncestor", first, second)
        if level is None:
            return P2PLevel.UNKNOWN
        try:
            return P2PLevel.from_nvml_common_ancestor(int(level))
        except ValueError:
            log.warning("unknown_topology_level", level=level)
            return P2PLevel.UNKNOWN

    def _nvlink_ends(self, handle: Any) -> list[_LinkEnd]:
        """The enabled NVLinks of one card and what each one reaches."""
        nvml = self._module()
        enabled = getattr(nvml, "NVML_FEATURE_ENABLED", _FEATURE_ENABLED)
        switch = getattr(nvml, "NVML_NVLINK_DEVICE_TYPE_SWITCH", _NVLINK_DEVICE_TYPE_SWITCH)
        ends: list[_LinkEnd] = []
        # Unused link numbers answer NOT_SUPPORTED or INVALID_ARGUMENT, and cards without
        # NVLink answer so for every number: all of these read as "no link here".
        for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", _DEFAULT_MAX_NVLINKS))):
            if self._optional("nvmlDeviceGetNvLinkState", handle, link) != enabled:
                continue
            remote = self._optional("nvmlDeviceGetNvLinkRemotePciInfo", handle, link)
            kind = self._optional("nvmlDeviceGetNvLinkRemoteDeviceType", handle, link)
            ends.append(
                _LinkEnd(
                    remote_bus_id=None if remote is None else sysfs_bus_id(_text(remote.busId)),
                    to_switch=kind == switch,
                )
            )
        return ends

    # --- health events -----------------------------------------------------------

    def watch_health(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for a critical XID; True when a card's health changed.

        Blocks the calling thread (run it in a worker thread). Without event support
        it just waits, so a caller looping on it never spins.
        """
        nvml = self._module()
        if not self._events_ready:
            self._events = self._register_events()
            self._events_ready = True
        if self._events is None:
            self._sleep(timeout_s)
            return False
        try:
            data = nvml.nvmlEventSetWait(self._events, int(timeout_s * 1000))
        except nvml.NVMLError as exc:
            if getattr(exc, "value", None) == self._code("NVML_ERROR_TIMEOUT", _TIMEOUT):
                return False
            # HAMi marks every card unhealthy when the wait itself fails: after that
            # nothing would tell us about new failures.
            log.error("health_event_wait_failed", error=str(exc))
            with self._lock:
                changed = self._fail_all is None
                self._fail_all = f"health event wait failed: {exc}"
            return changed
        if not int(data.eventType) & getattr(
            nvml, "nvmlEventTypeXidCriticalError", _EVENT_XID_CRITICAL
        ):
            return False
        xid = int(data.eventData)
        if not health.is_critical_xid(xid):
            log.info("xid_ignored", xid=xid)
            return False
        uuid = self._optional("nvmlDeviceGetUUID", data.device)
        if uuid is None:
            return False
        reason = f"critical XID {xid}"
        gi = getattr(data, "gpuInstanceId", None)
        if isinstance(gi, int) and gi != 0xFFFFFFFF:
            reason += f" on MIG GPU instance {gi}"
        log.warning("gpu_xid", uuid=_text(uuid), xid=xid)
        with self._lock:
            if _text(uuid) in self._failures:
                return False
            self._failures[_text(uuid)] = reason
        return True

    def _register_events(self) -> Any | None:
        nvml = self._module()
        event_set = self._optional("nvmlEventSetCreate")
        if event_set is None:
            log.warning("health_events_unsupported")
            return None
        wanted = getattr(nvml, "nvmlEventTypeXidCriticalError", _EVENT_XID_CRITICAL)
        registered = 0
        for index in range(int(nvml.nvmlDeviceGetCount())):
            handle = self._optional("nvmlDeviceGetHandleByIndex", index)
            if handle is None:
                continue
            supported = self._optional("nvmlDeviceGetSupportedEventTypes", handle)
            mask = wanted & (int(supported) if supported is not None else 0)
            if not mask:
                continue
            try:
                nvml.nvmlDeviceRegisterEvents(handle, mask, event_set)
            except nvml.NVMLError as exc:
                log.warning("health_events_unregistered", index=index, error=str(exc))
                continue
            registered += 1
        if registered == 0:
            log.warning("health_events_unsupported")
            self._optional("nvmlEventSetFree", event_set)
            return None
        return event_set

    # --- calls that may be unsupported -------------------------------------------

    def _optional(self, name: str, *args: Any) -> Any | None:
        """Call ``name`` if the binding has it; None when it cannot answer.

        Not supported, function not found (old driver), no permission, not found (an
        empty MIG slot) and invalid argument (an unused link number) all read as
        unknown, and so does any other error of an optional reading, logged once per
        call name. Only "GPU is lost" escapes: the whole card is gone.
        """
        nvml = self._module()
        fn = getattr(nvml, name, None)
        if fn is None:
            return None
        try:
            return fn(*args)
        except nvml.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code == self._code("NVML_ERROR_GPU_IS_LOST", _GPU_IS_LOST):
                raise
            if code not in self._expected_codes() and name not in self._logged_failures:
                self._logged_failures.add(name)
                log.warning("nvml_call_failed", call=name, error=str(exc))
            return None

    def _expected_codes(self) -> frozenset[int]:
        return frozenset(
            {
                self._code("NVML_ERROR_NOT_SUPPORTED", _NOT_SUPPORTED),
                self._code("NVML_ERROR_FUNCTION_NOT_FOUND", _FUNCTION_NOT_FOUND),
                self._code("NVML_ERROR_NO_PERMISSION", _NO_PERMISSION),
                self._code("NVML_ERROR_NOT_FOUND", _NOT_FOUND),
                self._code("NVML_ERROR_INVALID_ARGUMENT", _INVALID_ARGUMENT),
            }
        )

    def _code(self, name: str, default: int) -> int:
        return int(getattr(self.nvml, name, default))

    def nvml_module(self) -> Any:
        """The module this reader reads through (opened)."""
        return self._module()

    def _module(self) -> Any:
        if self.nvml is None:
            raise RuntimeError("NvmlReader.open() was not called")
        return self.nvml


class _LinkEnd:
    """What one enabled NVLink of a card reaches."""

    __slots__ = ("remote_bus_id", "to_switch")

    def __init__(self, remote_bus_id: str | None, to_switch: bool) -> None:
        self.remote_bus_id = remote_bus_id
        self.to_switch = to_switch


def _count_nvlinks(
    ends_a: Sequence[_LinkEnd], ends_b: Sequence[_LinkEnd], bus_b: str | None
) -> int:
    """NVLinks from card a to card b, HAMi's way with one refinement.

    Direct links are those whose remote end is b's PCI address. Without direct links,
    cards behind NVSwitches count ``min`` of both cards' switch links (HAMi). HAMi
    counts every pair of switch-attached cards as joined; we only count links to
    switches both cards reach, so two NVSwitch islands joined over PCIe do not look
    like one fabric. When a switch's address is unknown we fall back to HAMi's rule.
    """
    if bus_b is not None:
        target = sysfs_bus_id(bus_b)
        direct = sum(1 for end in ends_a if end.remote_bus_id == target)
        if direct:
            return direct
    switch_a = [end for end in ends_a if end.to_switch]
    switch_b = [end for end in ends_b if end.to_switch]
    if not switch_a or not switch_b:
        return 0
    if any(end.remote_bus_id is None for end in (*switch_a, *switch_b)):
        return min(len(switch_a), len(switch_b))
    shared = {end.remote_bus_id for end in switch_a} & {end.remote_bus_id for end in switch_b}
    return min(
        sum(1 for end in switch_a if end.remote_bus_id in shared),
        sum(1 for end in switch_b if end.remote_bus_id in shared),
    )


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)
