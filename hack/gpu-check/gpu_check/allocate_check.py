"""The device plugin's Allocate for a pod asking a share of the card, as kubelet makes it.

The agent's real gRPC servicer (``GpuDevicePlugin``, served and registered by its
``PluginRunner``) and the kubelet stand-in talk over unix sockets exactly as on a node; only
the API server is replaced, by the one pod held in memory (bound to this node, with the
allocation annotation the scheduler writes) and its annotation patches. HAMi-core's host
directory is a scratch one, with the library just built installed into it by the agent's
own installer, as at the agent's start.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, cast

from gpu_check.context import GPU_RESOURCE, Grant, Run
from gpu_check.outcome import CheckResult, failed, passed, skipped
from vgpu_operator import names, resources
from vgpu_operator.agent import hamicore, mig
from vgpu_operator.agent.deviceplugin import allocation, server
from vgpu_operator.agent.deviceplugin.kubelet_standin import ContainerSettings, KubeletStandIn
from vgpu_operator.agent.deviceplugin.runner import PluginRunner
from vgpu_operator.devices import codec, model, nvidia
from vgpu_operator.wire import Pod

NAME: Final = "device plugin: Allocate a share"
_TIMEOUT_S: Final = 30.0
_SHARE_MIB: Final = 4096


def share_pod(node: str, card_uuid: str, memory_mib: int, cores: int) -> dict[str, Any]:
    """A pod bound to ``node`` whose one container the scheduler gave ``memory_mib`` and
    ``cores`` % of the card, waiting for its device plugin."""
    entry = ((model.ContainerDevice(card_uuid, "NVIDIA", memory_mib, cores),),)
    allocated = codec.encode_pod_single_device(entry, nvidia.TO_ALLOCATE_ANNOTATION)
    return {
        "metadata": {
            "namespace": "gpu-check",
            "name": "share",
            "uid": str(uuid.uuid4()),
            "creationTimestamp": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "annotations": {
                nvidia.TO_ALLOCATE_ANNOTATION: allocated,
                nvidia.ALLOCATED_ANNOTATION: allocated,
                names.BIND_PHASE: codec.BindPhase.ALLOCATING.value,
                # The scheduler names the node it placed the pod on; the plugin checks it.
                names.ASSIGNED_NODE: node,
            },
        },
        "spec": {
            "nodeName": node,
            # The plugin serves only pods a trusted scheduler placed (this one's name).
            "schedulerName": names.SCHEDULER_NAME,
            "containers": [
                {
                    "name": "main",
                    "resources": {
                        "limits": {
                            GPU_RESOURCE: 1,
                            "nvidia.com/gpumem": str(memory_mib),
                            "nvidia.com/gpucores": str(cores),
                        }
                    },
                }
            ],
        },
        "status": {"phase": "Pending"},
    }


def choose_card(status: resources.DeviceInventoryStatus) -> resources.Device | None:
    """The first healthy card shared through HAMi-core (not MIG)."""
    return next(
        (
            d
            for d in status.devices
            if d.health is resources.DeviceHealth.HEALTHY
            and d.mode is resources.DeviceMode.HAMI_CORE
        ),
        None,
    )


class _PodStore:
    """The API server's part: the pods bound to the node, and guarded annotation patches."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods
        self.events: list[str] = []

    async def list(self) -> Sequence[Pod]:
        return cast(list[Pod], self.pods)

    async def patch(self, pod: Pod, annotations: Mapping[str, str]) -> None:
        for held in self.pods:
            if held["metadata"]["uid"] == pod["metadata"]["uid"]:
                held["metadata"]["annotations"].update(annotations)

    async def report(self, pod: Pod, reason: str, message: str) -> None:
        self.events.append(f"{reason}: {message}")


async def _allocate(
    run: Run, card: resources.Device, pod: dict[str, Any], hook_dir: Path, timeout_s: float
) -> tuple[ContainerSettings | None, _PodStore]:
    assert run.status is not None
    store = _PodStore([pod])
    backend = run.backend
    instances = (
        mig.MigInstances(backend.nvml_module, lambda card_type: ()) if backend is not None else None
    )
    settings = allocation.NodeSettings(
        host=allocation.HostPaths(
            hook_dir=str(hook_dir), lock_dir=str(hook_dir.parent / "vgpulock")
        )
    )
    plugin = server.GpuDevicePlugin(
        run.options.node_name,
        GPU_RESOURCE,
        server.cards_of(run.status),
        store.list,
        store.patch,
        settings,
        store.report,
        instances,
    )
    # Unix socket paths are limited to about 100 bytes: a short directory of its own.
    with tempfile.TemporaryDirectory(prefix="gpuchk-") as sockets:
        directory = Path(sockets)
        standin = KubeletStandIn(run.options.node_name, directory, store.list, poll_s=0.05)
        runner = PluginRunner(plugin, directory, poll_s=0.1, backoff_initial_s=0.1)
        stop = asyncio.Event()
        tasks = [asyncio.create_task(standin.run(stop)), asyncio.create_task(runner.run(stop))]
        try:
            deadline = asyncio.get_running_loop().time() + timeout_s
            while not standin.settings and asyncio.get_running_loop().time() < deadline:
                if any(t.done() for t in tasks):
                    break
                await asyncio.sleep(0.05)
        finally:
            stop.set()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)
        for task in tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise RuntimeError(f"{task.get_name()} failed: {task.exception()!r}")
    return (standin.settings[0] if standin.settings else None), store


def allocate_share(run: Run) -> CheckResult:
    if run.status is None:
        return skipped(NAME, "no inventory reading (its check failed)")
    card = choose_card(run.status)
    if card is None:
        return skipped(NAME, "no healthy card outside MIG mode to share")
    memory = run.options.share_memory_mib or min(_SHARE_MIB, card.memory_mib // 4)
    cores = run.options.share_cores
    hook_dir = run.work_dir / "host" / "usr-local-vgpu"
    hook_dir.mkdir(parents=True, exist_ok=True)
    details = [
        f"- card: #{card.index} {card.uuid} ({card.model}); "
        f"the pod asks {memory} MiB and {cores} % of it"
    ]
    if run.library is not None:
        # What the agent does at start with --hami-core-library.
        hamicore.install(run.library, hook_dir, allocation.CONTAINER_HOOK_DIR)
        details.append(f"- HAMi-core installed into {hook_dir} by the agent's installer")
    pod = share_pod(run.options.node_name, card.uuid, memory, cores)
    result, store = asyncio.run(_allocate(run, card, pod, hook_dir, run.budget.timeout(_TIMEOUT_S)))
    if result is None:
        return failed(
            NAME, f"kubelet's Allocate got no answer in {_TIMEOUT_S:.0f} s", details + store.events
        )
    details += _settings_lines(result)
    if result.error is not None:
        return failed(NAME, f"Allocate refused: {result.error}", details + store.events)
    grant = Grant(
        card_uuid=card.uuid,
        card_index=card.index,
        memory_limit_mib=memory,
        sm_limit=cores,
        envs=dict(result.envs),
        mounts=result.mounts,
        hook_dir=hook_dir,
    )
    problems = check_grant(grant, pod)
    data = {
        "envs": dict(result.envs),
        "mounts": [list(m) for m in result.mounts],
        "deviceIds": list(result.device_ids),
    }
    if problems:
        return failed(NAME, "; ".join(problems), details, **data)
    run.grant = grant
    return passed(
        NAME,
        f"{card.uuid}: CUDA_DEVICE_MEMORY_LIMIT_0={grant.envs['CUDA_DEVICE_MEMORY_LIMIT_0']}, "
        f"CUDA_DEVICE_SM_LIMIT={grant.envs['CUDA_DEVICE_SM_LIMIT']}, bind-phase success",
        details,
        **data,
    )


def _settings_lines(result: ContainerSettings) -> list[str]:
    lines = [
        f"- kubelet chose {', '.join(result.device_ids) or 'no devices'}",
        "",
        "| environment | value |",
        "|---|---|",
    ]
    lines += [f"| {k} | {v} |" for k, v in sorted(result.envs.items())]
    lines += ["", "| mount in the container | host path | read-only |", "|---|---|---|"]
    lines += [f"| {c} | {h} | {ro} |" for c, h, ro in result.mounts]
    return lines


def check_grant(grant: Grant, pod: Mapping[str, Any]) -> list[str]:
    """What HAMi-core needs, as HAMi's plugin hands it; each problem as a sentence."""
    problems: list[str] = []
    want = {
        "NVIDIA_VISIBLE_DEVICES": grant.card_uuid,
        "CUDA_DEVICE_MEMORY_LIMIT_0": f"{grant.memory_limit_mib}m",
        "CUDA_DEVICE_SM_LIMIT": str(grant.sm_limit),
    }
    for key, value in want.items():
        if grant.envs.get(key) != value:
            problems.append(f"{key} is {grant.envs.get(key)!r}, expected {value!r}")
    cache = grant.envs.get("CUDA_DEVICE_MEMORY_SHARED_CACHE", "")
    host_cache = grant.host_path(cache) if cache else None
    if host_cache is None:
        problems.append(f"CUDA_DEVICE_MEMORY_SHARED_CACHE {cache!r} is on no mount")
    elif not host_cache.parent.is_dir():
        problems.append(f"the shared cache's host directory {host_cache.parent} was not made")
    hook = allocation.CONTAINER_HOOK_DIR
    for inside, host in (
        (f"{hook}/libvgpu.so", grant.hook_dir / "libvgpu.so"),
        (allocation.PRELOAD_FILE, grant.hook_dir / hamicore.PRELOAD),
    ):
        if grant.host_path(inside) != host:
            problems.append(f"{inside} is mounted from {grant.host_path(inside)}, expected {host}")
    annotations = pod["metadata"]["annotations"]
    if annotations.get(names.BIND_PHASE) != codec.BindPhase.SUCCESS.value:
        problems.append(
            f"the pod's bind-phase is {annotations.get(names.BIND_PHASE)!r}, not success"
        )
    return problems
