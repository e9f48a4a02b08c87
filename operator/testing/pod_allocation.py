"""What a bound pod was granted, read back from its NVIDIA allocation annotation: the
integration tests and the end-to-end bench check the operator's placements with it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vgpu_operator.devices import codec, nvidia


def nvidia_devices(pod: Mapping[str, Any]) -> list[tuple[str, int, int]]:
    """(device uuid, memory MiB, cores) for each device granted, container by container;
    empty when the pod carries no allocation (tests hand in what they read, untyped)."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    devices = codec.decode_pod_devices(
        annotations, {nvidia.COMMON_WORD: nvidia.ALLOCATED_ANNOTATION}
    )
    return [
        (device.uuid, device.memory_mib, device.cores)
        for per_vendor in devices.values()
        for container in per_vendor
        for device in container
    ]
