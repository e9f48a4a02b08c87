"""The agent loop: read the machine, report what changed, heartbeat, never give up.

Each poll reads the backend (in a worker thread), builds the DeviceInventory status and
writes it when it differs from the last one written (``status.heartbeat`` set on that
write). The heartbeat itself is the node's Lease (``node_leases``), renewed every
``heartbeat_interval_s``: a small write the API server neither schema-validates nor fans
out to the operator's inventory watch, where moving ``status.heartbeat`` of a multi-KB
inventory was both. At each renewal the agent also reads its inventory back (from the API
server's cache) and writes it again if someone else changed it. A health event from the
backend triggers a poll at once. Any failure (API down, CRD missing, a read error) is
logged, counted and retried with capped exponential backoff; after a failed inventory
write, the next success rewrites the whole status, so the latest state lands once the API
is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Protocol

import structlog

from vgpu_operator import names, resources
from vgpu_operator.agent import config_watch, hamicore, health, mig, nodeconfig
from vgpu_operator.agent.backends import Backend
from vgpu_operator.agent.backoff import Backoff
from vgpu_operator.agent.containers import container_cards
from vgpu_operator.agent.deviceplugin.allocation import (
    CONTAINER_HOOK_DIR,
    HostPaths,
    MigDevices,
    NodeSettings,
)
from vgpu_operator.agent.deviceplugin.runner import PluginRunner
from vgpu_operator.agent.deviceplugin.server import GpuDevicePlugin, StaleRead, cards_of
from vgpu_operator.agent.dra import mig_prepare
from vgpu_operator.agent.dra import shapes as dra_shapes
from vgpu_operator.agent.dra import sysfs as dra_sysfs
from vgpu_operator.agent.dra.health_stream import HealthStream
from vgpu_operator.agent.dra.mig_prepare import MigMaker
from vgpu_operator.agent.dra.plugin import DraPlugin
from vgpu_operator.agent.dra.publisher import SlicePublisher
from vgpu_operator.agent.dra.runner import DraRunner
from vgpu_operator.agent.inventory import RegistrationOptions, build_status, same_report
from vgpu_operator.agent.metrics import AgentMetrics, Operation
from vgpu_operator.devices import codec, dra, nvidia
from vgpu_operator.errors import CodecError
from vgpu_operator.kube import events as kube_events
from vgpu_operator.kube import resource_slices
from vgpu_operator.kube.agent_writer import AgentWriter as KubeAgentWriter
from vgpu_operator.kube.client import api_client
from vgpu_operator.kube.inventory import CrdMissingError, NodeNotFoundError
from vgpu_operator.kube.node_labels import read_node_labels
from vgpu_operator.kube.node_lease import LeaseNamespaceMissingError
from vgpu_operator.kube.pods import patch_pod_annotations, pods_on_node
from vgpu_operator.kube.requests import ApiClient, ApiError
from vgpu_operator.wire import Pod, ResourceClaim

log = structlog.get_logger(__name__)

#: Events the agent writes say they come from it, not from the scheduler.
AGENT_COMPONENT: Final = "vgpu-agent"

#: HAMi's handshake time layout (Go's "2006-01-02 15:04:05", local time).
_HANDSHAKE_TIME_FORMAT = "%Y-%m-%d %H:%M:%S"


@dataclass(frozen=True, slots=True)
class AgentSettings:
    """How one agent behaves. Intervals are in seconds."""

    node_name: str
    #: How often the node's Lease is renewed (and the inventory checked against the reading).
    heartbeat_interval_s: float = 30.0
    #: What the Lease says it lasts (``spec.leaseDurationSeconds``): the operator's
    #: ``--inventory-timeout``, which is what decides when the node counts as lost.
    lease_duration_s: int = 120
    #: How often the machine is read; health events cut the wait short.
    poll_interval_s: float = 10.0
    registration: RegistrationOptions = field(default_factory=RegistrationOptions)
    #: Also write hami.io/node-nvidia-register, -score and the handshake on the Node.
    write_hami_annotations: bool = False
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 60.0
    #: Longest single wait for an NVML event; bounds how long shutdown waits for it.
    health_wait_s: float = 1.0
    #: The whole status is written again at least this often, whatever the server shows.
    reassert_interval_s: float = 300.0
    #: kubelet's device-plugin directory; None runs no device plugin (no kubelet here).
    device_plugin_dir: str | None = None
    #: The count resource the plugin advertises (the device config's resourceCountName).
    device_plugin_resource: str = nvidia.COUNT_RESOURCE
    #: HAMi-core's directory on the host, mounted at the same path into the agent.
    hami_core_dir: str = "/usr/local/vgpu"
    #: The device-config ConfigMap this node's settings follow; name None follows none
    #: (the flags above are then all there is).
    config_namespace: str = "vgpu-operator"
    config_map: str | None = None
    config_key: str = "device-config.yaml"
    #: The libvgpu.so the image carries, installed into hami_core_dir at start; None
    #: installs nothing (the library is put there some other way).
    hami_core_library: str | None = None
    #: kubelet's DRA directories (plugins, plugin registry) and the CDI spec directory;
    #: None runs no DRA driver. A node labelled for DRA runs the driver instead of the
    #: device plugin (``devices.dra.NODE_PATH_LABEL``).
    dra_plugins_dir: str | None = None
    dra_registry_dir: str = "/var/lib/kubelet/plugins_registry"
    cdi_dir: str = "/var/run/cdi"


class AgentWriter(Protocol):
    """The API calls the agent makes (``kube.agent_writer.AgentWriter``)."""

    async def ensure(self, node_name: str) -> None: ...

    async def write_status(self, node_name: str, status: Mapping[str, Any]) -> None: ...

    async def read_inventory(self, node_name: str) -> Mapping[str, Any] | None:
        """The inventory as the server holds it; None when there is none."""
        ...

    async def renew_lease(self, node_name: str, renewed: datetime, duration_s: int) -> None:
        """Renew the node's Lease (creating it when missing)."""
        ...

    async def write_node_annotations(
        self, node_name: str, annotations: Mapping[str, str | None]
    ) -> None: ...


#: Operations after whose failure the server's inventory is in doubt.
_INVENTORY_WRITES: Final = frozenset({Operation.CREATE, Operation.STATUS, Operation.ANNOTATIONS})


def _utc_now() -> datetime:
    return datetime.now(UTC)


class Agent:
    """One node's agent. ``run`` until ``stop`` is set; ``step`` is one poll."""

    def __init__(
        self,
        settings: AgentSettings,
        backend: Backend,
        writer: AgentWriter,
        *,
        metrics: AgentMetrics | None = None,
        clock: Callable[[], datetime] = _utc_now,
        on_status: Callable[[resources.DeviceInventoryStatus], None] | None = None,
    ) -> None:
        self.settings = settings
        #: Told every status written (the device plugin advertises what is reported).
        self.on_status = on_status
        self.backend = backend
        self.writer = writer
        self.metrics = AgentMetrics() if metrics is None else metrics
        self._clock = clock
        self._backoff = Backoff(settings.backoff_initial_s, settings.backoff_max_s)
        self._operation = Operation.READ
        self._reported_count = 0
        self._ensured = False
        self._synced = False
        self._last_written: resources.DeviceInventoryStatus | None = None
        self._last_annotations: dict[str, str] = {}
        #: The last Lease renewal.
        self._heartbeat_at: datetime | None = None
        self._asserted_at: datetime | None = None
        self._wake = asyncio.Event()
        #: This node's settings: the flags until the device config says otherwise.
        self.node_config = nodeconfig.from_flags(settings.registration)
        #: Told every new node config (the device plugin's Allocate settings follow it).
        self.on_config: Callable[[nodeconfig.NodeConfig], None] | None = None
        self._left_out: tuple[tuple[str, str], ...] = ()

    def apply_config(self, config: nodeconfig.NodeConfig) -> None:
        """New settings from the device config: reported (and advertised) at once."""
        if config == self.node_config:
            return
        self.node_config = config
        log.info("node_config_applied", node=self.settings.node_name, **nodeconfig.describe(config))
        for setting in config.ignored:
            log.warning("node_config_ignored", node=self.settings.node_name, setting=setting)
        if self.on_config is not None:
            self.on_config(config)
        self._wake.set()

    @property
    def last_written(self) -> resources.DeviceInventoryStatus | None:
        """The last status the API server accepted."""
        return self._last_written

    # --- the loop -----------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Poll and report until ``stop`` is set. Returns only then."""
        if not await self._open_backend(stop):
            return
        watcher = asyncio.create_task(self._watch_health(stop), name="agent-health")
        stopper = asyncio.create_task(self._wake_on(stop), name="agent-stop")
        try:
            while not stop.is_set():
                delay = await self._step_or_back_off()
                await self._sleep(delay)
        finally:
            stopper.cancel()
            # The watcher's thread returns within health_wait_s; wait for it so the
            # backend is not closed under a running NVML call.
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            await asyncio.to_thread(self.backend.close)

    async def _step_or_back_off(self) -> float:
        try:
            delay = await self.step()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            return self._failed(exc)
        self._backoff.reset()
        return delay

    async def step(self) -> float:
        """Read the machine once and write what is due; returns seconds until the next
        poll. Raises whatever the backend or the API raised."""
        self._operation = Operation.READ
        reading = await asyncio.to_thread(self.backend.read)
        self.metrics.observe(reading)
        present = sum(1 for gpu in reading.gpus if gpu.present)
        count = health.check_gpu_count(self._reported_count, present)
        if count.refresh or not count.healthy:
            log.info(
                "gpu_count_changed",
                node=self.settings.node_name,
                before=self._reported_count,
                now=present,
            )
        self._reported_count = count.reported
        # The count above is of every card NVML sees (a card vanishing is news even when
        # the config leaves it out); what is reported is what this node offers.
        selection = nodeconfig.select(reading, self.node_config)
        if selection.left_out != self._left_out:
            self._left_out = selection.left_out
            for uuid, why in selection.left_out:
                log.info("gpu_left_out", node=self.settings.node_name, uuid=uuid, why=why)
        now = self._clock()
        status = build_status(
            selection.reading,
            node_name=self.settings.node_name,
            backend=self.backend.description,
            options=self.node_config.registration,
            count=count,
            heartbeat=now,
            previous=self._last_written,
        )
        written = False
        if not self._synced or not same_report(self._last_written, status):
            await self._write_status(status, now)
            written = True
        if self._heartbeat_due(now):
            await self._renew_lease(now)
            if not written:
                if self.settings.write_hami_annotations and self._last_written is not None:
                    # HAMi's handshake, which its scheduler expects on every heartbeat.
                    await self._write_annotations(self._last_written, now)
                await self._check_server_copy(status, now)
        return self._next_delay(now)

    async def _check_server_copy(
        self, status: resources.DeviceInventoryStatus, now: datetime
    ) -> None:
        """The server's copy is what the scheduler reads: whoever changed it (a careless
        admin, a stolen token), the agent's reading is what stands."""
        self._operation = Operation.CHECK
        server = await self.writer.read_inventory(self.settings.node_name)
        if server is None:
            log.warning("inventory_missing", node=self.settings.node_name)
            self._ensured = False
            await self._write_status(status, now)
        elif self._server_differs(server, status):
            log.warning("inventory_overwritten", node=self.settings.node_name)
            await self._write_status(status, now)
        elif self._reassert_due(now):
            await self._write_status(status, now)

    def _server_differs(
        self, server: Mapping[str, Any], status: resources.DeviceInventoryStatus
    ) -> bool:
        try:
            held = resources.parse_inventory(server).status
        except CodecError:
            return True
        return not same_report(held, status)

    def _reassert_due(self, now: datetime) -> bool:
        if self._asserted_at is None:
            return True
        return (now - self._asserted_at).total_seconds() >= self.settings.reassert_interval_s

    async def _write_status(self, status: resources.DeviceInventoryStatus, now: datetime) -> None:
        node = self.settings.node_name
        if not self._ensured:
            self._operation = Operation.CREATE
            await self.writer.ensure(node)
            self._ensured = True
        self._operation = Operation.STATUS
        await self.writer.write_status(node, resources.status_to_wire(status))
        changed = not same_report(self._last_written, status)
        self._last_written = status
        self._synced = True
        self._asserted_at = now
        if self.on_status is not None:
            self.on_status(status)
        self.metrics.heartbeat_written()
        if changed:
            log.info(
                "inventory_reported",
                node=node,
                gpus=status.summary.gpu_count,
                healthy=status.summary.healthy_count,
            )
        if self.settings.write_hami_annotations:
            await self._write_annotations(status, now)

    async def _renew_lease(self, now: datetime) -> None:
        self._operation = Operation.HEARTBEAT
        await self.writer.renew_lease(self.settings.node_name, now, self.settings.lease_duration_s)
        self._heartbeat_at = now
        self.metrics.heartbeat_written()

    async def _write_annotations(
        self, status: resources.DeviceInventoryStatus, now: datetime
    ) -> None:
        """HAMi's node annotations, so HAMi's own scheduler can use this agent.

        The register and score annotations are written when they change; the
        handshake on every write, as HAMi's device plugin answers the scheduler's
        ``Requesting_`` probe.
        """
        self._operation = Operation.ANNOTATIONS
        devices, scores = resources.devices_from_status(status)
        wanted = {
            names.NODE_NVIDIA_REGISTER: codec.encode_node_devices_json(devices),
            names.NODE_NVIDIA_SCORE: codec.encode_pair_scores(scores),
        }
        patch: dict[str, str | None] = {
            key: value for key, value in wanted.items() if self._last_annotations.get(key) != value
        }
        patch[names.NODE_HANDSHAKE] = "Reported_" + now.astimezone().strftime(
            _HANDSHAKE_TIME_FORMAT
        )
        await self.writer.write_node_annotations(self.settings.node_name, patch)
        self._last_annotations = wanted

    def _failed(self, exc: Exception) -> float:
        operation = self._operation
        self.metrics.report_failed(operation)
        delay = self._backoff.next_delay_s()
        if operation in _INVENTORY_WRITES:
            # Whatever we believed the server holds may be stale now (the object may be
            # gone, the server restarted): check it exists and write everything again.
            # A failed Lease renewal or read-back leaves the inventory as it was: the
            # next renewal retries, and its read-back finds anything that changed.
            self._ensured = False
            self._synced = False
            self._last_annotations = {}
        node = self.settings.node_name
        if isinstance(exc, CrdMissingError):
            log.error("inventory_crd_missing", node=node, error=str(exc), retry_in_s=delay)
        elif isinstance(exc, LeaseNamespaceMissingError):
            log.error("node_lease_namespace_missing", node=node, error=str(exc), retry_in_s=delay)
        elif isinstance(exc, NodeNotFoundError):
            log.error("node_not_found", node=node, error=str(exc), retry_in_s=delay)
        else:
            log.warning(
                "agent_step_failed",
                node=node,
                operation=operation.value,
                error=describe_error(exc),
                failures=self._backoff.failures,
                retry_in_s=round(delay, 3),
                exc_info=operation is Operation.READ,
            )
        return delay

    def _heartbeat_due(self, now: datetime) -> bool:
        if self._heartbeat_at is None:
            return True
        return (now - self._heartbeat_at).total_seconds() >= self.settings.heartbeat_interval_s

    def _next_delay(self, now: datetime) -> float:
        delay = self.settings.poll_interval_s
        if self._heartbeat_at is not None:
            elapsed = (now - self._heartbeat_at).total_seconds()
            delay = min(delay, self.settings.heartbeat_interval_s - elapsed)
        return max(delay, 0.0)

    async def _sleep(self, delay_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout=delay_s)
        self._wake.clear()

    def poll_now(self) -> None:
        """Read the machine at once (the DRA driver destroyed MIG instances)."""
        self._wake.set()

    async def _wake_on(self, stop: asyncio.Event) -> None:
        await stop.wait()
        self._wake.set()

    async def _open_backend(self, stop: asyncio.Event) -> bool:
        backoff = Backoff(self.settings.backoff_initial_s, self.settings.backoff_max_s)
        while not stop.is_set():
            try:
                await asyncio.to_thread(self.backend.open)
            except Exception as exc:
                self.metrics.report_failed(Operation.READ)
                delay = backoff.next_delay_s()
                log.error(
                    "backend_open_failed",
                    backend=self.backend.description,
                    error=f"{type(exc).__name__}: {exc}",
                    retry_in_s=round(delay, 3),
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=delay)
                continue
            log.info("backend_opened", backend=self.backend.description)
            return True
        return False

    async def _watch_health(self, stop: asyncio.Event) -> None:
        backoff = Backoff(self.settings.backoff_initial_s, self.settings.backoff_max_s)
        while not stop.is_set():
            try:
                changed = await asyncio.to_thread(
                    self.backend.watch_health, self.settings.health_wait_s
                )
            except Exception as exc:
                delay = backoff.next_delay_s()
                log.warning("health_watch_failed", error=str(exc), retry_in_s=round(delay, 3))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=delay)
                continue
            backoff.reset()
            if changed:
                log.info("gpu_health_changed", node=self.settings.node_name)
                self._wake.set()


def describe_error(exc: BaseException) -> str:
    """One line for a log: API errors as status, reason and the server's message
    (the library's own text carries every response header)."""
    status = getattr(exc, "status", None)
    if isinstance(status, int):
        reason = getattr(exc, "reason", "") or ""
        message = ""
        body = getattr(exc, "body", None)
        if isinstance(body, str | bytes):
            with contextlib.suppress(ValueError):
                parsed = json.loads(body)
                if isinstance(parsed, dict):
                    message = str(parsed.get("message", ""))
        text = f"{type(exc).__name__} {status} {reason}".rstrip()
        return f"{text}: {message}" if message else text
    return f"{type(exc).__name__}: {exc}"


async def run_agent(
    settings: AgentSettings,
    backend: Backend,
    *,
    kubeconfig: str | None = None,
    metrics_port: int = 0,
    stop: asyncio.Event | None = None,
    metrics: AgentMetrics | None = None,
) -> None:
    """Connect to the API server and run the agent until ``stop`` is set."""
    agent_metrics = AgentMetrics() if metrics is None else metrics
    agent_metrics.serve(metrics_port)
    stop_event = asyncio.Event() if stop is None else stop
    async with api_client(kubeconfig) as api:
        path = await node_path(settings, api, stop_event)
        if path is None:
            return  # stopped before the node could be read
        log.info("gpu_path_chosen", node=settings.node_name, path=path)
        if path == dra.PATH_DRA:
            await run_dra_driver(settings, backend, api, agent_metrics, stop_event)
            return
        if settings.dra_plugins_dir is not None:
            # This node serves the device plugin: no card of it may be offered by both.
            await withdraw_slices(api, settings.node_name)
        if settings.device_plugin_dir is None:
            agent = Agent(settings, backend, KubeAgentWriter(api), metrics=agent_metrics)
            await asyncio.gather(
                agent.run(stop_event), follow_config(settings, api, agent, stop_event)
            )
            return
        await install_hami_core(settings)
        # MIG entries: the geometry tables of the config in force when Allocate runs.
        instances = mig.MigInstances(
            backend.nvml_module, lambda card_type: agent.node_config.geometries_for(card_type)
        )
        plugin = device_plugin(settings, api, instances)
        agent = Agent(
            settings,
            backend,
            KubeAgentWriter(api),
            metrics=agent_metrics,
            on_status=lambda status: plugin.set_cards(cards_of(status)),
        )
        agent.on_config = lambda config: plugin.apply_config(
            config.registration.memory_scaling, config.core_policy, config.schedulers
        )
        runner = PluginRunner(plugin, Path(settings.device_plugin_dir))
        await asyncio.gather(
            agent.run(stop_event),
            runner.run(stop_event),
            follow_config(settings, api, agent, stop_event),
            follow_containers(settings, api, agent_metrics, stop_event),
        )


async def install_hami_core(settings: AgentSettings) -> None:
    """HAMi-core's library from the image into its host directory (both paths use it)."""
    if settings.hami_core_library is not None:
        await asyncio.to_thread(
            hamicore.install,
            Path(settings.hami_core_library),
            Path(settings.hami_core_dir),
            CONTAINER_HOOK_DIR,
        )


async def node_path(settings: AgentSettings, api: ApiClient, stop: asyncio.Event) -> str | None:
    """Which path this node's cards are offered by: its label's, or the device plugin
    (None when ``stop`` is set before the Node could be read). DRA needs the driver's
    directories (``--kubelet-plugins-dir``); without them a node labelled for DRA is served
    by the device plugin, and the log says so."""
    backoff = Backoff(settings.backoff_initial_s, settings.backoff_max_s)
    while True:
        try:
            labels = await read_node_labels(api, settings.node_name)
            break
        except Exception as exc:
            delay = backoff.next_delay_s()
            log.warning(
                "node_read_failed",
                node=settings.node_name,
                error=describe_error(exc),
                retry_in_s=round(delay, 3),
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=delay)
            if stop.is_set():
                return None
    wanted = labels.get(dra.NODE_PATH_LABEL, dra.PATH_DEVICE_PLUGIN)
    if wanted not in dra.PATHS:
        log.error(
            "gpu_path_unknown",
            node=settings.node_name,
            label=dra.NODE_PATH_LABEL,
            value=wanted,
            detail=f"expected one of {', '.join(dra.PATHS)}; the device plugin serves",
        )
        return dra.PATH_DEVICE_PLUGIN
    if wanted == dra.PATH_DRA and settings.dra_plugins_dir is None:
        log.error(
            "gpu_path_dra_unavailable",
            node=settings.node_name,
            detail="the node is labelled for DRA but the agent has no --kubelet-plugins-dir",
        )
        return dra.PATH_DEVICE_PLUGIN
    return wanted


async def withdraw_slices(api: ApiClient, node: str) -> None:
    """Delete this driver's slices of ``node`` (a node moved back to the device plugin).
    Best effort: a cluster without DRA (or without agent-dra.yaml) has none to delete."""
    try:
        for found in await resource_slices.list_slices(api, dra.DRIVER, node):
            await resource_slices.delete_slice(api, str(found["metadata"]["name"]))
            log.info("resource_slice_withdrawn", node=node, name=found["metadata"]["name"])
    except Exception as exc:
        log.warning("resource_slices_not_withdrawn", node=node, error=describe_error(exc))


def _request_defaults(config: nodeconfig.NodeConfig) -> dra_shapes.RequestDefaults:
    return dra_shapes.RequestDefaults(
        memory_mib=config.default_memory_mib, cores=config.default_cores
    )


async def run_dra_driver(
    settings: AgentSettings,
    backend: Backend,
    api: ApiClient,
    metrics: AgentMetrics,
    stop: asyncio.Event,
) -> None:
    """The node on the DRA path: the inventory as always, the cards as this node's
    ResourceSlice pool, and kubelet's DRA plugin preparing claims with HAMi-core's limits."""
    assert settings.dra_plugins_dir is not None
    await install_hami_core(settings)
    node = settings.node_name
    real_sysfs = backend.description == "nvml"
    publisher = SlicePublisher(
        node,
        resource_slices.ApiSliceStore(api),
        _request_defaults(nodeconfig.from_flags(settings.registration)),
        pcie_root=dra_sysfs.pcie_root if real_sysfs else (lambda bus_id: None),
        backoff_initial_s=settings.backoff_initial_s,
        backoff_max_s=settings.backoff_max_s,
        # Read back as often as the Lease is renewed (kubelet wipes slices when it starts).
        check_interval_s=settings.heartbeat_interval_s,
        # MIG instances the claims' CDI specs record are the driver's; the others on a
        # card (made before the agent started, or by someone else) leave its counters.
        own_instances=lambda: mig_prepare.recorded_instances(Path(settings.cdi_dir)),
    )

    async def claim(namespace: str, name: str) -> ResourceClaim | None:
        return await resource_slices.get_claim(api, namespace, name)

    plugin = DraPlugin(
        node,
        publisher.cards,
        claim,
        NodeSettings(
            device_memory_scaling=settings.registration.memory_scaling,
            host=HostPaths(hook_dir=settings.hami_core_dir),
        ),
        Path(settings.cdi_dir),
        mig=(publisher.mig_placements, MigMaker(backend.nvml_module)),
    )
    agent = Agent(settings, backend, KubeAgentWriter(api), metrics=metrics)
    # kubelet's health stream reports the cards as published, resent every heartbeat.
    health = HealthStream(node, publisher.cards, resend_s=settings.heartbeat_interval_s)

    def on_status(status: resources.DeviceInventoryStatus) -> None:
        publisher.set_status(status)
        health.changed()

    agent.on_status = on_status
    plugin.on_mig_prepared = publisher.refresh
    plugin.on_mig_unprepared = agent.poll_now

    def on_config(config: nodeconfig.NodeConfig) -> None:
        publisher.set_defaults(_request_defaults(config))
        plugin.settings = replace(
            plugin.settings,
            device_memory_scaling=config.registration.memory_scaling,
            core_policy=config.core_policy,
        )

    agent.on_config = on_config
    runner = DraRunner(
        plugin, Path(settings.dra_plugins_dir), Path(settings.dra_registry_dir), health=health
    )
    await asyncio.gather(
        agent.run(stop),
        publisher.run(stop),
        runner.run(stop),
        follow_config(settings, api, agent, stop),
    )


async def follow_config(
    settings: AgentSettings, api: ApiClient, agent: Agent, stop: asyncio.Event
) -> None:
    """Follow the device-config ConfigMap (if one is named) until ``stop``."""
    if settings.config_map is None:
        return
    follower = config_watch.ConfigFollower(
        settings.node_name, settings.config_key, settings.registration, agent.apply_config
    )
    await config_watch.follow(
        api,
        follower,
        settings.config_namespace,
        settings.config_map,
        stop,
        backoff_initial_s=settings.backoff_initial_s,
        backoff_max_s=settings.backoff_max_s,
    )


async def follow_containers(
    settings: AgentSettings, api: ApiClient, metrics: AgentMetrics, stop: asyncio.Event
) -> None:
    """Keep the container info series (which container holds which card) current: the
    node's pods are listed once per heartbeat interval, until ``stop``. A failed listing
    keeps the last rows (they are more likely right than none)."""
    node = settings.node_name
    while not stop.is_set():
        try:
            pods = await pods_on_node(api, node)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            metrics.report_failed(Operation.CONTAINERS)
            log.warning("container_listing_failed", node=node, error=describe_error(exc))
        else:
            metrics.containers(node, container_cards(pods, node))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), settings.heartbeat_interval_s)


def device_plugin(
    settings: AgentSettings, api: ApiClient, mig_devices: MigDevices | None = None
) -> GpuDevicePlugin:
    """The kubelet device plugin of this node, reading and settling pods through ``api``."""
    node = settings.node_name

    async def pods() -> list[Pod]:
        return await pods_on_node(api, node)

    async def patch(pod: Pod, annotations: Mapping[str, str]) -> None:
        try:
            await patch_pod_annotations(api, pod, annotations)
        except ApiError as exc:
            if exc.status == 409:
                raise StaleRead(str(exc)) from exc
            raise

    events = kube_events.EventAggregator(component=AGENT_COMPONENT)

    async def report(pod: Pod, reason: str, message: str) -> None:
        ref = kube_events.ObjectRef.of(pod, "Pod")
        await kube_events.write_event(api, events.record(ref, reason, message, _utc_now()))

    node_settings = NodeSettings(
        device_memory_scaling=settings.registration.memory_scaling,
        host=HostPaths(hook_dir=settings.hami_core_dir),
    )
    return GpuDevicePlugin(
        node, settings.device_plugin_resource, [], pods, patch, node_settings, report, mig_devices
    )
