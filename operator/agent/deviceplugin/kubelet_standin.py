"""A kubelet stand-in for nodes that have none (KWOK): it drives a device plugin through
the calls kubelet's device manager makes, for every pod bound to its node.

It serves kubelet's Registration service on ``kubelet.sock`` in a device-plugin directory,
accepts the plugin's Register, dials it back, follows ListAndWatch for the devices and
their health, and admits each new pod bound to the node as kubelet does: containers in
order (init containers first), for each one asking for the resource GetPreferredAllocation
over the free healthy IDs (when the plugin offers it), then Allocate with the chosen IDs.
What each container would receive (its environment and mounts, or the plugin's error) is
kept in ``settings`` for the demo and the tests. Devices are freed when their pod ends.

It is deliberately not kubelet: no checkpoint, no topology manager, no runtime. The
conformance harness runs kubelet's own device manager against the plugin; this keeps
allocations flowing (and the operator's allocation gate moving) on simulated nodes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import grpc
import structlog

from vgpu_operator import names
from vgpu_operator.agent.deviceplugin import api_pb2, api_pb2_grpc
from vgpu_operator.agent.deviceplugin.unix_server import serve_unix
from vgpu_operator.devices import nvidia
from vgpu_operator.wire import Container, Pod, meta_of

log = structlog.get_logger("vgpu_operator.kubelet_standin")

KUBELET_SOCKET: Final = "kubelet.sock"
HEALTHY: Final = "Healthy"

PodSource = Callable[[], Awaitable[Sequence[Pod]]]


@dataclass(frozen=True, slots=True)
class ContainerSettings:
    """What one container received from the plugin (or why it received nothing)."""

    pod: str  # namespace/name
    container: str
    device_ids: tuple[str, ...]
    envs: Mapping[str, str] = field(default_factory=dict)
    mounts: tuple[tuple[str, str, bool], ...] = ()  # (container path, host path, read-only)
    error: str | None = None
    #: The pod's uid (a later pod of the same name is another pod).
    uid: str = ""


def requested(container: Container, resource: str) -> int:
    """The count a container asks for (limits, else requests), as kubelet reads it; an
    unreadable value counts as none (the API server refuses those anyway)."""
    resources = container.get("resources") or {}
    for section in (resources.get("limits"), resources.get("requests")):
        value = (section or {}).get(resource)
        if value is not None:
            try:
                return max(int(str(value)), 0)
            except ValueError:
                return 0
    return 0


def _key(pod: Pod) -> str:
    meta = meta_of(pod)
    return f"{meta.get('namespace')}/{meta.get('name')}"


def _finished(pod: Pod) -> bool:
    phase = (pod.get("status") or {}).get("phase")
    return phase in names.TERMINAL_PHASES or bool(meta_of(pod).get("deletionTimestamp"))


class KubeletStandIn(api_pb2_grpc.RegistrationServicer):
    """Plays kubelet for one node: ``run`` until ``stop`` is set."""

    def __init__(
        self,
        node: str,
        directory: Path,
        pods: PodSource,
        *,
        resource: str = nvidia.COUNT_RESOURCE,
        poll_s: float = 0.1,
    ) -> None:
        self.node = node
        self.directory = directory
        self.resource = resource
        self.poll_s = poll_s
        self._pods = pods
        self._endpoint: str | None = None
        self._registered = asyncio.Event()
        self._options = api_pb2.DevicePluginOptions()
        #: Device ID -> health, as ListAndWatch last said.
        self.devices: dict[str, str] = {}
        self._devices_seen = asyncio.Event()
        #: Device ID -> uid of the pod it is assigned to.
        self._in_use: dict[str, str] = {}
        self._admitted: set[str] = set()
        self.settings: list[ContainerSettings] = []
        self.registrations = 0

    def in_use(self) -> dict[str, str]:
        """Device ID -> uid of the live pod holding it."""
        return dict(self._in_use)

    # --- kubelet's Registration service ---------------------------------------------------
    async def Register(
        self, request: api_pb2.RegisterRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.Empty:
        if request.resource_name != self.resource:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"this stand-in serves {self.resource}, not {request.resource_name}",
            )
        self._endpoint = request.endpoint
        self._options = request.options
        self.registrations += 1
        self._registered.set()
        return api_pb2.Empty()

    # --- the loop -------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        socket = self.directory / KUBELET_SOCKET
        with contextlib.suppress(FileNotFoundError):
            socket.unlink()
        add = api_pb2_grpc.add_RegistrationServicer_to_server
        server = await serve_unix(lambda server: add(self, server), socket)  # type: ignore[no-untyped-call]
        try:
            if not await _until(self._registered, stop):
                return
            endpoint = self.directory / str(self._endpoint)
            async with grpc.aio.insecure_channel(f"unix://{endpoint}") as channel:
                stub = api_pb2_grpc.DevicePluginStub(channel)  # type: ignore[no-untyped-call]
                watch = asyncio.create_task(self._watch(stub), name=f"standin-watch {self.node}")
                try:
                    if await _until(self._devices_seen, stop):
                        await self._admit_loop(stub, stop)
                finally:
                    watch.cancel()
                    with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                        await watch
        finally:
            await server.stop(None)
            with contextlib.suppress(FileNotFoundError):
                socket.unlink()

    async def _watch(self, stub: Any) -> None:
        async for response in stub.ListAndWatch(api_pb2.Empty()):
            self.devices = {d.ID: d.health for d in response.devices}
            self._devices_seen.set()

    async def _admit_loop(self, stub: Any, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                pods = await self._pods()
            except Exception as exc:  # the API server may be away for a moment
                log.warning("standin_pods_unreadable", node=self.node, error=str(exc))
                pods = None
            if pods is not None:
                self._release_ended(pods)
                for pod in sorted(pods, key=lambda p: str(meta_of(p).get("creationTimestamp", ""))):
                    await self._admit(stub, pod)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.poll_s)

    def _release_ended(self, pods: Sequence[Pod]) -> None:
        live = {str(meta_of(p).get("uid")) for p in pods if not _finished(p)}
        self._in_use = {d: uid for d, uid in self._in_use.items() if uid in live}

    async def _admit(self, stub: Any, pod: Pod) -> None:
        uid = str(meta_of(pod).get("uid"))
        if uid in self._admitted or _finished(pod):
            return
        if (pod.get("spec") or {}).get("nodeName") != self.node:
            return
        self._admitted.add(uid)
        spec = pod.get("spec") or {}
        inits = [(c, True) for c in spec.get("initContainers") or []]
        containers = [*inits, *((c, False) for c in spec.get("containers") or [])]
        # kubelet hands a finished init container's devices on to the next containers
        # (its devicesToReuse) before it takes free ones.
        reusable: list[str] = []
        for container, is_init in containers:
            count = requested(container, self.resource)
            if count == 0:
                continue
            name = str(container.get("name"))
            result = await self._allocate(stub, pod, uid, name, count, reusable)
            self.settings.append(result)
            if result.error is not None:
                log.info("standin_admission_failed", pod=result.pod, error=result.error)
                return  # kubelet fails the pod's admission at the first container
            sidecar = container.get("restartPolicy") == "Always"
            if is_init and not sidecar:
                reusable = sorted(set(reusable) | set(result.device_ids))
            else:
                reusable = [d for d in reusable if d not in result.device_ids]

    async def _allocate(
        self,
        stub: Any,
        pod: Pod,
        uid: str,
        container: str,
        count: int,
        reusable: Sequence[str],
    ) -> ContainerSettings:
        key = _key(pod)
        chosen = list(reusable[:count])
        free = sorted(d for d, h in self.devices.items() if h == HEALTHY and d not in self._in_use)
        needed = count - len(chosen)
        if len(free) < needed:
            return ContainerSettings(
                key,
                container,
                (),
                error=f"{count} {self.resource} wanted, {len(free)} free",
                uid=uid,
            )
        if needed and self._options.get_preferred_allocation_available:
            preferred = await stub.GetPreferredAllocation(
                api_pb2.PreferredAllocationRequest(
                    container_requests=[
                        api_pb2.ContainerPreferredAllocationRequest(
                            available_deviceIDs=[*chosen, *free],
                            must_include_deviceIDs=chosen,
                            allocation_size=count,
                        )
                    ]
                )
            )
            # kubelet takes what the plugin prefers among the free devices, then fills up.
            for device in preferred.container_responses[0].deviceIDs:
                if needed and device in free and device not in chosen:
                    chosen.append(device)
                    needed -= 1
        for device in free:
            if not needed:
                break
            if device not in chosen:
                chosen.append(device)
                needed -= 1
        try:
            response = await stub.Allocate(
                api_pb2.AllocateRequest(
                    container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=chosen)]
                )
            )
        except grpc.aio.AioRpcError as exc:
            return ContainerSettings(key, container, tuple(chosen), error=exc.details(), uid=uid)
        for device in chosen:
            self._in_use[device] = uid
        answer = response.container_responses[0]
        return ContainerSettings(
            key,
            container,
            tuple(chosen),
            dict(answer.envs),
            tuple((m.container_path, m.host_path, m.read_only) for m in answer.mounts),
            uid=uid,
        )


async def _until(event: asyncio.Event, stop: asyncio.Event) -> bool:
    """Wait for ``event``; False when ``stop`` came first."""
    waiters = {asyncio.ensure_future(event.wait()), asyncio.ensure_future(stop.wait())}
    _done, pending = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    return event.is_set()
