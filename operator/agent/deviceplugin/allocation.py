"""Allocate, as a pure function: one pod and kubelet's device IDs in, the container's
settings and the pod's annotation patch out (issue 13; HAMi's device plugin, §1.3 and §6.3
of the node-side notes).

kubelet calls Allocate once per container with the fake device IDs it picked
(``<GPU UUID>-<i>``). The pod's ``hami.io/vgpu-devices-to-allocate`` holds one entry per
container (init containers first); the next non-empty entry belongs to this call. The
answer is what HAMi-core needs: the visible GPUs, the memory limit per GPU and the compute
limit, the shared-cache file, and the mounts of ``libvgpu.so`` and its preload. Consuming
the entry (and, when none is left, ``bind-phase: success``) is one patch, which the gRPC
layer writes with the pod's resourceVersion as a precondition.

Nothing here guesses: every check that fails raises ``AllocationError`` with a message
that says what is wrong and what to do; the caller then marks the pod failed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Protocol

from vgpu_operator import names
from vgpu_operator.devices import codec, model, nvidia
from vgpu_operator.devices.vendor import is_true
from vgpu_operator.errors import CodecError
from vgpu_operator.wire import Container, Pod, meta_of

#: Inside the container, where HAMi-core's files are mounted (HAMi's default hook path).
CONTAINER_HOOK_DIR: Final = "/usr/local/vgpu"
LOCK_DIR: Final = "/tmp/vgpulock"
PRELOAD_FILE: Final = "/etc/ld.so.preload"
DISABLE_CONTROL_ENV: Final = names.ENV_DISABLE_CONTROL


class AllocationError(Exception):
    """Allocate cannot honour the call; the message is for the pod's Event and kubelet."""


class MigDevices(Protocol):
    """Where MIG instances come from (``agent.mig`` over NVML or the simulation)."""

    def device(self, card_uuid: str, geometry: int, slot: int) -> str:
        """The MIG device UUID of ``card_uuid[geometry-slot]``, created if need be;
        raises AllocationError saying why not."""
        ...


@dataclass(frozen=True, slots=True)
class HostPaths:
    """Where HAMi-core lives on the host (the agent installs it there)."""

    #: The host directory holding libvgpu.so, ld.so.preload and per-container caches.
    hook_dir: str = "/usr/local/vgpu"
    #: The library file to mount as libvgpu.so (a versioned file when installed so).
    library: str = "libvgpu.so"
    #: HAMi-core's lock directory on the host (the same path inside containers).
    lock_dir: str = LOCK_DIR


@dataclass(frozen=True, slots=True)
class NodeSettings:
    """What the node's device config says about sharing (seed 000 §1)."""

    device_memory_scaling: float = 1.0
    #: HAMi's gpuCorePolicy: ``disable`` turns HAMi-core's compute limit off.
    core_policy: str = "default"
    host: HostPaths = field(default_factory=HostPaths)


@dataclass(frozen=True, slots=True)
class Mount:
    container_path: str
    host_path: str
    read_only: bool


@dataclass(frozen=True, slots=True)
class ContainerGrant:
    """What one container receives, and the patch that consumes its entry."""

    container: str
    devices: tuple[model.ContainerDevice, ...]
    envs: Mapping[str, str]
    mounts: tuple[Mount, ...]
    #: The annotations to merge-patch onto the pod.
    patch: Mapping[str, str]
    #: The host directory to (re)create for the container's shared cache ("" for none).
    cache_dir: str


def card_of(uuid: str) -> str:
    """An allocation entry's card: ``GPU-a[1-3]`` (a MIG instance of it) -> ``GPU-a``."""
    try:
        return codec.split_mig_uuid(uuid, nvidia.TO_ALLOCATE_ANNOTATION)[0]
    except CodecError as exc:
        raise AllocationError(str(exc)) from None


def physical_uuid(device_id: str) -> str:
    """``GPU-abc-3`` -> ``GPU-abc``: the card a fake device ID belongs to."""
    base, sep, index = device_id.rpartition("-")
    if not sep or not index.isdigit():
        raise AllocationError(f"device ID {device_id!r} is not <GPU UUID>-<n>")
    return base


def device_ids(uuid: str, split_count: int) -> list[str]:
    """The fake device IDs advertised for one card: one per share."""
    return [f"{uuid}-{i}" for i in range(split_count)]


def _containers_in_order(pod: Pod) -> list[Container]:
    spec = pod.get("spec") or {}
    return [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]


def _init_cards(pod: Pod, annotations: Mapping[str, str], position: int) -> set[str]:
    """The cards of the init containers before ``position`` that kubelet may hand on.

    kubelet gives the devices of a pod's init containers to the containers after them
    before it takes new ones (its device manager's "devices to reuse"; a restartable init
    container keeps its own), whatever the plugin prefers. Those IDs then sit on an init
    container's card, not on the cards the scheduler gave this container: the entry is
    still what the container gets. The init containers' cards are read from the full
    allocation, since their entries to allocate are consumed by now.
    """
    raw = annotations.get(nvidia.ALLOCATED_ANNOTATION)
    if not raw:
        return set()
    try:
        allocated = codec.decode_pod_single_device(raw, nvidia.ALLOCATED_ANNOTATION)
    except CodecError:
        return set()
    inits = (pod.get("spec") or {}).get("initContainers") or []
    return {
        card_of(device.uuid)
        for init, entry in zip(inits[:position], allocated, strict=False)
        if init.get("restartPolicy") != "Always"
        for device in entry
    }


def _asks_for(container: Container, resource: str) -> bool:
    resources = container.get("resources") or {}
    return any(
        resource in (section or {})
        for section in (resources.get("limits"), resources.get("requests"))
    )


def _disables_control(container: Container) -> bool:
    for env in container.get("env") or []:
        if env.get("name") == DISABLE_CONTROL_ENV:
            return is_true(str(env.get("value", "")))
    return False


def allocate(
    pod: Pod,
    requested_ids: Sequence[str],
    resource: str,
    settings: NodeSettings,
    mig: MigDevices | None = None,
) -> ContainerGrant:
    """The next container's grant for kubelet's ``requested_ids``; raises
    ``AllocationError`` when the pod, its annotation and the IDs do not agree. MIG
    entries (``GPU-a[g-s]``) are asked of ``mig``, which may create the instance."""
    meta = meta_of(pod)
    annotations: Mapping[str, str] = meta.get("annotations") or {}
    where = f"pod {meta.get('namespace')}/{meta.get('name')}"
    raw = annotations.get(nvidia.TO_ALLOCATE_ANNOTATION)
    if raw is None:
        raise AllocationError(f"{where} has no {nvidia.TO_ALLOCATE_ANNOTATION} annotation")
    try:
        entries = list(codec.decode_pod_single_device(raw, nvidia.TO_ALLOCATE_ANNOTATION))
    except CodecError as exc:
        raise AllocationError(f"{where}: unreadable allocation: {exc}") from None
    position = next((i for i, entry in enumerate(entries) if entry), None)
    if position is None:
        raise AllocationError(f"{where}: every container's devices were already handed out")
    devices = entries[position]
    containers = _containers_in_order(pod)
    if position >= len(containers):
        raise AllocationError(
            f"{where}: the allocation names container #{position}, the pod has "
            f"{len(containers)}; was a container injected after scheduling?"
        )
    container = containers[position]
    name = str(container.get("name", ""))
    if not _asks_for(container, resource):
        raise AllocationError(
            f"{where}: container {name!r} does not ask for {resource}, yet the allocation's "
            "next entry is for it; was a container injected after scheduling?"
        )
    if len(requested_ids) != len(devices):
        raise AllocationError(
            f"{where}: kubelet asks for {len(requested_ids)} devices for container {name!r}, "
            f"the allocation holds {len(devices)}"
        )
    wanted = Counter(card_of(d.uuid) for d in devices)
    given = Counter(physical_uuid(i) for i in requested_ids)
    if given != wanted and not set(given - wanted) <= _init_cards(pod, annotations, position):
        raise AllocationError(
            f"{where}: kubelet chose devices on {sorted(given)}, the scheduler allocated "
            f"{sorted(wanted)} to container {name!r}"
        )
    visible = tuple(_visible(d.uuid, mig, where, name) for d in devices)
    entries[position] = ()
    patch = {
        nvidia.TO_ALLOCATE_ANNOTATION: codec.encode_pod_single_device(
            tuple(entries), nvidia.TO_ALLOCATE_ANNOTATION
        )
    }
    if not any(entries):
        patch[names.BIND_PHASE] = codec.BindPhase.SUCCESS.value
    uid = str(meta.get("uid", ""))
    return _grant(name, tuple(devices), visible, container, uid, patch, settings)


def _visible(uuid: str, mig: MigDevices | None, where: str, container: str) -> str:
    """What NVIDIA_VISIBLE_DEVICES names for one entry: the card, or its MIG device."""
    try:
        card, instance = codec.split_mig_uuid(uuid, nvidia.TO_ALLOCATE_ANNOTATION)
    except CodecError as exc:
        raise AllocationError(f"{where}: {exc}") from None
    if instance is None:
        return card
    if mig is None:
        raise AllocationError(
            f"{where}: container {container!r} is allocated MIG instance {uuid}, and this "
            "agent manages no MIG devices"
        )
    try:
        return mig.device(card, *instance)
    except AllocationError as exc:
        raise AllocationError(f"{where}: container {container!r}: {exc}") from None


def _grant(
    name: str,
    devices: tuple[model.ContainerDevice, ...],
    visible: tuple[str, ...],
    container: Container,
    pod_uid: str,
    patch: Mapping[str, str],
    settings: NodeSettings,
) -> ContainerGrant:
    envs: dict[str, str] = {nvidia.VISIBLE_DEVICES_ENV: ",".join(visible)}
    cache_name = f"{pod_uid}_{name}"
    host = settings.host
    cache_dir = f"{host.hook_dir}/containers/{cache_name}"
    if all(v != d.uuid for v, d in zip(visible, devices, strict=True)):
        # Only MIG instances: the hardware partitions memory and compute, and HAMi-core
        # is not loaded (HAMi's plugin does the same in MIG mode).
        return ContainerGrant(name, devices, envs, (), dict(patch), "")
    for index, device in enumerate(devices):
        envs[f"CUDA_DEVICE_MEMORY_LIMIT_{index}"] = f"{device.memory_mib}m"
    envs["CUDA_DEVICE_SM_LIMIT"] = str(devices[0].cores)
    envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = f"{CONTAINER_HOOK_DIR}/{cache_name}.cache"
    if settings.device_memory_scaling > 1:
        envs["CUDA_OVERSUBSCRIBE"] = "true"
    if settings.core_policy == "disable":
        envs["GPU_CORE_UTILIZATION_POLICY"] = "disable"
    # The directory first: the library is mounted into it.
    mounts = [
        Mount(CONTAINER_HOOK_DIR, cache_dir, False),
        Mount(f"{CONTAINER_HOOK_DIR}/libvgpu.so", f"{host.hook_dir}/{host.library}", True),
        Mount(LOCK_DIR, host.lock_dir, False),
    ]
    if not _disables_control(container):
        mounts.append(Mount(PRELOAD_FILE, f"{host.hook_dir}/ld.so.preload", True))
    return ContainerGrant(name, devices, envs, tuple(mounts), dict(patch), cache_dir)


def failed_patch() -> Mapping[str, str]:
    """What the caller patches onto a pod whose Allocate failed."""
    return {names.BIND_PHASE: codec.BindPhase.FAILED.value}
