"""Prepare and Unprepare of a MIG instance on the DRA path: the allocated placement is
created through NVML (the simulated machine answers the same calls), its UUID handed to
the container through CDI, and the instance destroyed again on Unprepare.

A claim allocated a MIG device (``devices.dra_mig``: ``<card>-mig-<profile>-<start>``)
gets a GPU instance of that profile, at that start where NVML can place it
(``nvmlDeviceCreateGpuInstanceWithPlacement``; a driver without it places the instance
itself, which the counters the allocator honoured leave room for), and one compute
instance over all of it. The CDI device sets ``NVIDIA_VISIBLE_DEVICES`` to the instance's
UUID and records card, GPU instance and UUID in an annotation, so Unprepare (after an
agent restart too) destroys exactly it. An instance is never shared: no HAMi-core limits.

Blocking (NVML); one call at a time (a lock).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import structlog

from vgpu_operator.agent.dra import cdi, prepare
from vgpu_operator.agent.nvml import mig_profile_from_name
from vgpu_operator.devices import dra, dra_mig

log = structlog.get_logger("vgpu_operator.dra")

#: The CDI device annotation recording the instance a device created.
INSTANCE_ANNOTATION: Final = f"{prepare.CDI_VENDOR}/mig-instance"
_MAX_MIG_DEVICES: Final = 8


@dataclass(frozen=True, slots=True)
class Created:
    """One MIG instance made for a claim."""

    card_uuid: str
    gpu_instance_id: int
    uuid: str
    profile: str
    start: int

    def annotation(self) -> str:
        return json.dumps(
            {
                "card": self.card_uuid,
                "gpuInstance": self.gpu_instance_id,
                "uuid": self.uuid,
                "profile": self.profile,
                "start": self.start,
            },
            sort_keys=True,
        )


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class MigMaker:
    """Creates and destroys MIG instances through a pynvml-shaped module."""

    def __init__(self, nvml: Callable[[], Any]) -> None:
        self._nvml = nvml
        self._lock = threading.Lock()

    def create(self, card_uuid: str, profile: str, start: int) -> Created:
        """The instance of ``profile`` at ``start`` on the card; raises PrepareError."""
        with self._lock:
            nvml = self._nvml()
            try:
                return self._create(nvml, card_uuid, profile, start)
            except nvml.NVMLError as exc:
                raise prepare.PrepareError(
                    f"NVML refused MIG instance {profile} at slice {start} of {card_uuid}: {exc}"
                ) from exc

    def destroy(self, created: Created) -> bool:
        """Destroy the instance (True), or say it was gone already (False)."""
        with self._lock:
            nvml = self._nvml()
            handle = nvml.nvmlDeviceGetHandleByUUID(created.card_uuid)
            try:
                gpu_instance = nvml.nvmlDeviceGetGpuInstanceById(handle, created.gpu_instance_id)
            except nvml.NVMLError:
                return False
            for index in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))):
                try:
                    device = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, index)
                except nvml.NVMLError:
                    continue
                if int(nvml.nvmlDeviceGetGpuInstanceId(device)) == created.gpu_instance_id:
                    compute = nvml.nvmlGpuInstanceGetComputeInstanceById(
                        gpu_instance, int(nvml.nvmlDeviceGetComputeInstanceId(device))
                    )
                    nvml.nvmlComputeInstanceDestroy(compute)
            nvml.nvmlGpuInstanceDestroy(gpu_instance)
            log.info("mig_instance_destroyed", card=created.card_uuid, uuid=created.uuid)
            return True

    def _create(self, nvml: Any, card_uuid: str, profile: str, start: int) -> Created:
        handle = nvml.nvmlDeviceGetHandleByUUID(card_uuid)
        info = self._profile_info(nvml, handle, profile)
        placement_type = getattr(nvml, "c_nvmlGpuInstancePlacement_t", None)
        if placement_type is not None and hasattr(nvml, "nvmlDeviceCreateGpuInstanceWithPlacement"):
            placement = placement_type()
            placement.start = start
            placement.size = info.sliceCount
            gpu_instance = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(handle, info.id, placement)
        else:
            gpu_instance = nvml.nvmlDeviceCreateGpuInstance(handle, info.id)
        compute_profile = getattr(
            nvml, f"NVML_COMPUTE_INSTANCE_PROFILE_{info.sliceCount}_SLICE", None
        )
        if compute_profile is None:
            raise prepare.PrepareError(f"no compute instance profile of {info.sliceCount} slices")
        compute = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
            gpu_instance,
            compute_profile,
            getattr(nvml, "NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED", 0),
        )
        nvml.nvmlGpuInstanceCreateComputeInstance(gpu_instance, compute.id)
        gi = getattr(gpu_instance, "gpu_instance_id", None)
        if gi is None:  # pynvml's handle: its id is in the instance's info
            gi = nvml.nvmlGpuInstanceGetInfo(gpu_instance).id
        gi = int(gi)
        count = min(int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)), _MAX_MIG_DEVICES)
        for index in range(count):
            try:
                device = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, index)
            except nvml.NVMLError:
                continue
            if int(nvml.nvmlDeviceGetGpuInstanceId(device)) == gi:
                uuid = _text(nvml.nvmlDeviceGetUUID(device))
                log.info("mig_instance_created", card=card_uuid, profile=profile, uuid=uuid)
                return Created(card_uuid, gi, uuid, profile, start)
        raise prepare.PrepareError(f"the {profile} instance made on {card_uuid} is not listed")

    def _profile_info(self, nvml: Any, handle: Any, profile: str) -> Any:
        offered = []
        for number in range(int(getattr(nvml, "NVML_GPU_INSTANCE_PROFILE_COUNT", 0x12))):
            try:
                info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, number)
            except nvml.NVMLError:
                continue
            name = mig_profile_from_name(" " + _text(getattr(info, "name", ""))) or ""
            offered.append(name)
            if _same_profile(name, profile):
                return info
        raise prepare.PrepareError(
            f"the card offers no MIG profile {profile} (it offers {offered})"
        )


def _same_profile(nvml_name: str, published: str) -> bool:
    """NVML's name and the published one name the same profile: the same compute slices
    and memory within a GiB (NVML subtracts what the driver keeps)."""
    a, b = dra_mig.parse_profile(nvml_name), dra_mig.parse_profile(published)
    return a is not None and b is not None and a[0] == b[0] and abs(a[1] - b[1]) <= 1


def cdi_device(claim_uid: str, created: Created) -> dict[str, Any]:
    """The CDI device of one instance: the runtime hands exactly it to the container."""
    return {
        "name": f"{claim_uid}-{created.card_uuid.lower()}-gi{created.gpu_instance_id}",
        "annotations": {INSTANCE_ANNOTATION: created.annotation()},
        "containerEdits": {"env": [f"NVIDIA_VISIBLE_DEVICES={created.uuid}"]},
    }


def created_of(spec: Mapping[str, Any]) -> list[Created]:
    """The instances a claim's CDI spec records (what Unprepare destroys)."""
    out = []
    for device in spec.get("devices") or ():
        raw = ((device or {}).get("annotations") or {}).get(INSTANCE_ANNOTATION)
        if not raw:
            continue
        try:
            fields = json.loads(raw)
            out.append(
                Created(
                    str(fields["card"]),
                    int(fields["gpuInstance"]),
                    str(fields["uuid"]),
                    str(fields["profile"]),
                    int(fields["start"]),
                )
            )
        except (ValueError, KeyError, TypeError):
            log.warning("mig_instance_annotation_unreadable", annotation=raw)
    return out


def recorded_instances(cdi_dir: Path) -> frozenset[str]:
    """The UUIDs of the MIG instances the prepared claims' CDI specs record: the driver's
    own (their claims' allocations hold their counters)."""
    specs = cdi.read_specs(cdi_dir, prepare.SPEC_FILE_PREFIX) if cdi_dir.is_dir() else {}
    return frozenset(c.uuid for spec in specs.values() for c in created_of(spec))


@dataclass(frozen=True, slots=True)
class Placement:
    """A published MIG device: its card, profile and first memory slice."""

    card_uuid: str
    profile: str
    start: int


def placements(cards: Sequence[dra_mig.MigCardShape]) -> dict[str, Placement]:
    """Device name -> its placement, for every MIG device the node publishes."""
    out = {}
    for card in cards:
        for profile in card.profiles():
            for start in profile.starts:
                out[dra_mig.instance_name(card.uuid, profile.name, start)] = Placement(
                    card.uuid, profile.name, start
                )
    return out


def is_mig_claim(claim: Mapping[str, Any], node: str, published: Mapping[str, Placement]) -> bool:
    """Whether the claim's devices on this node are MIG devices; raises PrepareError for
    a claim mixing MIG devices and shares (each is prepared its own way: ask for them in
    two claims)."""
    try:
        allocation = dra.read_allocation(claim, dra.DRIVER, node)
    except dra.AllocationUnreadable:
        return False  # prepare.prepare says why
    mig = [s.device in published for s in allocation.shares]
    if any(mig) and not all(mig):
        raise prepare.PrepareError(
            f"claim {allocation.namespace}/{allocation.name} holds MIG instances and card "
            "shares together; ask for them in two claims"
        )
    return any(mig)


def prepare_mig(
    claim: Mapping[str, Any],
    node: str,
    published: Mapping[str, Placement],
    maker: MigMaker,
) -> tuple[dict[str, Any], tuple[prepare.PreparedDevice, ...]]:
    """Create the claim's instances; its CDI spec and kubelet's answer. On a failure the
    instances made so far are destroyed again, and PrepareError raised."""
    allocation = dra.read_allocation(claim, dra.DRIVER, node)
    made: list[Created] = []
    devices = []
    answer = []
    try:
        for share in allocation.shares:
            placement = published[share.device]
            created = maker.create(placement.card_uuid, placement.profile, placement.start)
            made.append(created)
            device = cdi_device(allocation.uid, created)
            devices.append(device)
            answer.append(prepare.prepared_device(share, device["name"]))
    except prepare.PrepareError:
        for created in made:
            maker.destroy(created)
        raise
    spec = {"cdiVersion": prepare.CDI_VERSION, "kind": prepare.CDI_KIND, "devices": devices}
    return spec, tuple(answer)
