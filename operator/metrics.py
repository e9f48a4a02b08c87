"""The operator's Prometheus metrics, recorded through functions named by intent.

Every metric lives in one ``OperatorMetrics`` object with its own registry (no global
registration on import, so tests and two operators in one process do not collide).
Per-device and per-namespace figures are not pushed: a collector reads them from the
engine at scrape time, through callables handed in by the operator, so they can never
drift from the engine's books. A scrape is answered on the serving loop, apart from the
scheduling loop (``control/scheduling_thread.py``), but copies the books on the
scheduling loop, the thread that changes them, so the reads need no lock (and a
scheduling loop that does not answer in time gets the last copy served); the text is
formatted in a thread on that copy, so decisions go on meanwhile. The six per-card series are the
bulk of a scrape (48,000 lines at 8,000 cards, half a second through the generic
formatter, holding the GIL): they are written directly, with each card's label set kept
between scrapes. The queue's census and the stranded memory per node are read the same
way, at scrape time. ``docs/operations.md`` lists every family, its labels and how many
series a cluster of a given size has.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Protocol, cast

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from vgpu_operator.scheduling.status import Reason

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


class PreemptionResult(enum.StrEnum):
    """How a preemption ended (the ``result`` label of ``preemption_attempts_total``)."""

    EVICTED = "evicted"  # every victim evicted (or already gone): the preemptor waits for them
    REFUSED = "refused"  # an eviction was refused (a PodDisruptionBudget): given up
    ERROR = "error"  # an API request failed: given up, tried again after the backoff


class OtherReason(enum.StrEnum):
    """``unschedulable_pods`` reasons of pods whose condition names no node reason."""

    ADMISSION_REJECTED = "AdmissionRejected"  # admission refuses the pod; its message says why
    INVALID_REQUEST = "InvalidRequest"  # a request or annotation that cannot be read
    NO_NODES = "NoNodes"  # no node was there to try
    SCHEDULING_ERROR = "SchedulingError"  # the engine failed on the pod


#: Every ``reason`` label value: the node reasons of the ``PodScheduled`` condition's
#: message (``0/3 nodes are available: 2 CardInsufficientMemory, ...``), then the others.
UNSCHEDULABLE_REASONS: Final = (*(r.value for r in Reason), *(r.value for r in OtherReason))

#: The ``operation`` label values of ``api_errors_total``, each exported from 0 (so a rate
#: over them is 0, not absent, while nothing fails). The callers name these words only.
API_OPERATIONS: Final = (
    "bind",
    "evict",
    "report",
    "pod_read",
    "resync",
    "config_watch",
    "pod_watch",
    "node_watch",
    "inventory_watch",
    "lease_watch",
    "quota_watch",
    "budget_watch",
    "webhook_tls",
    # Kueue's AdmissionCheck (--kueue-placeable-check): its watches, its status writes.
    "kueue_watch",
    "kueue_check",
)

#: kube-scheduler's buckets for its preemption_victims histogram.
_VICTIM_BUCKETS: Final = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)

#: Pod creation to Binding: seconds to minutes (pods may wait for room).
_CREATE_TO_BOUND_BUCKETS_S: Final = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


class DeviceRow(Protocol):
    """What the collector reads per card (``scheduling.cycle.cluster.DeviceUsageRow``)."""

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
#: (pods per queue name, parked pods per reason code), as the scheduling queue counts them.
WaitingSource = Callable[[], tuple[Mapping[str, int], Mapping[str, int]]]
#: node -> stranded card memory in MiB (``scheduling.policies.stranded``).
StrandedSource = Callable[[], Mapping[str, int]]
#: What the fragmentation policy has learned: per GPU shape's labels, its share.
LearnedSource = Callable[[], Mapping[tuple[str, str, str, str], float]]


@dataclass(frozen=True, slots=True)
class _DeviceFamily:
    name: str
    documentation: str
    value: Callable[[DeviceRow], float]


#: prometheus_client's own number formatting (untyped there), so both paths agree.
_number_text = cast(Callable[[float], str], floatToGoString)

_DEVICE_LABELS: Final = ("node", "device", "vendor", "type")
_DEVICE_FAMILIES: Final = (
    _DeviceFamily(
        f"{PREFIX}_device_memory_allocated_bytes",
        "Device memory booked by pods on this card.",
        lambda row: row.used_memory_mib * MIB_BYTES,
    ),
    # Capacities are gauges: no `_total` suffix, which means a counter.
    _DeviceFamily(
        f"{PREFIX}_device_memory_capacity_bytes",
        "Device memory this card registers (after memory scaling).",
        lambda row: row.total_memory_mib * MIB_BYTES,
    ),
    _DeviceFamily(
        f"{PREFIX}_device_cores_allocated_ratio",
        "Compute booked on this card, in whole cards (1.0 = 100 cores).",
        lambda row: row.used_cores / CORES_PER_CARD,
    ),
    _DeviceFamily(
        f"{PREFIX}_device_cores_capacity_ratio",
        "Compute this card registers, in whole cards (after core scaling).",
        lambda row: row.total_cores / CORES_PER_CARD,
    ),
    _DeviceFamily(
        f"{PREFIX}_device_shares_allocated",
        "Pod containers sharing this card.",
        lambda row: row.used_slots,
    ),
    _DeviceFamily(
        f"{PREFIX}_device_shares_capacity",
        "Pod containers this card may hold (deviceSplitCount).",
        lambda row: row.total_slots,
    ),
)


def _label_value(text: str) -> str:
    """A label value escaped for the text format (node names and models come from
    inventories, which anyone with write access could fill with quotes or newlines)."""
    return text.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


class _DeviceText:
    """The per-card series as exposition text, written directly.

    Produces what prometheus_client's own formatter writes for the same families (a
    unit test holds the two equal) at a fraction of its cost. Each card's escaped label
    set is kept between scrapes (cards come and go rarely; their figures change often),
    and a number's text is made once per scrape however many cards share it.
    """

    def __init__(self) -> None:
        self._labels: dict[tuple[str, str, str, str], str] = {}

    def render(self, rows: Iterable[DeviceRow]) -> str:
        kept = self._labels
        labels_now: dict[tuple[str, str, str, str], str] = {}
        numbers: dict[float, str] = {}
        columns: list[list[str]] = [[] for _ in _DEVICE_FAMILIES]
        for row in rows:
            key = (row.node, row.uuid, row.vendor, row.type)
            labels = kept.get(key) or labels_now.get(key) or _card_labels(row)
            labels_now[key] = labels
            for column, family in zip(columns, _DEVICE_FAMILIES, strict=True):
                value = family.value(row)
                text = numbers.get(value)
                if text is None:
                    text = numbers[value] = _number_text(value)
                column.append(f"{family.name}{labels} {text}\n")
        self._labels = labels_now
        parts: list[str] = []
        for family, column in zip(_DEVICE_FAMILIES, columns, strict=True):
            parts.append(_header(family.name, family.documentation, "gauge"))
            parts.extend(column)
        return "".join(parts)


def _card_labels(row: DeviceRow) -> str:
    # The text format lists labels sorted by name: device, node, type, vendor.
    return (
        f'{{device="{_label_value(row.uuid)}",node="{_label_value(row.node)}",'
        f'type="{_label_value(row.type)}",vendor="{_label_value(row.vendor)}"}}'
    )


def _header(name: str, documentation: str, kind: str) -> str:
    help_text = documentation.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n"


QuotaTable = Mapping[str, Mapping[str, tuple[int, int]]]


def _quota_families(table: QuotaTable) -> Iterator[Metric]:
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
    for namespace, resources in sorted(table.items()):
        for resource, (used_value, limit_value) in sorted(resources.items()):
            used.add_metric([namespace, resource], used_value)
            if limit_value > 0:  # the engine's 0 means "no limit", not "nothing allowed"
                limit.add_metric([namespace, resource], limit_value)
    yield used
    yield limit


#: How long a scrape waits for the scheduling loop to copy the engine's figures.
ENGINE_COPY_TIMEOUT_S: Final = 2.0


@dataclass(frozen=True, slots=True)
class _Waiting:
    """A copy of the queue's census, the stranded memory and what the fragmentation
    policy has learned, taken on the loop."""

    queues: Mapping[str, int]
    reasons: Mapping[str, int]
    stranded_mib: Mapping[str, int]
    learned: Mapping[tuple[str, str, str, str], float] = field(default_factory=dict)


_NOTHING_WAITING: Final = _Waiting({}, {}, {})
#: The engine's figures as a scrape copies them: per-device rows, quota usage, waiting.
_EngineFigures = tuple[list["DeviceRow"], "QuotaTable", _Waiting]


def _waiting_families(waiting: _Waiting) -> Iterator[Metric]:
    pending = GaugeMetricFamily(
        f"{PREFIX}_pending_pods",
        "Pods waiting for this scheduler, by queue: active (due now), backoff (waiting "
        "for their backoff to end), unschedulable (did not fit; wait for a change).",
        labels=["queue"],
    )
    for queue, count in sorted(waiting.queues.items()):
        pending.add_metric([queue], count)
    unschedulable = GaugeMetricFamily(
        f"{PREFIX}_unschedulable_pods",
        "Unschedulable pods by the reason codes of their PodScheduled condition; a pod "
        "whose message names several reasons counts under each.",
        labels=["reason"],
    )
    known = dict.fromkeys(UNSCHEDULABLE_REASONS, 0)
    for reason, count in waiting.reasons.items():
        if reason in known:  # a closed set: nothing from outside becomes a label
            known[reason] = count
    for reason, count in known.items():
        unschedulable.add_metric([reason], count)
    stranded = GaugeMetricFamily(
        f"{PREFIX}_stranded_memory_bytes",
        "Free card memory on the node that no pending request could use (0 while no "
        "GPU pod is pending); defined in docs/operations.md.",
        labels=["node"],
    )
    for node, mib in sorted(waiting.stranded_mib.items()):
        stranded.add_metric([node], mib * MIB_BYTES)
    learned = GaugeMetricFamily(
        f"{PREFIX}_fragmentation_learned_share",
        "The share of recent requests of each GPU shape (vendor, cards, memory per card, "
        "cores per card), as the fragmentation policy weighs them (a prior of common "
        "sizes, fading as pods are seen); at most 48 shapes.",
        labels=["vendor", "cards", "memory", "cores"],
    )
    for labels, share in sorted(waiting.learned.items()):
        learned.add_metric(list(labels), share)
    yield pending
    yield unschedulable
    yield stranded
    yield learned


class _StateCollector(Collector):
    """Reads the engine's books at scrape time (for ``render`` and sample lookups;
    the /metrics endpoint goes through ``OperatorMetrics.render_beside_the_loop``)."""

    def __init__(self) -> None:
        self.devices: DeviceSource | None = None
        self.quotas: QuotaSource | None = None
        self.waiting: WaitingSource | None = None
        self.stranded: StrandedSource | None = None
        self.learned: LearnedSource | None = None

    def read_waiting(self) -> _Waiting:
        """The census, stranded memory and learned mix, copied (call on the engine's
        thread)."""
        queues: Mapping[str, int] = {}
        reasons: Mapping[str, int] = {}
        if self.waiting is not None:
            queues, reasons = self.waiting()
        stranded = self.stranded() if self.stranded is not None else {}
        learned = self.learned() if self.learned is not None else {}
        if not (queues or reasons or stranded or learned):
            return _NOTHING_WAITING
        return _Waiting(dict(queues), dict(reasons), dict(stranded), dict(learned))

    def describe(self) -> Iterable[Metric]:
        # Registering must not call the sources (the engine may not exist yet).
        return []

    def collect(self) -> Iterator[Metric]:
        families = [
            GaugeMetricFamily(f.name, f.documentation, labels=list(_DEVICE_LABELS))
            for f in _DEVICE_FAMILIES
        ]
        for row in self.devices() if self.devices is not None else []:
            values = [row.node, row.uuid, row.vendor, row.type]
            for family, spec in zip(families, _DEVICE_FAMILIES, strict=True):
                family.add_metric(values, spec.value(row))
        yield from families
        yield from _quota_families(self.quotas() if self.quotas is not None else {})
        yield from _waiting_families(self.read_waiting())


class _Collected(Collector):
    """Metric families already collected (a registry's, or a copy), for formatting."""

    def __init__(self, collect: Callable[[], Iterable[Metric]]) -> None:
        self._collect = collect

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        return self._collect()


class OperatorMetrics:
    """All metrics of one operator process (see the module docstring)."""

    def __init__(self) -> None:
        # The process's own series; ``registry`` adds the engine's figures after them.
        self._own = CollectorRegistry(auto_describe=True)
        self._attempts = Counter(
            f"{PREFIX}_scheduling_attempts",
            "Scheduling attempts, by result.",
            ["result"],
            registry=self._own,
        )
        self._decision = Histogram(
            f"{PREFIX}_decision_duration_seconds",
            "Time the engine took to decide for one pod.",
            buckets=_LATENCY_BUCKETS_S,
            registry=self._own,
        )
        self._bind = Histogram(
            f"{PREFIX}_bind_duration_seconds",
            "Time the Binding write took (request to answer).",
            buckets=_LATENCY_BUCKETS_S,
            registry=self._own,
        )
        # kube-scheduler's pair: preemption_attempts_total and preemption_victims.
        self._preemptions = Counter(
            f"{PREFIX}_preemption_attempts",
            "Preemptions started (victims chosen and being evicted), by how they ended.",
            ["result"],
            registry=self._own,
        )
        self._victims = Histogram(
            f"{PREFIX}_preemption_victims",
            "Pods chosen as victims by one preemption.",
            buckets=_VICTIM_BUCKETS,
            registry=self._own,
        )
        # The DRA dialect's decisions that chose victims (issue 35's aim is on these).
        self._dra_preemption_decision = Histogram(
            f"{PREFIX}_dra_preemption_decision_seconds",
            "Time the engine took for one decision that chose victims for a pod with claims.",
            buckets=_LATENCY_BUCKETS_S,
            registry=self._own,
        )
        self._config_rejected = Counter(
            f"{PREFIX}_config_rejections",
            "Device configurations refused as invalid (the last good one stays).",
            registry=self._own,
        )
        self._not_routed = Counter(
            f"{PREFIX}_gpu_pods_not_routed",
            "GPU pods found on the default scheduler (created while the webhook was down).",
            registry=self._own,
        )
        self._leader = Gauge(
            f"{PREFIX}_leader",
            "1 while this replica makes decisions, 0 while it stands by.",
            registry=self._own,
        )
        self._create_to_bound = Histogram(
            f"{PREFIX}_pod_create_to_bound_seconds",
            "From a pod's creationTimestamp to its Binding: what a user waits, queueing "
            "and waiting for room included (second resolution, from the API server).",
            buckets=_CREATE_TO_BOUND_BUCKETS_S,
            registry=self._own,
        )
        self._webhook_requests = Counter(
            f"{PREFIX}_webhook_requests",
            "Admission requests the webhook answered, by result.",
            ["result"],
            registry=self._own,
        )
        self._webhook_duration = Histogram(
            f"{PREFIX}_webhook_duration_seconds",
            "Time the webhook took to answer one admission request.",
            buckets=_LATENCY_BUCKETS_S,
            registry=self._own,
        )
        self._api_errors = Counter(
            f"{PREFIX}_api_errors",
            "Failed requests to the Kubernetes API, by what was being done.",
            ["operation"],
            registry=self._own,
        )
        for result in Result:
            self._attempts.labels(result=result.value)
        for answer in WebhookResult:
            self._webhook_requests.labels(result=answer.value)
        for ending in PreemptionResult:
            self._preemptions.labels(result=ending.value)
        for operation in API_OPERATIONS:
            self._api_errors.labels(operation=operation)
        # process_cpu_seconds_total, process_resident_memory_bytes, open fds...
        ProcessCollector(registry=self._own)
        self._defrag: DefragMetrics | None = None
        self._engine_loop: asyncio.AbstractEventLoop | None = None
        self._last_copy: _EngineFigures = ([], {}, _NOTHING_WAITING)
        self._stale = Gauge(
            f"{PREFIX}_engine_figures_stale",
            "1 when the last scrape served the engine's figures of an earlier scrape (the "
            "scheduling loop did not answer in time), else 0.",
            registry=self._own,
        )
        self._state = _StateCollector()
        #: Everything, for ``render`` and lookups by sample name.
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_Collected(self._own.collect))
        self.registry.register(self._state)
        self._device_text = _DeviceText()
        self._rendering = asyncio.Lock()

    # --- recording, by intent -----------------------------------------------------------
    def attempt(self, result: Result) -> None:
        self._attempts.labels(result=result.value).inc()

    def decided(self, duration_s: float) -> None:
        self._decision.observe(duration_s)

    def dra_preemption_decided(self, duration_s: float) -> None:
        """A decision for a pod with claims that chose victims took ``duration_s``."""
        self._dra_preemption_decision.observe(duration_s)

    def bind_finished(self, duration_s: float) -> None:
        self._bind.observe(duration_s)

    def preemption(self, result: PreemptionResult, victims: int) -> None:
        """One preemption that chose ``victims`` pods ended with ``result``."""
        self._preemptions.labels(result=result.value).inc()
        self._victims.observe(victims)

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

    def defrag(self) -> DefragMetrics:
        """Defragmentation's counters, registered once however often an operator is
        assembled on these metrics (a start-up retried)."""
        if self._defrag is None:
            self._defrag = DefragMetrics(self)
        return self._defrag

    def leadership(self, active: bool) -> None:
        self._leader.set(1 if active else 0)

    def read_state_from(
        self,
        devices: DeviceSource,
        quotas: QuotaSource,
        *,
        waiting: WaitingSource | None = None,
        stranded: StrandedSource | None = None,
        learned: LearnedSource | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        """Where the scrape-time collector reads per-device, per-quota, queue and
        stranded-memory figures, and the event loop that changes them (None: the one
        that scrapes)."""
        self._state.devices = devices
        self._state.quotas = quotas
        self._state.waiting = waiting
        self._state.stranded = stranded
        self._state.learned = learned
        self._engine_loop = loop

    # --- exposition ---------------------------------------------------------------------
    def render(self) -> tuple[bytes, str]:
        """The text exposition format and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    async def render_beside_the_loop(self) -> tuple[bytes, str]:
        """``render`` for /metrics: the engine's figures are copied on the loop that
        changes them (the scheduling loop, which the server does not run on) and
        formatted in a thread, so a scrape neither stops scheduling nor waits for it
        long: when the scheduling loop does not answer within ``ENGINE_COPY_TIMEOUT_S``,
        the last copy is served (``vgpu_operator_engine_figures_stale`` says so)."""
        async with self._rendering:
            copied = await self._engine_figures()
            return await asyncio.to_thread(self._render_copy, *copied)

    def _copy_engine_figures(self) -> _EngineFigures:
        """The engine's figures, copied (call on the loop that changes them)."""
        state = self._state
        rows = list(state.devices()) if state.devices is not None else []
        quotas = (
            {ns: dict(usage) for ns, usage in state.quotas().items()}
            if state.quotas is not None
            else {}
        )
        return rows, quotas, state.read_waiting()

    async def _engine_figures(self) -> _EngineFigures:
        loop = self._engine_loop
        if loop is None or loop is asyncio.get_running_loop():
            return self._copy_engine_figures()

        async def copy() -> _EngineFigures:
            return self._copy_engine_figures()

        future = asyncio.run_coroutine_threadsafe(copy(), loop)
        try:
            copied = await asyncio.wait_for(asyncio.wrap_future(future), ENGINE_COPY_TIMEOUT_S)
        except (TimeoutError, RuntimeError):
            future.cancel()
            self._stale.set(1)
            return self._last_copy
        self._stale.set(0)
        self._last_copy = copied
        return copied

    def _render_copy(
        self, rows: Sequence[DeviceRow], quotas: QuotaTable, waiting: _Waiting
    ) -> tuple[bytes, str]:
        def engine_families() -> Iterator[Metric]:
            yield from _quota_families(quotas)
            yield from _waiting_families(waiting)

        body = b"".join(
            (
                generate_latest(self._own),
                self._device_text.render(rows).encode(),
                generate_latest(_Collected(engine_families)),
            )
        )
        return body, CONTENT_TYPE_LATEST


# --- defragmentation ------------------------------------------------------------------------


class DefragMove(enum.StrEnum):
    """What became of one eviction of a plan (the ``result`` label; a closed set)."""

    EVICTED = "evicted"
    REFUSED = "refused"  # a PodDisruptionBudget allowed no disruption
    GONE = "gone"  # the pod was gone before its eviction


class DefragFailure(enum.StrEnum):
    """Why a plan stopped (the ``reason`` label; a closed set)."""

    REFUSED = "refused"  # an eviction was refused
    GONE = "gone"  # a pod to move was gone before its eviction
    MISPLACED = "misplaced"  # a replacement was bound elsewhere than planned
    TIMEOUT = "timeout"  # a move, or the waiting pod's bind, took too long
    HOLD_LOST = "hold_lost"  # the hold timed out, the pod went, or leadership moved
    API_ERROR = "api_error"


class DefragMetrics:
    """Defragmentation's counters, among the operator's own series (they exist, at 0,
    whether or not ``--defrag`` is on)."""

    def __init__(self, metrics: OperatorMetrics) -> None:
        registry = metrics._own
        self._plans = Counter(
            f"{PREFIX}_defrag_plans",
            "Defragmentation plans: started, and how they ended (succeeded or stopped).",
            ["result"],
            registry=registry,
        )
        self._moves = Counter(
            f"{PREFIX}_defrag_moves",
            "Evictions asked by defragmentation plans, by result.",
            ["result"],
            registry=registry,
        )
        self._failures = Counter(
            f"{PREFIX}_defrag_failures",
            "Defragmentation plans stopped, by reason.",
            ["reason"],
            registry=registry,
        )
        for result in ("started", "succeeded", "stopped"):
            self._plans.labels(result=result)
        for move in DefragMove:
            self._moves.labels(result=move.value)
        for failure in DefragFailure:
            self._failures.labels(reason=failure.value)

    def plan_started(self) -> None:
        self._plans.labels(result="started").inc()

    def plan_succeeded(self) -> None:
        self._plans.labels(result="succeeded").inc()

    def plan_stopped(self) -> None:
        self._plans.labels(result="stopped").inc()

    def moved(self, result: DefragMove) -> None:
        self._moves.labels(result=result.value).inc()

    def failed(self, reason: DefragFailure) -> None:
        self._failures.labels(reason=reason.value).inc()
