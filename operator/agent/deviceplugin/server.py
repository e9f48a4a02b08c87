"""The device plugin kubelet talks to: a ``grpc.aio`` servicer of the v1beta1 API, and the
registration call (issue 13). Thin: the decisions are in ``allocation`` and ``lookup``.

The plugin advertises ``splitCount`` fake devices per card (``<UUID>-<i>``), steers
kubelet's choice with GetPreferredAllocation to the cards the pod's annotation names, and
on Allocate hands the container its share. A failed Allocate marks the pod
``bind-phase: failed`` and returns an error that says why.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final

import grpc
import structlog

from vgpu_operator import resources
from vgpu_operator.agent import hamicore
from vgpu_operator.agent.deviceplugin import allocation, api_pb2, api_pb2_grpc, lookup
from vgpu_operator.agent.deviceplugin.allocation import AllocationError, NodeSettings
from vgpu_operator.agent.deviceplugin.unix_server import serve_unix
from vgpu_operator.wire import Pod, meta_of

log = structlog.get_logger("vgpu_operator.deviceplugin")

API_VERSION: Final = "v1beta1"
HEALTHY: Final = "Healthy"
UNHEALTHY: Final = "Unhealthy"


@dataclass(frozen=True, slots=True)
class Card:
    """One physical card as the plugin advertises it."""

    uuid: str
    split_count: int
    healthy: bool
    numa: int | None = None


#: The pods bound to this node, as the API server has them now.
PodSource = Callable[[], Awaitable[Sequence[Pod]]]
#: Merge-patch annotations onto a pod, guarded by its resourceVersion.
Patcher = Callable[[Pod, Mapping[str, str]], Awaitable[None]]

#: Reads and guarded writes per container before Allocate gives up on a pod that keeps
#: changing under it (KWOK or kubelet writing its status, for one).
_ATTEMPTS: Final = 3


class StaleRead(Exception):
    """The pod changed between our read and our guarded patch (HTTP 409): read again."""


#: Tell a pod's owner why its Allocate failed: (pod, reason, message), as a Warning Event.
Reporter = Callable[[Pod, str, str], Awaitable[None]]

#: The Event reason on a pod whose Allocate failed (kubelet then fails the pod with
#: UnexpectedAdmissionError, which alone does not say why).
ALLOCATE_FAILED: Final = "GpuAllocateFailed"


async def _no_report(pod: Pod, reason: str, message: str) -> None:
    return None


def cards_of(status: resources.DeviceInventoryStatus) -> list[Card]:
    """The cards a status reports, as the plugin advertises them (the same split count, so
    kubelet's capacity equals the scheduler's slots). MIG cards too: a pod placed on one
    asks kubelet for the count resource like any other, and its IDs are the card's."""
    return [
        Card(
            d.uuid,
            d.split_count,
            d.health is resources.DeviceHealth.HEALTHY,
            d.numa_node,
        )
        for d in status.devices
    ]


def advertised(cards: Sequence[Card]) -> list[api_pb2.Device]:
    """Every fake device of every card; an unhealthy card's devices are all Unhealthy."""
    devices: list[api_pb2.Device] = []
    for card in cards:
        topology = (
            None
            if card.numa is None
            else api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=card.numa)])
        )
        for device_id in allocation.device_ids(card.uuid, card.split_count):
            devices.append(
                api_pb2.Device(
                    ID=device_id,
                    health=HEALTHY if card.healthy else UNHEALTHY,
                    topology=topology,
                )
            )
    return devices


def preferred(available: Sequence[str], must: Sequence[str], uuids: Sequence[str]) -> list[str]:
    """One available ID on each card the pod's entry names (``must`` first); empty when
    the cards cannot all be covered (kubelet then chooses, and Allocate checks)."""
    chosen = list(must)
    wanted = list(uuids)
    for device_id in must:
        uuid = allocation.physical_uuid(device_id)
        if uuid in wanted:
            wanted.remove(uuid)
    for uuid in wanted:
        pick = next(
            (i for i in available if i not in chosen and allocation.physical_uuid(i) == uuid),
            None,
        )
        if pick is None:
            return []
        chosen.append(pick)
    return chosen


class GpuDevicePlugin(api_pb2_grpc.DevicePluginServicer):
    """One count resource (``nvidia.com/gpu``) of one node."""

    def __init__(
        self,
        node: str,
        resource: str,
        cards: Sequence[Card],
        pods: PodSource,
        patch: Patcher,
        settings: NodeSettings | None = None,
        report: Reporter = _no_report,
        mig: allocation.MigDevices | None = None,
    ) -> None:
        self.node = node
        self._report = report
        self._mig = mig
        self.resource = resource
        self._cards = list(cards)
        self._pods = pods
        self._patch = patch
        self.settings = settings or NodeSettings()
        #: Whose placements are served (``lookup``): the device config's schedulers.
        self.schedulers: frozenset[str] = lookup.DEFAULT_SCHEDULERS
        self._changed = asyncio.Event()
        self._allocating = asyncio.Lock()

    def apply_config(
        self,
        memory_scaling: float,
        core_policy: str,
        schedulers: frozenset[str] = lookup.DEFAULT_SCHEDULERS,
    ) -> None:
        """The device config changed: later Allocates use its settings, and serve only
        pods the schedulers it trusts placed."""
        self.settings = replace(
            self.settings, device_memory_scaling=memory_scaling, core_policy=core_policy
        )
        self.schedulers = schedulers

    def set_cards(self, cards: Sequence[Card]) -> None:
        """New readings (health, split): ListAndWatch sends the full list again."""
        self._cards = list(cards)
        self._changed.set()

    async def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: grpc.aio.ServicerContext
    ) -> api_pb2.DevicePluginOptions:
        return api_pb2.DevicePluginOptions(get_preferred_allocation_available=True)

    async def ListAndWatch(
        self, request: api_pb2.Empty, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        while True:
            self._changed.clear()
            yield api_pb2.ListAndWatchResponse(devices=advertised(self._cards))
            await self._changed.wait()

    async def GetPreferredAllocation(
        self, request: api_pb2.PreferredAllocationRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.PreferredAllocationResponse:
        pods = await self._pods()
        responses = []
        for wanted in request.container_requests:
            ids: list[str] = []
            try:
                pod = lookup.pod_for(pods, self.node, wanted.allocation_size, self.schedulers)
                entry = lookup.next_entry(pod) or ()
                ids = preferred(
                    list(wanted.available_deviceIDs),
                    list(wanted.must_include_deviceIDs),
                    [allocation.card_of(d.uuid) for d in entry],
                )
            except AllocationError as exc:
                log.info("no_preference", node=self.node, reason=str(exc))
            responses.append(api_pb2.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return api_pb2.PreferredAllocationResponse(container_responses=responses)

    async def Allocate(
        self, request: api_pb2.AllocateRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.AllocateResponse:
        # kubelet may call concurrently; finding the pod and consuming its entry must not
        # interleave with another call's.
        async with self._allocating:
            responses = []
            for wanted in request.container_requests:
                ids = list(wanted.devices_ids)
                for attempt in range(1, _ATTEMPTS + 1):
                    pods = await self._pods()
                    try:
                        pod = lookup.pod_for(pods, self.node, len(ids), self.schedulers)
                    except lookup.AmbiguousAllocation as exc:
                        # None of them may start on devices meant for another.
                        for candidate in exc.pods:
                            await self._fail(candidate, str(exc))
                        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
                        raise
                    except AllocationError as exc:
                        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
                        raise  # abort raises; this keeps type checkers sure
                    try:
                        # In a worker thread: a MIG entry may create the instance via NVML.
                        grant = await asyncio.to_thread(
                            allocation.allocate, pod, ids, self.resource, self.settings, self._mig
                        )
                        await asyncio.to_thread(self._prepare_host, grant)
                    except AllocationError as exc:
                        await self._fail(pod, str(exc))
                        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
                        raise
                    try:
                        # Guarded by the pod's resourceVersion: an entry is consumed once.
                        await self._patch(pod, grant.patch)
                        break
                    except StaleRead:
                        if attempt < _ATTEMPTS:
                            continue  # the same work again on a fresh read (idempotent)
                        message = (
                            f"the pod kept changing while its allocation was being "
                            f"recorded ({_ATTEMPTS} tries); its admission fails, and a "
                            "controller's replacement is scheduled again"
                        )
                        await self._fail(pod, message)
                        await context.abort(grpc.StatusCode.UNAVAILABLE, message)
                        raise
                responses.append(_response(grant))
                log.info(
                    "allocated",
                    node=self.node,
                    container=grant.container,
                    devices=[d.uuid for d in grant.devices],
                )
            return api_pb2.AllocateResponse(container_responses=responses)

    async def _fail(self, pod: Pod, message: str) -> None:
        """``bind-phase: failed`` (the operator then releases the booking) and an Event on
        the pod saying why. Neither write may hide the other, nor the gRPC error."""
        meta = meta_of(pod)
        log.warning(
            "allocate_failed",
            node=self.node,
            pod=f"{meta.get('namespace')}/{meta.get('name')}",
            error=message,
        )
        try:
            await self._patch_fresh(pod, allocation.failed_patch())
        except Exception as exc:
            log.error("allocate_failed_unrecorded", node=self.node, error=str(exc))
        try:
            await self._report(pod, ALLOCATE_FAILED, message)
        except Exception as exc:
            log.error("allocate_event_failed", node=self.node, error=str(exc))

    async def _patch_fresh(self, pod: Pod, annotations: Mapping[str, str]) -> None:
        """Patch ``pod``, reading it again (by uid) when it changed since it was read."""
        uid = meta_of(pod).get("uid")
        current = pod
        for attempt in range(1, _ATTEMPTS + 1):
            try:
                await self._patch(current, annotations)
                return
            except StaleRead:
                if attempt == _ATTEMPTS:
                    raise
            fresh = [p for p in await self._pods() if meta_of(p).get("uid") == uid]
            if not fresh:
                return  # gone: nothing left to mark
            current = fresh[0]

    def _prepare_host(self, grant: allocation.ContainerGrant) -> None:
        """The host directories the container's mounts need, made before kubelet hands
        the mounts to the runtime."""
        if not grant.mounts:
            return  # MIG instances only: HAMi-core is not loaded
        try:
            hamicore.prepare_lock_dir(Path(self.settings.host.lock_dir))
            hamicore.prepare_container_dir(Path(grant.cache_dir))
        except OSError as exc:
            raise AllocationError(
                f"cannot prepare HAMi-core's directories on the host for container "
                f"{grant.container!r}: {exc}; is {self.settings.host.hook_dir} mounted "
                "into the agent, writable?"
            ) from exc

    async def PreStartContainer(
        self, request: api_pb2.PreStartContainerRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.PreStartContainerResponse:
        return api_pb2.PreStartContainerResponse()


def _response(grant: allocation.ContainerGrant) -> api_pb2.ContainerAllocateResponse:
    return api_pb2.ContainerAllocateResponse(
        envs=dict(grant.envs),
        mounts=[
            api_pb2.Mount(
                container_path=m.container_path, host_path=m.host_path, read_only=m.read_only
            )
            for m in grant.mounts
        ],
    )


async def serve(plugin: GpuDevicePlugin, socket_path: str) -> grpc.aio.Server:
    """Serve the plugin on a unix socket (serve first, then register)."""
    # The generated gRPC module is untyped (grpc_tools writes no stubs for it).
    add = api_pb2_grpc.add_DevicePluginServicer_to_server
    return await serve_unix(lambda server: add(plugin, server), socket_path)  # type: ignore[no-untyped-call]


async def register(
    kubelet_socket: str, endpoint: str, resource: str, timeout_s: float = 5.0
) -> None:
    """Tell kubelet where the plugin serves ``resource`` (``endpoint`` is the socket's file
    name in kubelet's device-plugin directory)."""
    async with grpc.aio.insecure_channel(f"unix://{kubelet_socket}") as channel:
        stub = api_pb2_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
        await stub.Register(
            api_pb2.RegisterRequest(
                version=API_VERSION,
                endpoint=endpoint,
                resource_name=resource,
                options=api_pb2.DevicePluginOptions(get_preferred_allocation_available=True),
            ),
            timeout=timeout_s,
        )
