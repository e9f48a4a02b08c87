"""What a bound pod was granted, read back from its NVIDIA allocation annotation: the
integration tests and the end-to-end bench check the operator's placements with it."""

from __future__ import annotations

from vgpu_operator import names
from vgpu_operator.devices import codec, nvidia
from vgpu_operator.wire import Pod, meta_of


def nvidia_devices(pod: Pod) -> list[tuple[str, int, int]]:
    """(device uuid, memory MiB, cores) for each device granted, container by container;
    empty when the pod carries no allocation."""
    annotations = meta_of(pod).get("annotations") or {}
    devices = codec.decode_pod_devices(
        annotations, {nvidia.COMMON_WORD: names.NVIDIA_DEVICES_ALLOCATED}
    )
    return [
        (device.uuid, device.memory_mib, device.cores)
        for per_vendor in devices.values()
        for container in per_vendor
        for device in container
    ]
