"""The operator's Prometheus metrics, recorded through functions named by intent.

Every metric lives in one ``OperatorMetrics`` object with its own registry (no global
registration on import, so tests and two operators in one process do not collide).
Per-device and per-namespace figures are not pushed: a collector reads them from the
engine at scrape time, through callables handed in by the operator, so they can never
drift from the engine's books. A scrape reads the books on the operator's event loop,
the same thread that changes the engine, so the reads need no lock; formatting them (a
second at 8,000 cards) happens in a thread on that copy, so decisions go on meanwhile.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Final, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

PREFIX: Final = "vgpu_operator"
MIB_BYTES: Final = 1024 * 1024
#: A card's whole compute is 100 "cores" in HAMi's units; ratios divide by this.
CORES_PER_CARD: Final = 100.0

_LATENCY_BUCKETS_S: Final = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)


class Result(enum.StrEnum):
    """Outcomes of one scheduling attempt (the ``result`` label; a closed set)."""

    SCHEDULED = "scheduled"
    UNSCHEDULABLE = "unschedulable"
    REJECTED = "rejected"  # admission rules refuse it (quota)
    BIND_CONFLICT = "bind_conflict"
    PREEMPTING = "preempting"  # evicting victims, or waiting for them to go
    GATED = "gated"  # decided; its Binding waits for the node's previous GPU pod
    ERROR = "error"


class WebhookResult(enum.StrEnum):
    """What the webhook answered (the ``result`` label; a closed set)."""

    MUTATED = "mutated"  # a GPU pod, routed to us with its defaults
    DENIED = "denied"  # refused with a message
    PASSED = "passed"  # not ours: let through unchanged
    NOT_READY = "not_ready"  # the operator had not started: let through unchanged


#: Pod creation to Binding: seconds to minutes (pods may wait for room).
_CREATE_TO_BOUND_BUCKETS_S: Final = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


class DeviceRow(Protocol):
    """What the collector reads per card (``scheduling.cluster.DeviceUsageRow``)."""

    @property
    def node(self) -> str: ...
    @property
    def uuid(self) -> str: ...
    @property
    def vendor(self) -> str: ...
    @property
    def type(self) -> str: ...
    @property
    def used_slots(self) -> int: ...
    @property
    def total_slots(self) -> int: ...
    @property
    def used_memory_mib(self) -> int: ...
    @property
    def total_memory_mib(self) -> int: ...
    @property
    def used_cores(self) -> int: ...
    @property
    def total_cores(self) -> int: ...


DeviceSource = Callable[[], Sequence[DeviceRow]]
#: namespace -> resource -> (used, limit), as ``ClusterState.quota_usage`` returns it.
QuotaSource = Callable[[], Mapping[str, Mapping[str, tuple[int, int]]]]


class _StateCollector(Collector):
    """Reads the engine's books at scrape time."""

    def __init__(self) -> None:
        self.devices: DeviceSource | None = None
        self.quotas: QuotaSource | None = None
        #: A copy of both, read on the event loop, which a scrape formats in a thread.
        self.copied: (
            tuple[Sequence[DeviceRow], Mapping[str, Mapping[str, tuple[int, int]]]] | None
        ) = None

    def describe(self) -> Iterable[Metric]:
        # Registering must not call the sources (the engine may not exist yet).
        return []

    def collect(self) -> Iterator[Metric]:
        yield from self._device_metrics()
        yield from self._quota_metrics()

    def _device_metrics(self) -> Iterator[Metric]:
        labels = ["node", "device", "vendor", "type"]
        families = {
            "memory_allocated": GaugeMetricFamily(
                f"{PREFIX}_device_memory_allocated_bytes",
                "Device memory booked by pods on this card.",
                labels=labels,
            ),
            # Capacities are gauges: no `_total` suffix, which means a counter.
            "memory_total": GaugeMetricFamily(
                f"{PREFIX}_device_memory_capacity_bytes",
                "Device memory this card registers (after memory scaling).",
                labels=labels,
            ),
            "cores_allocated": GaugeMetricFamily(
                f"{PREFIX}_device_cores_allocated_ratio",
                "Compute booked on this card, in whole cards (1.0 = 100 cores).",
                labels=labels,
            ),
            "cores_total": GaugeMetricFamily(
                f"{PREFIX}_device_cores_capacity_ratio",
                "Compute this card registers, in whole cards (after core scaling).",
                labels=labels,
            ),
            "slots_allocated": GaugeMetricFamily(
                f"{PREFIX}_device_shares_allocated",
                "Pod containers sharing this card.",
                labels=labels,
            ),
            "slots_total": GaugeMetricFamily(
                f"{PREFIX}_device_shares_capacity",
                "Pod containers this card may hold (deviceSplitCount).",
                labels=labels,
            ),
        }
        if self.copied is not None:
            rows = self.copied[0]
        else:
            rows = self.devices() if self.devices is not None else []
        for row in rows:
            values = [row.node, row.uuid, row.vendor, row.type]
            families["memory_allocated"].add_metric(values, row.used_memory_mib * MIB_BYTES)
            families["memory_total"].add_metric(values, row.total_memory_mib * MIB_BYTES)
            families["cores_allocated"].add_metric(values, row.used_cores / CORES_PER_CARD)
            families["cores_total"].add_metric(values, row.total_cores / CORES_PER_CARD)
            families["slots_allocated"].add_metric(values, row.used_slots)
            families["slots_total"].add_metric(values, row.total_slots)
        yield from families.values()

    def _quota_metrics(self) -> Iterator[Metric]:
        used = GaugeMetricFamily(
            f"{PREFIX}_quota_used",
            "Device resources booked in a namespace, in the quota's own units.",
            labels=["namespace", "resource"],
        )
        limit = GaugeMetricFamily(
            f"{PREFIX}_quota_limit",
            "The namespace's ResourceQuota limit for a device resource; no series where "
            "there is no limit, so `used > limit` alerts only where a limit exists.",
            labels=["namespace", "resource"],
        )
        if self.copied is not None:
            table = self.copied[1]
        else:
            table = self.quotas() if self.quotas is not None else {}
        for namespace, resources in sorted(table.items()):
            for resource, (used_value, limit_value) in sorted(resources.items()):
                used.add_metric([namespace, resource], used_value)
                if limit_value > 0:  # the engine's 0 means "no limit", not "nothing allowed"
                    limit.add_metric([namespace, resource], limit_value)
        yield used
        yield limit


class OperatorMetrics:
    """All metrics of one operator process (see the module docstring)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._attempts = Counter(
            f"{PREFIX}_scheduling_attempts",
            "Scheduling attempts, by result.",
            ["result"],
            registry=self.registry,
        )
        self._decision = Histogram(
            f"{PREFIX}_decision_duration_seconds",
            "Time the engine took to decide for one pod.",
            buckets=_LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self._bind = Histogram(
            f"{PREFIX}_bind_duration_seconds",
            "Time the Binding write took (request to answer).",
            buckets=_LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self._pending = Gauge(
            f"{PREFIX}_pending_pods",
            "Pods waiting for this scheduler (queued, backing off or parked).",
            registry=self.registry,
        )
        self._parked = Gauge(
            f"{PREFIX}_unschedulable_pods",
            "Pending pods that did not fit and wait for a change in the cluster.",
            registry=self.registry,
        )
        self._config_rejected = Counter(
            f"{PREFIX}_config_rejections",
            "Device configurations refused as invalid (the last good one stays).",
            registry=self.registry,
        )
        self._not_routed = Counter(
            f"{PREFIX}_gpu_pods_not_routed",
            "GPU pods found on the default scheduler (created while the webhook was down).",
            registry=self.registry,
        )
        self._leader = Gauge(
            f"{PREFIX}_leader",
            "1 while this replica makes decisions, 0 while it stands by.",
            registry=self.registry,
        )
        self._create_to_bound = Histogram(
            f"{PREFIX}_pod_create_to_bound_seconds",
            "From a pod's creationTimestamp to its Binding: what a user waits, queueing "
            "and waiting for room included (second resolution, from the API server).",
            buckets=_CREATE_TO_BOUND_BUCKETS_S,
            registry=self.registry,
        )
        self._webhook_requests = Counter(
            f"{PREFIX}_webhook_requests",
            "Admission requests the webhook answered, by result.",
            ["result"],
            registry=self.registry,
        )
        self._webhook_duration = Histogram(
            f"{PREFIX}_webhook_duration_seconds",
            "Time the webhook took to answer one admission request.",
            buckets=_LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self._api_errors = Counter(
            f"{PREFIX}_api_errors",
            "Failed requests to the Kubernetes API, by what was being done.",
            ["operation"],
            registry=self.registry,
        )
        for result in Result:
            self._attempts.labels(result=result.value)
        for answer in WebhookResult:
            self._webhook_requests.labels(result=answer.value)
        # process_cpu_seconds_total, process_resident_memory_bytes, open fds...
        ProcessCollector(registry=self.registry)
        self._state = _StateCollector()
        self.registry.register(self._state)
        self._rendering = asyncio.Lock()

    # --- recording, by intent -----------------------------------------------------------
    def attempt(self, result: Result) -> None:
        self._attempts.labels(result=result.value).inc()

    def decided(self, duration_s: float) -> None:
        self._decision.observe(duration_s)

    def bind_finished(self, duration_s: float) -> None:
        self._bind.observe(duration_s)

    def queue_size(self, pending: int, parked: int) -> None:
        self._pending.set(pending)
        self._parked.set(parked)

    def config_rejected(self) -> None:
        self._config_rejected.inc()

    def bound_after(self, seconds_since_creation: float) -> None:
        self._create_to_bound.observe(max(0.0, seconds_since_creation))

    def webhook_answered(self, result: WebhookResult, duration_s: float) -> None:
        self._webhook_requests.labels(result=result.value).inc()
        self._webhook_duration.observe(duration_s)

    def api_error(self, operation: str) -> None:
        """A failed API request; ``operation`` is one of a few fixed words (bounded)."""
        self._api_errors.labels(operation=operation).inc()

    def not_routed(self) -> None:
        self._not_routed.inc()

    def leadership(self, active: bool) -> None:
        self._leader.set(1 if active else 0)

    def read_state_from(self, devices: DeviceSource, quotas: QuotaSource) -> None:
        """Where the scrape-time collector reads per-device and per-quota figures."""
        self._state.devices = devices
        self._state.quotas = quotas

    # --- exposition ---------------------------------------------------------------------
    def render(self) -> tuple[bytes, str]:
        """The text exposition format and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    async def render_beside_the_loop(self) -> tuple[bytes, str]:
        """``render`` for the event loop's /metrics: the engine's figures are copied here,
        on the loop, and formatted in a thread, so a scrape does not stop scheduling
        for as long as thousands of cards' series take to format."""
        async with self._rendering:
            state = self._state
            rows = list(state.devices()) if state.devices is not None else []
            quotas = (
                {ns: dict(usage) for ns, usage in state.quotas().items()}
                if state.quotas is not None
                else {}
            )
            state.copied = (rows, quotas)
            try:
                return await asyncio.to_thread(self.render)
            finally:
                state.copied = None
