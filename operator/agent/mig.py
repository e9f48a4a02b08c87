"""MIG instances for Allocate: the instance a ``[geometry-slot]`` entry names, created or
reused through NVML (the simulated machine answers the same calls).

The scheduler writes ``GPU-x[g-s]``: geometry ``g`` of the card's model in the device
config's ``knownMigGeometries``, and slot ``s`` of that geometry's flattened instance list
(each template repeated ``count`` times). The card must run exactly that geometry:

- when its instances already are the geometry's (the same profiles, as many of each),
  they are reused;
- otherwise every instance is destroyed and the geometry created, in order. The scheduler
  changes a card's geometry only when none of its instances is in use (hami-semantics
  §12.1), so nothing running is taken away; if NVML says an instance is busy, Allocate
  fails with that, and nothing is guessed.

Slot ``s`` is the ``k``-th instance of its profile, ``k`` counting the earlier slots with
the same profile, instances of one profile ordered by GPU instance id: the same slot names
the same instance every time while the geometry stands.

Blocking (NVML); called from a worker thread, one at a time (a lock).
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import structlog

from vgpu_operator.agent.deviceplugin.allocation import AllocationError
from vgpu_operator.agent.inventory import hami_type
from vgpu_operator.agent.nvml import mig_profile_from_name
from vgpu_operator.devices import model
from vgpu_operator.scheduling.mig import mig as mig_geometry

log = structlog.get_logger(__name__)

_MIG_ENABLE: Final = 1
#: Enough for every MIG device of any card (A100/H100: 7).
_MAX_SLOTS: Final = 8


@dataclass(frozen=True, slots=True)
class Instance:
    """One existing MIG device of a card."""

    gpu_instance_id: int
    compute_instance_id: int
    profile: str
    uuid: str


def needs_rebuild(current: Sequence[Instance], profiles: Sequence[str]) -> bool:
    """Whether the card's instances differ from the geometry's (as multisets)."""
    return Counter(i.profile for i in current) != Counter(profiles)


def instance_for_slot(current: Sequence[Instance], profiles: Sequence[str], slot: int) -> Instance:
    """The instance slot ``slot`` of the geometry names, once the card runs it."""
    profile = profiles[slot]
    rank = sum(1 for p in profiles[:slot] if p == profile)
    same = sorted((i for i in current if i.profile == profile), key=lambda i: i.gpu_instance_id)
    return same[rank]


def profile_name(slices: int, memory_mb: int) -> str:
    """NVIDIA's profile name from a GPU instance profile: ``1g.5gb`` (memory rounded up)."""
    return f"{slices}g.{math.ceil(memory_mb / 1024)}gb"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class MigInstances:
    """Creates or reuses the MIG instance of an entry, through a pynvml-shaped module."""

    def __init__(
        self,
        nvml: Callable[[], Any],
        geometries_for: Callable[[str], Sequence[model.Geometry]],
    ) -> None:
        #: The module, asked for at each call (the simulation swaps it when its file changes).
        self._nvml = nvml
        self._geometries_for = geometries_for
        self._lock = threading.Lock()

    def device(self, card_uuid: str, geometry: int, slot: int) -> str:
        """The MIG device UUID for ``card_uuid[geometry-slot]``; raises AllocationError."""
        with self._lock:
            nvml = self._nvml()
            try:
                return self._device(nvml, card_uuid, geometry, slot)
            except nvml.NVMLError as exc:
                raise AllocationError(
                    f"NVML refused MIG instance {card_uuid}[{geometry}-{slot}]: {exc}"
                ) from exc

    def offered_profiles(self, card_uuid: str) -> list[str]:
        """The GPU instance profiles the card offers, by NVIDIA's name (``1g.10gb``),
        fewest slices first; raises AllocationError. (For tools that pick one to create:
        ``make gpu-check``.)"""
        with self._lock:
            nvml = self._nvml()
            try:
                handle = nvml.nvmlDeviceGetHandleByUUID(card_uuid)
                profiles = self._gpu_instance_profiles(nvml, handle)
            except nvml.NVMLError as exc:
                raise AllocationError(
                    f"NVML refused the MIG profiles of {card_uuid}: {exc}"
                ) from exc
        return sorted(
            profiles,
            key=lambda name: (int(profiles[name].sliceCount), int(profiles[name].memorySizeMB)),
        )

    def remove_all(self, card_uuid: str) -> list[str]:
        """Destroy every MIG instance of the card, as a geometry change does; the UUIDs of
        those destroyed. Raises AllocationError (an instance in use, for one)."""
        with self._lock:
            nvml = self._nvml()
            try:
                handle = nvml.nvmlDeviceGetHandleByUUID(card_uuid)
                instances = self._instances(nvml, handle)
                self._destroy(nvml, handle, instances)
            except nvml.NVMLError as exc:
                raise AllocationError(
                    f"NVML refused to remove the MIG instances of {card_uuid}: {exc}"
                ) from exc
        return [i.uuid for i in instances]

    def _device(self, nvml: Any, card_uuid: str, geometry: int, slot: int) -> str:
        handle = nvml.nvmlDeviceGetHandleByUUID(card_uuid)
        card_type = hami_type(_text(nvml.nvmlDeviceGetName(handle)))
        geometries = self._geometries_for(card_type)
        if not 0 <= geometry < len(geometries):
            raise AllocationError(
                f"the device config's knownMigGeometries give {card_type} {len(geometries)} "
                f"geometries; the allocation names geometry {geometry} on {card_uuid}: the "
                "operator and this agent read different device configs?"
            )
        profiles = [t.name for t in mig_geometry.flatten(geometries[geometry])]
        if not 0 <= slot < len(profiles):
            raise AllocationError(
                f"geometry {geometry} of {card_type} has {len(profiles)} instances; the "
                f"allocation names slot {slot} on {card_uuid}"
            )
        current, _ = nvml.nvmlDeviceGetMigMode(handle)
        if current != getattr(nvml, "NVML_DEVICE_MIG_ENABLE", _MIG_ENABLE):
            raise AllocationError(
                f"{card_uuid} is not in MIG mode; enable it (nvidia-smi -mig 1) or let the "
                "card register in hami-core mode"
            )
        instances = self._instances(nvml, handle)
        if needs_rebuild(instances, profiles):
            log.info(
                "mig_geometry_applied",
                card=card_uuid,
                before=sorted(i.profile for i in instances),
                after=profiles,
            )
            self._destroy(nvml, handle, instances)
            self._create(nvml, handle, profiles)
            instances = self._instances(nvml, handle)
            if needs_rebuild(instances, profiles):
                raise AllocationError(
                    f"{card_uuid} runs {sorted(i.profile for i in instances)} after creating "
                    f"geometry {geometry} ({profiles})"
                )
        return instance_for_slot(instances, profiles, slot).uuid

    def _instances(self, nvml: Any, handle: Any) -> list[Instance]:
        found: list[Instance] = []
        count = int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))
        for index in range(min(count, _MAX_SLOTS)):
            try:
                device = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, index)
            except nvml.NVMLError:
                continue  # an empty slot
            profile = mig_profile_from_name(_text(nvml.nvmlDeviceGetName(device))) or ""
            found.append(
                Instance(
                    gpu_instance_id=int(nvml.nvmlDeviceGetGpuInstanceId(device)),
                    compute_instance_id=int(nvml.nvmlDeviceGetComputeInstanceId(device)),
                    profile=profile,
                    uuid=_text(nvml.nvmlDeviceGetUUID(device)),
                )
            )
        return found

    def _destroy(self, nvml: Any, handle: Any, instances: Sequence[Instance]) -> None:
        for instance in instances:
            gpu_instance = nvml.nvmlDeviceGetGpuInstanceById(handle, instance.gpu_instance_id)
            compute = nvml.nvmlGpuInstanceGetComputeInstanceById(
                gpu_instance, instance.compute_instance_id
            )
            nvml.nvmlComputeInstanceDestroy(compute)
            nvml.nvmlGpuInstanceDestroy(gpu_instance)

    def _create(self, nvml: Any, handle: Any, profiles: Sequence[str]) -> None:
        by_name = self._gpu_instance_profiles(nvml, handle)
        for name in profiles:
            info = by_name.get(name)
            if info is None:
                raise AllocationError(
                    f"this card offers no MIG profile {name!r} (it offers {sorted(by_name)})"
                )
            gpu_instance = nvml.nvmlDeviceCreateGpuInstance(handle, info.id)
            # One compute instance over the whole GPU instance: the same slice count.
            compute_profile = getattr(
                nvml, f"NVML_COMPUTE_INSTANCE_PROFILE_{info.sliceCount}_SLICE", None
            )
            if compute_profile is None:
                raise AllocationError(f"no compute instance profile of {info.sliceCount} slices")
            compute = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gpu_instance,
                compute_profile,
                getattr(nvml, "NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED", 0),
            )
            nvml.nvmlGpuInstanceCreateComputeInstance(gpu_instance, compute.id)

    def _gpu_instance_profiles(self, nvml: Any, handle: Any) -> dict[str, Any]:
        """The card's GPU instance profiles by NVIDIA's name (``1g.5gb``)."""
        profiles: dict[str, Any] = {}
        for profile in range(int(getattr(nvml, "NVML_GPU_INSTANCE_PROFILE_COUNT", 0x12))):
            try:
                info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, profile)
            except nvml.NVMLError:
                continue  # a profile this card does not have
            name = _text(getattr(info, "name", "") or "")
            short = mig_profile_from_name(" " + name) if name else None
            key = short or profile_name(int(info.sliceCount), int(info.memorySizeMB))
            # The first profile of a name wins: the plain one comes before its variants.
            profiles.setdefault(key, info)
        return profiles
