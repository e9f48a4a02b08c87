"""The kubelet DRA plugin: kubelet's plugin registration and the DRA service (``grpc.aio``).

Registration is kubelet's plugin watcher's protocol (``pluginregistration/v1``): the
driver serves ``Registration`` on a socket in kubelet's plugin registry directory; kubelet
finds the socket, asks ``GetInfo`` (a DRA plugin, this driver's name, the socket of its
DRA service, the service versions it serves) and says whether it accepted it. The DRA
service (``k8s.io/kubelet/pkg/apis/dra/v1``) then gets ``NodePrepareResources`` and
``NodeUnprepareResources`` for claims of pods admitted to or leaving the node.

Thin: the decisions are ``prepare.prepare``'s. Each claim is read from the API server
(kubelet names it; what it was allocated is in its status) and checked to be the one
kubelet means (its uid). Prepare writes the claim's CDI spec and cache directory; both
calls are idempotent, so a kubelet or agent restart may repeat them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Final

import grpc
import structlog

from vgpu_operator.agent.deviceplugin.allocation import NodeSettings
from vgpu_operator.agent.deviceplugin.unix_server import serve_unix
from vgpu_operator.agent.dra import (
    cdi,
    dra_pb2,
    dra_pb2_grpc,
    drahealth_pb2_grpc,
    mig_prepare,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
    prepare,
)
from vgpu_operator.agent.dra.health_stream import HealthStream
from vgpu_operator.devices import dra
from vgpu_operator.wire import ResourceClaim, meta_of

log = structlog.get_logger("vgpu_operator.dra")

#: kubelet's plugin type for DRA drivers, and the service version served.
PLUGIN_TYPE: Final = "DRAPlugin"
DRA_SERVICE: Final = "v1.DRAPlugin"

#: Read a ResourceClaim: (namespace, name) -> the object, or None when there is none.
ClaimSource = Callable[[str, str], Awaitable[ResourceClaim | None]]
#: The cards this node publishes now (device name -> shape).
CardSource = Callable[[], Mapping[str, dra.CardShape]]
#: The MIG devices this node publishes now (device name -> placement).
MigSource = Callable[[], Mapping[str, mig_prepare.Placement]]


class DraPlugin(dra_pb2_grpc.DRAPluginServicer):
    """NodePrepareResources / NodeUnprepareResources for this node's claims."""

    def __init__(
        self,
        node: str,
        cards: CardSource,
        claims: ClaimSource,
        settings: NodeSettings,
        cdi_dir: Path,
        mig: tuple[MigSource, mig_prepare.MigMaker] | None = None,
    ) -> None:
        self.node = node
        #: Told once a claim's MIG instances are made and recorded (the publisher reads
        #: its own instances again), and once some are destroyed (the machine is read
        #: again: until then the inventory still lists them).
        self.on_mig_prepared: Callable[[], None] = lambda: None
        self.on_mig_unprepared: Callable[[], None] = lambda: None
        #: MIG instances (partitionable devices): what is published, and who makes them.
        self._mig = mig
        self._cards = cards
        self._claims = claims
        self.settings = settings
        self.cdi_dir = cdi_dir
        # One claim at a time: a Prepare and an Unprepare of the same claim never race
        # over its spec file, and the holdings are counted one claim after the other.
        self._lock = asyncio.Lock()
        #: Spec file name -> what that prepared claim holds; read from the CDI directory
        #: at the first call (the claims prepared before an agent restart).
        self._held: dict[str, tuple[prepare.CardHold, ...]] | None = None

    def _holdings(self) -> dict[str, tuple[prepare.CardHold, ...]]:
        if self._held is None:
            specs = cdi.read_specs(self.cdi_dir, prepare.SPEC_FILE_PREFIX)
            self._held = {name: prepare.holds_of(spec) for name, spec in specs.items()}
        return self._held

    async def NodePrepareResources(
        self, request: dra_pb2.NodePrepareResourcesRequest, context: grpc.aio.ServicerContext
    ) -> dra_pb2.NodePrepareResourcesResponse:
        answers: dict[str, dra_pb2.NodePrepareResourceResponse] = {}
        async with self._lock:
            for claim in request.claims:
                answers[claim.uid] = await self._prepare_one(claim)
        return dra_pb2.NodePrepareResourcesResponse(claims=answers)

    async def _prepare_one(self, ref: dra_pb2.Claim) -> dra_pb2.NodePrepareResourceResponse:
        where = f"{ref.namespace}/{ref.name}"
        try:
            claim = await self._claims(ref.namespace, ref.name)
            if claim is None:
                raise prepare.PrepareError(f"claim {where} does not exist")
            uid = str(meta_of(claim).get("uid", ""))
            if uid != ref.uid:
                raise prepare.PrepareError(
                    f"claim {where} has uid {uid}, kubelet asks for {ref.uid}: it was "
                    "deleted and made again"
                )
            if self._mig is not None:
                published = self._mig[0]()
                if mig_prepare.is_mig_claim(claim, self.node, published):
                    return await self._prepare_mig(claim, ref, published, self._mig[1])
            cards = self._cards()
            prepared = prepare.prepare(claim, self.node, cards, self.settings)
            file_name = prepare.spec_file_name(ref.uid)
            held = self._holdings()
            others = (h for name, holds in held.items() if name != file_name for h in holds)
            prepare.check_room(f"claim {where}", prepared.holds, others, cards)
            cdi.ensure_cache_dir(Path(prepared.cache_dir))
            cdi.write_spec(self.cdi_dir, file_name, prepared.spec)
            held[file_name] = prepared.holds
        except prepare.PrepareError as exc:
            log.warning("prepare_refused", node=self.node, claim=where, error=str(exc))
            return dra_pb2.NodePrepareResourceResponse(error=str(exc))
        except Exception as exc:
            log.error("prepare_failed", node=self.node, claim=where, error=repr(exc))
            return dra_pb2.NodePrepareResourceResponse(error=f"claim {where}: {exc}")
        log.info("claim_prepared", node=self.node, claim=where, devices=len(prepared.devices))
        return _prepared(prepared.devices)

    async def _prepare_mig(
        self,
        claim: ResourceClaim,
        ref: dra_pb2.Claim,
        published: Mapping[str, mig_prepare.Placement],
        maker: mig_prepare.MigMaker,
    ) -> dra_pb2.NodePrepareResourceResponse:
        """A claim of MIG instances: made through NVML (off the loop), handed over by CDI.
        Prepared again (kubelet repeats), the instances recorded are kept."""
        file_name = prepare.spec_file_name(ref.uid)
        existing = cdi.read_specs(self.cdi_dir, prepare.SPEC_FILE_PREFIX).get(file_name)
        if existing is not None and mig_prepare.created_of(existing):
            spec = existing
            devices = tuple(
                prepare.prepared_device(share, d["name"])
                for share, d in zip(
                    dra.read_allocation(claim, dra.DRIVER, self.node).shares,
                    existing.get("devices") or [],
                    strict=False,
                )
            )
        else:
            spec, devices = await asyncio.to_thread(
                mig_prepare.prepare_mig, claim, self.node, published, maker
            )
            cdi.write_spec(self.cdi_dir, file_name, spec)
            self.on_mig_prepared()
        log.info("claim_prepared", node=self.node, claim=f"{ref.namespace}/{ref.name}", mig=True)
        return _prepared(devices)

    async def NodeUnprepareResources(
        self, request: dra_pb2.NodeUnprepareResourcesRequest, context: grpc.aio.ServicerContext
    ) -> dra_pb2.NodeUnprepareResourcesResponse:
        answers: dict[str, dra_pb2.NodeUnprepareResourceResponse] = {}
        async with self._lock:
            for claim in request.claims:
                # Only the uid is needed: the claim may be gone from the API server already.
                try:
                    file_name = prepare.spec_file_name(claim.uid)
                    if self._mig is not None:
                        # Its MIG instances go before its spec: the spec is their record.
                        spec = cdi.read_specs(self.cdi_dir, prepare.SPEC_FILE_PREFIX).get(file_name)
                        made = mig_prepare.created_of(spec or {})
                        for created in made:
                            await asyncio.to_thread(self._mig[1].destroy, created)
                        if made:
                            self.on_mig_unprepared()
                    removed = cdi.remove_spec(self.cdi_dir, file_name)
                    self._holdings().pop(file_name, None)
                    cdi.remove_cache_dir(Path(prepare.claim_cache_dir(self.settings, claim.uid)))
                except Exception as exc:  # an OS error, or NVML's on a MIG instance
                    answers[claim.uid] = dra_pb2.NodeUnprepareResourceResponse(
                        error=f"claim {claim.namespace}/{claim.name}: {exc}"
                    )
                    continue
                log.info(
                    "claim_unprepared",
                    node=self.node,
                    claim=f"{claim.namespace}/{claim.name}",
                    was_prepared=removed,
                )
                answers[claim.uid] = dra_pb2.NodeUnprepareResourceResponse()
        return dra_pb2.NodeUnprepareResourcesResponse(claims=answers)


class Registration(pluginregistration_pb2_grpc.RegistrationServicer):
    """What kubelet's plugin watcher asks of the socket in its registry directory."""

    def __init__(
        self, driver: str, endpoint: str, services: tuple[str, ...] = (DRA_SERVICE,)
    ) -> None:
        self.driver = driver
        self.endpoint = endpoint
        #: The gRPC services served on ``endpoint`` (kubelet opens the health stream only
        #: where ``v1.DRAResourceHealth`` is listed).
        self.services = services
        #: kubelet's last answer: None before it gave one.
        self.registered: bool | None = None
        self.accepted = asyncio.Event()

    async def GetInfo(
        self, request: pluginregistration_pb2.InfoRequest, context: grpc.aio.ServicerContext
    ) -> pluginregistration_pb2.PluginInfo:
        return pluginregistration_pb2.PluginInfo(
            type=PLUGIN_TYPE,
            name=self.driver,
            endpoint=self.endpoint,
            supported_versions=list(self.services),
        )

    async def NotifyRegistrationStatus(
        self,
        request: pluginregistration_pb2.RegistrationStatus,
        context: grpc.aio.ServicerContext,
    ) -> pluginregistration_pb2.RegistrationStatusResponse:
        self.registered = request.plugin_registered
        if request.plugin_registered:
            log.info("dra_plugin_registered", driver=self.driver, endpoint=self.endpoint)
            self.accepted.set()
        else:
            log.error("dra_plugin_refused", driver=self.driver, error=request.error)
        return pluginregistration_pb2.RegistrationStatusResponse()


async def serve_dra(
    plugin: DraPlugin, socket_path: str, health: HealthStream | None = None
) -> grpc.aio.Server:
    """The DRA service, and kubelet's health stream beside it on the same socket."""

    def add(server: grpc.aio.Server) -> None:
        # The generated gRPC modules are untyped (grpc_tools writes no stubs for them).
        dra_pb2_grpc.add_DRAPluginServicer_to_server(plugin, server)  # type: ignore[no-untyped-call]
        if health is not None:
            drahealth_pb2_grpc.add_DRAResourceHealthServicer_to_server(health, server)  # type: ignore[no-untyped-call]

    return await serve_unix(add, socket_path)


async def serve_registration(registration: Registration, socket_path: str) -> grpc.aio.Server:
    add = pluginregistration_pb2_grpc.add_RegistrationServicer_to_server
    return await serve_unix(lambda server: add(registration, server), socket_path)  # type: ignore[no-untyped-call]


def _prepared(
    devices: Iterable[prepare.PreparedDevice],
) -> dra_pb2.NodePrepareResourceResponse:
    """kubelet's answer for a claim prepared: each device, its requests and CDI ids."""
    return dra_pb2.NodePrepareResourceResponse(
        devices=[
            dra_pb2.Device(
                request_names=list(d.requests),
                pool_name=d.pool,
                device_name=d.device,
                cdi_device_ids=list(d.cdi_ids),
                share_id=d.share_id,
            )
            for d in devices
        ]
    )
