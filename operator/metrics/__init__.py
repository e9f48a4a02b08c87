"""The operator's Prometheus metrics, recorded through functions named by intent.

Every metric lives in one ``OperatorMetrics`` object with its own registry (no global
registration on import, so tests and two operators in one process do not collide).
The engine's figures (per card, per namespace quota, the queue's census, stranded memory)
are read at scrape time (``engine_figures``), never pushed. A scrape is answered on the
serving loop, apart from the scheduling loop (``control/scheduling_thread.py``), but
copies the books on the scheduling loop, the thread that changes them, so the reads need
no lock (and a scheduling loop that does not answer in time gets the last copy served);
the text is formatted in a thread on that copy, so decisions go on meanwhile. The names
and closed label sets are in ``labels``; ``docs/operations.md`` lists every family, its
labels and how many series a cluster of a given size has.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.core import Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from vgpu_operator.metrics.autoscale import AutoscaleMetrics
from vgpu_operator.metrics.engine_figures import (
    ENGINE_COPY_TIMEOUT_S,
    NOTHING_WAITING,
    Collected,
    DeviceRow,
    DeviceSource,
    DeviceText,
    EngineFigures,
    LearnedSource,
    QuotaSource,
    QuotaTable,
    StateCollector,
    StrandedSource,
    WaitingFigures,
    WaitingSource,
    quota_families,
    waiting_families,
)
from vgpu_operator.metrics.labels import (
    API_OPERATIONS,
    CREATE_TO_BOUND_BUCKETS_S,
    LATENCY_BUCKETS_S,
    PREFIX,
    VICTIM_BUCKETS,
    DefragFailure,
    DefragMove,
    OtherReason,
    PreemptionResult,
    Result,
    WebhookResult,
)

__all__ = [
    "ENGINE_COPY_TIMEOUT_S",
    "DefragFailure",
    "DefragMetrics",
    "DefragMove",
    "DeviceRow",
    "OperatorMetrics",
    "OtherReason",
    "PreemptionResult",
    "Result",
    "WebhookResult",
]


class OperatorMetrics:
    """All metrics of one operator process (see the module docstring)."""

    def __init__(self) -> None:
        # The process's own series; ``registry`` adds the engine's figures after them.
        self._own = CollectorRegistry(auto_describe=True)
        self._add_decision_series()
        self._add_service_series()
        # process_cpu_seconds_total, process_resident_memory_bytes, open fds...
        ProcessCollector(registry=self._own)
        self._defrag: DefragMetrics | None = None
        self._autoscale: AutoscaleMetrics | None = None
        self._engine_loop: asyncio.AbstractEventLoop | None = None
        self._last_copy: EngineFigures = ([], {}, NOTHING_WAITING)
        self._stale = Gauge(
            f"{PREFIX}_engine_figures_stale",
            "1 when the last scrape served the engine's figures of an earlier scrape (the "
            "scheduling loop did not answer in time), else 0.",
            registry=self._own,
        )
        self._state = StateCollector()
        #: Everything, for ``render`` and lookups by sample name.
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(Collected(self._own.collect))
        self.registry.register(self._state)
        self._device_text = DeviceText()
        self._rendering = asyncio.Lock()

    def _add_decision_series(self) -> None:
        """The scheduling decisions' series: attempts, latencies, preemptions."""
        own = self._own
        self._attempts = _counter(
            own, "scheduling_attempts", "Scheduling attempts, by result.", "result", Result
        )
        self._decision = _histogram(
            own,
            "decision_duration_seconds",
            "Time the engine took to decide for one pod.",
            LATENCY_BUCKETS_S,
        )
        self._bind = _histogram(
            own,
            "bind_duration_seconds",
            "Time the Binding write took (request to answer).",
            LATENCY_BUCKETS_S,
        )
        # kube-scheduler's pair: preemption_attempts_total and preemption_victims.
        self._preemptions = _counter(
            own,
            "preemption_attempts",
            "Preemptions started (victims chosen and being evicted), by how they ended.",
            "result",
            PreemptionResult,
        )
        self._victims = _histogram(
            own, "preemption_victims", "Pods chosen as victims by one preemption.", VICTIM_BUCKETS
        )
        # The DRA dialect's decisions that chose victims (issue 35's aim is on these).
        self._dra_preemption_decision = _histogram(
            own,
            "dra_preemption_decision_seconds",
            "Time the engine took for one decision that chose victims for a pod with claims.",
            LATENCY_BUCKETS_S,
        )

    def _add_service_series(self) -> None:
        """The series of the operator as a service: config, webhook, API errors,
        leadership, what a user waits."""
        own = self._own
        self._config_rejected = _counter(
            own,
            "config_rejections",
            "Device configurations refused as invalid (the last good one stays).",
        )
        self._not_routed = _counter(
            own,
            "gpu_pods_not_routed",
            "GPU pods found on the default scheduler (created while the webhook was down).",
        )
        self._leader = Gauge(
            f"{PREFIX}_leader",
            "1 while this replica makes decisions, 0 while it stands by.",
            registry=own,
        )
        self._create_to_bound = _histogram(
            own,
            "pod_create_to_bound_seconds",
            "From a pod's creationTimestamp to its Binding: what a user waits, queueing "
            "and waiting for room included (second resolution, from the API server).",
            CREATE_TO_BOUND_BUCKETS_S,
        )
        self._webhook_requests = _counter(
            own,
            "webhook_requests",
            "Admission requests the webhook answered, by result.",
            "result",
            WebhookResult,
        )
        self._webhook_duration = _histogram(
            own,
            "webhook_duration_seconds",
            "Time the webhook took to answer one admission request.",
            LATENCY_BUCKETS_S,
        )
        self._api_errors = _counter(
            own,
            "api_errors",
            "Failed requests to the Kubernetes API, by what was being done.",
            "operation",
            API_OPERATIONS,
        )

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

    def autoscale(self) -> AutoscaleMetrics:
        """The autoscaler's series (``metrics.autoscale``), registered once."""
        if self._autoscale is None:
            self._autoscale = AutoscaleMetrics(self._own)
        return self._autoscale

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

    def _copy_engine_figures(self) -> EngineFigures:
        """The engine's figures, copied (call on the loop that changes them)."""
        state = self._state
        rows = list(state.devices()) if state.devices is not None else []
        quotas = (
            {ns: dict(usage) for ns, usage in state.quotas().items()}
            if state.quotas is not None
            else {}
        )
        return rows, quotas, state.read_waiting()

    async def _engine_figures(self) -> EngineFigures:
        loop = self._engine_loop
        if loop is None or loop is asyncio.get_running_loop():
            return self._copy_engine_figures()

        async def copy() -> EngineFigures:
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
        self, rows: Sequence[DeviceRow], quotas: QuotaTable, waiting: WaitingFigures
    ) -> tuple[bytes, str]:
        def engine_families() -> Iterator[Metric]:
            yield from quota_families(quotas)
            yield from waiting_families(waiting)

        body = b"".join(
            (
                generate_latest(self._own),
                self._device_text.render(rows).encode(),
                generate_latest(Collected(engine_families)),
            )
        )
        return body, CONTENT_TYPE_LATEST


class DefragMetrics:
    """Defragmentation's counters, among the operator's own series (they exist, at 0,
    whether or not ``--defrag`` is on)."""

    def __init__(self, metrics: OperatorMetrics) -> None:
        registry = metrics._own
        self._plans = _counter(
            registry,
            "defrag_plans",
            "Defragmentation plans: started, and how they ended (succeeded or stopped).",
            "result",
            ("started", "succeeded", "stopped"),
        )
        self._moves = _counter(
            registry,
            "defrag_moves",
            "Evictions asked by defragmentation plans, by result.",
            "result",
            DefragMove,
        )
        self._failures = _counter(
            registry,
            "defrag_failures",
            "Defragmentation plans stopped, by reason.",
            "reason",
            DefragFailure,
        )

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


def _counter(
    registry: CollectorRegistry,
    name: str,
    documentation: str,
    label: str | None = None,
    values: Iterable[str] = (),
) -> Counter:
    """The counter ``vgpu_operator_<name>_total``, by its one ``label`` if any, each of
    its ``values`` exported from 0 (so a rate over them is 0, not absent)."""
    counter = Counter(
        f"{PREFIX}_{name}", documentation, [] if label is None else [label], registry=registry
    )
    for value in values:
        counter.labels(**{str(label): str(value)})
    return counter


def _histogram(
    registry: CollectorRegistry, name: str, documentation: str, buckets: Sequence[float]
) -> Histogram:
    """The histogram ``vgpu_operator_<name>``."""
    return Histogram(f"{PREFIX}_{name}", documentation, buckets=buckets, registry=registry)
