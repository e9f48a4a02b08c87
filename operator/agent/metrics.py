"""The agent's Prometheus metrics, served on its own port.

Per-card gauges carry the card's ``uuid`` and ``index`` (a closed set on one node) and
are set only where NVML answers; a card that stops reporting a value drops that series
rather than showing a stale one. ``vgpu_agent_container_device_info`` (value 1) names,
per container holding a share of a card, the card's UUID under DCGM exporter's label name
``UUID``, so that DCGM's per-card series join to pods even when pods share a card
(``docs/operations.md`` has the query); only this node's cards become label values.
"""

from __future__ import annotations

import contextlib
import enum
import math
import time
from collections.abc import Callable

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    ProcessCollector,
    start_http_server,
)

from vgpu_operator.agent.containers import ContainerCard
from vgpu_operator.agent.readings import MachineReading


class Operation(enum.StrEnum):
    """What the agent was doing when an error happened (the ``operation`` label)."""

    READ = "read"
    CREATE = "create"
    STATUS = "status"
    #: Renewing the node's Lease.
    HEARTBEAT = "heartbeat"
    #: Reading the inventory back to compare it with the reading.
    CHECK = "check"
    ANNOTATIONS = "annotations"
    #: Listing the node's pods for the container info series.
    CONTAINERS = "containers"


_GPU_LABELS = ("uuid", "index")
#: ``UUID`` is DCGM exporter's label for the card, so ``on(UUID)`` joins the two.
_CONTAINER_LABELS = ("namespace", "pod", "container", "UUID", "node")


class AgentMetrics:
    """Every metric of one agent, in its own registry (several agents may share a
    process in tests)."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.registry = CollectorRegistry() if registry is None else registry
        self._monotonic = monotonic
        self._started = monotonic()
        self._last_heartbeat: float | None = None
        self._series: set[tuple[str, str]] = set()
        self._containers: set[tuple[str, ...]] = set()
        self.memory_used = Gauge(
            "vgpu_agent_gpu_memory_used_bytes",
            "Memory in use on the card.",
            labelnames=_GPU_LABELS,
            registry=self.registry,
        )
        self.memory_total = Gauge(
            # A gauge: no `_total` suffix, which means a counter (promtool check metrics).
            "vgpu_agent_gpu_memory_capacity_bytes",
            "Memory of the card.",
            labelnames=_GPU_LABELS,
            registry=self.registry,
        )
        self.utilization = Gauge(
            "vgpu_agent_gpu_utilization_ratio",
            "Fraction of the last sample period the card was busy (0-1).",
            labelnames=_GPU_LABELS,
            registry=self.registry,
        )
        self.temperature = Gauge(
            "vgpu_agent_gpu_temperature_celsius",
            "Card temperature.",
            labelnames=_GPU_LABELS,
            registry=self.registry,
        )
        self.power = Gauge(
            "vgpu_agent_gpu_power_watts",
            "Card power draw.",
            labelnames=_GPU_LABELS,
            registry=self.registry,
        )
        self.healthy = Gauge(
            "vgpu_agent_gpu_healthy",
            "1 when the card is healthy, else 0.",
            labelnames=_GPU_LABELS,
            registry=self.registry,
        )
        self.report_errors = Counter(
            "vgpu_agent_report_errors",
            "Failed readings and API writes, by operation.",
            ["operation"],
            registry=self.registry,
        )
        for operation in Operation:
            self.report_errors.labels(operation.value)
        self.heartbeat_age = Gauge(
            "vgpu_agent_heartbeat_age_seconds",
            "Seconds since the inventory was last written (since start before the first).",
            registry=self.registry,
        )
        self.heartbeat_age.set_function(self._heartbeat_age_s)
        self.container_device = Gauge(
            "vgpu_agent_container_device_info",
            "1 for each container holding a share of a card (the card's UUID as DCGM "
            "exporter labels it), to join DCGM's per-card series to pods.",
            labelnames=_CONTAINER_LABELS,
            registry=self.registry,
        )
        # process_cpu_seconds_total, process_resident_memory_bytes, open fds...
        ProcessCollector(registry=self.registry)

    def observe(self, reading: MachineReading) -> None:
        """Record one reading's telemetry."""
        current: set[tuple[str, str]] = set()
        for gpu in reading.gpus:
            labels = (gpu.uuid, str(gpu.index))
            current.add(labels)
            self.memory_total.labels(*labels).set(gpu.memory_total_bytes)
            self.healthy.labels(*labels).set(1 if gpu.healthy else 0)
            _set_or_drop(self.memory_used, labels, gpu.memory_used_bytes)
            _set_or_drop(self.utilization, labels, gpu.utilization_ratio)
            _set_or_drop(self.temperature, labels, gpu.temperature_celsius)
            _set_or_drop(self.power, labels, gpu.power_watts)
        for labels in self._series - current:
            for gauge in self._gpu_gauges():
                _drop(gauge, labels)
        self._series = current

    def containers(self, node: str, rows: set[ContainerCard]) -> None:
        """Which container holds which card now (series of the others are dropped).

        Only cards of the last reading are named: a pod's annotations cannot make up
        label values.
        """
        cards = {uuid for uuid, _index in self._series}
        current: set[tuple[str, ...]] = {
            (row.namespace, row.pod, row.container, row.uuid, node)
            for row in rows
            if row.uuid in cards
        }
        for labels in current - self._containers:
            self.container_device.labels(*labels).set(1)
        for labels in self._containers - current:
            with contextlib.suppress(KeyError):
                self.container_device.remove(*labels)
        self._containers = current

    def report_failed(self, operation: Operation) -> None:
        self.report_errors.labels(operation.value).inc()

    def heartbeat_written(self) -> None:
        self._last_heartbeat = self._monotonic()

    def serve(self, port: int) -> None:
        """Serve ``/metrics`` on ``port`` in a background thread (0 = not at all)."""
        if port:
            start_http_server(port, registry=self.registry)

    def _heartbeat_age_s(self) -> float:
        since = self._started if self._last_heartbeat is None else self._last_heartbeat
        age = self._monotonic() - since
        return age if math.isfinite(age) else 0.0

    def _gpu_gauges(self) -> tuple[Gauge, ...]:
        return (
            self.memory_used,
            self.memory_total,
            self.utilization,
            self.temperature,
            self.power,
            self.healthy,
        )


def _set_or_drop(gauge: Gauge, labels: tuple[str, str], value: float | None) -> None:
    if value is None:
        _drop(gauge, labels)
    else:
        gauge.labels(*labels).set(value)


def _drop(gauge: Gauge, labels: tuple[str, str]) -> None:
    with contextlib.suppress(KeyError):  # never set: nothing to drop
        gauge.remove(*labels)
