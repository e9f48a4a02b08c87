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
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Final, Protocol

import structlog

from vgpu_operator import names, resources
from vgpu_operator.agent import health, nodeconfig
from vgpu_operator.agent.backends import Backend
from vgpu_operator.agent.backoff import Backoff, wait_or_stop
from vgpu_operator.agent.inventory import build_status, same_report
from vgpu_operator.agent.metrics import AgentMetrics, Operation
from vgpu_operator.agent.settings import AgentSettings, describe_error, utc_now
from vgpu_operator.devices import codec, nvidia
from vgpu_operator.errors import CodecError
from vgpu_operator.kube.inventory import CrdMissingError, NodeNotFoundError
from vgpu_operator.kube.node_lease import LeaseNamespaceMissingError

log = structlog.get_logger(__name__)

#: HAMi's handshake time layout (Go's "2006-01-02 15:04:05", local time).
_HANDSHAKE_TIME_FORMAT = "%Y-%m-%d %H:%M:%S"


class AgentWriter(Protocol):
    """The API calls the agent makes (``kube.agent_writer.KubeAgentWriter``)."""

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


class Agent:
    """One node's agent. ``run`` until ``stop`` is set; ``step`` is one poll."""

    def __init__(
        self,
        settings: AgentSettings,
        backend: Backend,
        writer: AgentWriter,
        *,
        metrics: AgentMetrics | None = None,
        clock: Callable[[], datetime] = utc_now,
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
            nvidia.REGISTER_ANNOTATION: codec.encode_node_devices_json(devices),
            nvidia.SCORE_ANNOTATION: codec.encode_pair_scores(scores),
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
                await wait_or_stop(stop, delay)
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
                await wait_or_stop(stop, delay)
                continue
            backoff.reset()
            if changed:
                log.info("gpu_health_changed", node=self.settings.node_name)
                self._wake.set()
