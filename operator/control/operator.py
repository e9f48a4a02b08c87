"""The operator, assembled: the engine, its feed and watches, the queue, the worker, the
reporter, leadership and housekeeping, wired together and run on the scheduling loop.

Kopf runs the process around it (``handlers/app.py``: start-up and clean-up start and
stop it on a thread of its own, ``control/scheduling_thread.py``; the webhook, login,
peering and the HTTP server are served on Kopf's loop, apart from it); nothing here
knows Kopf. The kinds the engine reads (Pods, Nodes, DeviceInventories, ResourceQuotas,
PodDisruptionBudgets, the DRA kinds, cluster-wide; the node Leases in their namespace)
and the device-config ConfigMap are watched by one list-then-watch loop each
(``kube/watch_loop.py``; the table is ``watching``) that hands each event straight to the
feed: Kopf's per-event handler pipeline cost more than the decision itself in a burst
(``docs/architecture.md`` keeps that decision with its numbers). A failover's resync
lists every kind again through the same loops and handlers.

The webhook's answers are ``admission.PodAdmission``'s, from the engine's
``admission_view``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, cast

import structlog

from vgpu_operator import config as device_config
from vgpu_operator.control import (
    admission_checks,
    autoscale_catalogue,
    autoscaler,
    cel_offload,
    claim_binding,
    claims_feed,
    deferred,
    defrag,
    feed,
    gang_runtime,
    group_status,
    heap,
    leadership,
    not_routed,
    placeable_check,
    queue,
    reporting,
    scheduling_thread,
    template_collector,
    watching,
    webhook_tls,
    worker,
)
from vgpu_operator.control.options import AutoscaleOptions, OperatorOptions
from vgpu_operator.errors import ConfigError
from vgpu_operator.kube import (
    binder,
    claims,
    client,
    defrag_actions,
    karpenter,
    listing,
    peering,
    pod_groups,
    preemptor,
    watch_loop,
)
from vgpu_operator.kube import events as kube_events
from vgpu_operator.kube.requests import ApiClient
from vgpu_operator.metrics import OperatorMetrics
from vgpu_operator.scheduling.books.allocation_gate import GateMode
from vgpu_operator.scheduling.cycle import cluster
from vgpu_operator.scheduling.pod_key import pod_key
from vgpu_operator.wire import ConfigMap, KubeObject, WatchEventType, meta_of

log = structlog.get_logger("vgpu_operator.operator")

#: How often the housekeeping task refreshes gauges and checks inventory heartbeats.
_HOUSEKEEPING_S = 5.0
_RESYNC_RETRY_S = (1.0, 2.0, 5.0, 10.0, 30.0)
#: The longest the garbage collector stays off while the first listing comes in (the API
#: server may not answer for a while; retries make garbage of their own).
HEAP_HOLD_MAX_S = 120.0


def _read_catalogue(settings: AutoscaleOptions) -> autoscale_catalogue.Catalogue:
    """The instance types to autoscale with; a file that cannot be read is said in one
    log line and gives none (every waiting pod is then told no instance type holds it)."""
    try:
        return autoscale_catalogue.read_catalogue(settings.instance_types)
    except ConfigError as exc:
        log.error("autoscale_instance_types_unreadable", error=str(exc))
        return autoscale_catalogue.Catalogue(problems=(str(exc),))


def make_identity() -> str:
    """This replica's peering identity (the pod name in a cluster)."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class Operator:
    """See the module docstring. Built complete, by ``assemble`` (which makes the API
    client) or from a client; ``start`` spawns its tasks, ``stop`` ends them. Nothing is
    filled in later: until it exists, the webhook answers with ``admission.NotReady``."""

    def __init__(
        self,
        options: OperatorOptions,
        api: ApiClient,
        *,
        identity: str,
        priority: int,
        metrics: OperatorMetrics,
    ) -> None:
        self.options = options
        self.api = api
        self.identity = identity
        self.priority = priority
        self.metrics = metrics
        self.defrag_metrics = metrics.defrag()
        #: Set once every task runs (``/readyz``).
        self.started = asyncio.Event()
        #: Noted every second by the scheduling loop (``/healthz``, scheduling_thread).
        self.heartbeat = scheduling_thread.Heartbeat()
        self._assemble_engine(options, api, identity, priority)
        self._assemble_worker(options, api)
        self._assemble_watches(options, api)
        self._opened_before = False
        self._tasks: list[asyncio.Task[None]] = []
        self._forever: list[asyncio.Task[None]] = []  # must run as long as the process
        self._resync_lock = asyncio.Lock()
        #: GPU pods left to the default scheduler (the webhook was down), told once each.
        self._not_routed = not_routed.NotRoutedReporter(
            self.state, self.feed, self.reporter, metrics
        )

    def _assemble_engine(
        self, options: OperatorOptions, api: ApiClient, identity: str, priority: int
    ) -> None:
        """The engine, its queue and feeds, the reporter and the leadership gate."""
        self.state = cluster.ClusterState(
            device_config.DeviceConfig(), inventory_timeout_s=options.inventory_timeout_s
        )
        self.state.preemption_enabled = True
        self.state.gate_mode = options.allocation_gate
        self.state.gate_timeout_s = options.allocation_gate_timeout_s
        self.queue = queue.SchedulingQueue(
            initial_backoff_s=options.initial_backoff_s,
            max_backoff_s=options.max_backoff_s,
            flush_after_s=options.resync_interval_s,
            notify=lambda: self.worker.poke(),  # the worker is made below, before any pod
        )
        self.feed = feed.StateFeed(
            self.state,
            self.queue,
            config_key=options.config_key,
            inventory_timeout_s=options.inventory_timeout_s,
        )
        self.claim_feed = claims_feed.ClaimFeed(self.state, self.queue)
        # CEL selectors are evaluated off the event loop (control/cel_offload.py).
        self.selectors = cel_offload.OffLoopSelectors(
            self.state.selector_cache, self.queue.wake_one
        )
        # Scheduled Events wait while Bindings are being written (control/deferred.py).
        self.deferred = deferred.DeferredWrites()
        self.reporter = reporting.KubeReporter(
            api,
            aggregator=kube_events.EventAggregator(identity),
            scheduled_events=options.scheduled_events,
            deferred=self.deferred,
        )
        self.gate: leadership.Gate = (
            leadership.AlwaysOpen()
            if options.standalone
            else leadership.PeeringGate(
                self._read_peering, identity, priority, on_change=self.metrics.leadership
            )
        )

    def _assemble_worker(self, options: OperatorOptions, api: ApiClient) -> None:
        """The gangs and the scheduling worker, and the hooks the feed calls on them."""
        # Gangs: PodGroups watched, a group's members decided together (gang_runtime).
        self.pod_groups = gang_runtime.PodGroupStore(
            on_change=self._wake_group,
            books=self.state.books,
        )
        self.gangs = gang_runtime.GangRuntime(
            self.state,
            self.feed.group_members,
            lambda: self.feed.scheduler_name,
            self.pod_groups,
            self.feed.bound_members,
        )
        #: Present with ``--autoscale-instance-types``: asks Karpenter for the nodes the
        #: waiting pods need (docs/autoscaling.md).
        self.autoscaler = (
            autoscaler.Autoscaler(
                self.state,
                self.feed,
                self.queue,
                self.gangs,
                karpenter.KubeKarpenter(api),
                _read_catalogue(options.autoscale),
                options.autoscale,
                decides=lambda: self.is_leader() and self.synced,
                metrics=self.metrics.autoscale(),
            )
            if options.autoscale is not None
            else None
        )
        self.worker = worker.SchedulingWorker(
            self.state,
            self.feed,
            self.queue,
            binder.KubeBinder(
                api,
                lock_timeout_s=options.allocation_gate_timeout_s
                if options.allocation_gate is GateMode.HAMI_LOCK
                else None,
            ),
            self.reporter,
            self.metrics,
            resync=self._sync_for_opening,
            gate=self.gate,
            preemptor=preemptor.KubePreemptor(api, self.reporter),
            max_binds_in_flight=options.max_binds_in_flight,
            selectors=self.selectors,
            claims=claim_binding.ClaimBinding(
                self.state,
                claims.ApiClaimWriter(api),
                other_allocator_seen=self.feed.other_allocator_seen,
            ),
            gangs=self.gangs,
            write_group_condition=group_status.GroupConditionWrites(self._write_group_condition),
            autoscaling=self.autoscaler,
        )
        self.feed.on_settled = self.worker.node_settled
        if self.autoscaler is not None:
            self.feed.on_node_changed = self.autoscaler.node_changed
            self.claim_feed.on_slice_changed = self.autoscaler.node_changed
        self.feed.queue_priority = self.pod_groups.queue_priority
        self.deferred.busy = self.worker.busy

    def _assemble_watches(self, options: OperatorOptions, api: ApiClient) -> None:
        """One list-then-watch loop per kind (``watching``), and defragmentation."""
        self.watches = watching.Watches(
            watch_loop.ApiSource(api),
            config=(
                watching.config_collection(options.namespace, options.config_map),
                _ConfigHandler(self),
            ),
            state_feed=self.feed,
            claim_feed=self.claim_feed,
            report_warnings=self._report_warnings,
            on_error=self.metrics.api_error,
            before_pods=(
                ("podgroup", watch_loop.Collection(pod_groups.POD_GROUPS), self.pod_groups),
            ),
        )
        #: Present with ``--defrag``: the runner that plans and carries out moves.
        self.defrag = (
            defrag.DefragRunner(
                self.state,
                self.feed,
                defrag_actions.KubeDefragActions(api, self.reporter),
                self.defrag_metrics,
                options.defrag,
                decides=lambda: self.is_leader() and self.synced,
            )
            if options.defrag is not None
            else None
        )

    @classmethod
    async def assemble(
        cls,
        options: OperatorOptions,
        *,
        identity: str,
        priority: int,
        metrics: OperatorMetrics,
    ) -> Operator:
        """The operator with a new API client (closed by ``stop``)."""
        api = await client.create_api_client(options.kubeconfig)
        return cls(options, api, identity=identity, priority=priority, metrics=metrics)

    # --- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        options = self.options
        if options.standalone:
            self.metrics.leadership(True)
        else:
            await self._ensure_peering()
        if isinstance(self.gate, leadership.PeeringGate):
            self._spawn("peering gate", self.gate.run())
        self.metrics.read_state_from(
            self.state.device_usage,
            self.state.quota_usage,
            waiting=self._queue_census,
            stranded=self._stranded_memory,
            learned=self.state.learned_mix,
            loop=asyncio.get_running_loop(),
        )
        self._spawn("heartbeat", self.heartbeat.run())
        heap.hold()
        self._spawn("watches", self.watches.run())
        self._spawn("heap", self._settle_heap_once_listed(), forever=False)
        webhook = options.webhook
        if webhook is not None and webhook.tls_secret is not None:
            tls = webhook_tls.SelfManagedTls(webhook_tls.tls_target(options))
            self._spawn(
                "webhook tls",
                tls.keep_fresh(
                    self.api,
                    webhook.tls_check_interval_s,
                    on_error=lambda: self.metrics.api_error("webhook_tls"),
                ),
            )
        self._spawn("scheduling worker", self.worker.run())
        if self.defrag is not None:
            self._spawn("defragmentation", self.defrag.run())
        if self.autoscaler is not None:
            self._spawn("autoscaler", self.autoscaler.run())
        if options.template_collection is not None:
            collector = template_collector.TemplateCollector(
                template_collector.ApiTemplateStore(self.api), options.template_collection
            )
            self._spawn(
                "template collector",
                collector.run(
                    decides=lambda: self.is_leader() and self.synced,
                    on_error=lambda: self.metrics.api_error("template_collector"),
                ),
            )
        if options.kueue_check is not None:
            self._spawn("kueue admission check", self._placeable_controller().run())
        self._spawn("deferred events", self.deferred.run(self._deferred_write_failed))
        self._spawn("housekeeping", self._housekeeping())
        self.started.set()
        log.info(
            "operator_started",
            identity=self.identity,
            standalone=options.standalone,
            priority=self.priority,
        )

    def _placeable_controller(self) -> admission_checks.PlaceableController:
        """Kueue's AdmissionCheck vgpu-operator.io/placeable on our books (docs/kueue.md)."""
        assert self.options.kueue_check is not None
        return admission_checks.PlaceableController(
            self.api,
            placeable_check.PlaceableCheck(
                self.state, hold_s=self.options.kueue_check.hold_s, pod_groups=self.pod_groups.get
            ),
            self.options.kueue_check,
            decides=lambda: self.is_leader() and self.synced,
            on_released=self.feed.settle_releases,
            on_error=self.metrics.api_error,
        )

    async def _ensure_peering(self) -> None:
        """Create our peering object if it is missing (manifests/ ships only its CRD)."""
        try:
            created = await peering.ensure_cluster_peering(self.api, self.options.peering)
        except peering.PeeringCrdMissingError as exc:
            # Kopf fails on its own without the CRD; say what to do first.
            log.error("peering_crd_missing", peering=self.options.peering, error=str(exc))
            return
        if created:
            log.info("peering_created", peering=self.options.peering)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        await self.selectors.close()
        self._forever.clear()
        await self.api.close()
        log.info("operator_stopped", identity=self.identity)

    def _spawn(self, name: str, coro: Any, *, forever: bool = True) -> None:
        async def guarded() -> None:
            try:
                await coro
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("task_crashed", task=name)
                raise

        task = asyncio.create_task(guarded(), name=name)
        self._tasks.append(task)
        if forever:
            self._forever.append(task)

    def _deferred_write_failed(self, exc: Exception) -> None:
        log.warning("event_write_failed", error=str(exc))
        self.metrics.api_error("report")

    def healthy(self) -> bool:
        """False once a background task (worker, watch, gate) has died: restart us."""
        return all(not task.done() for task in self._forever)

    def is_leader(self) -> bool:
        """Whether this replica decides (the peering gate is open)."""
        return self.gate.is_open()

    @property
    def synced(self) -> bool:
        """True once the worker holds a full picture and may decide."""
        return self.worker.synced.is_set()

    def _wake_group(self, group: str) -> None:
        """A PodGroup changed (created, minCount lowered, its class): its waiting members
        take their priority from it and try again."""
        for pod in self.feed.group_members(group):
            key = pod_key(pod)
            self.queue.set_priority(key, self.pod_groups.queue_priority(pod))
            self.queue.wake_one(key)

    async def _write_group_condition(self, group: str, condition: Mapping[str, object]) -> None:
        namespace, _, name = group.partition("/")
        try:
            await pod_groups.patch_pod_group_condition(self.api, namespace, name, condition)
        except Exception as exc:  # a status write must not stop anything else
            self.metrics.api_error("podgroup_status")
            log.warning("podgroup_status_failed", group=group, error=str(exc))

    async def _report_warnings(self) -> None:
        """What the feed could not use (unreadable Node annotations, refused inventories):
        a Warning Event on the object."""
        for warning in self.feed.take_warnings():
            try:
                await self.reporter.object_event(
                    warning.obj,
                    warning.kind,
                    warning.reason,
                    warning.message,
                    kube_events.TYPE_WARNING,
                )
            except Exception as exc:
                name = meta_of(warning.obj).get("name")
                log.warning("event_write_failed", kind=warning.kind, name=name, error=str(exc))

    # --- config -------------------------------------------------------------------------
    async def on_config(self, kind: str | None, config_map: ConfigMap) -> None:
        """A ConfigMap event: apply a valid config; refuse an invalid one loudly."""
        result = self.feed.config_event(kind, config_map)
        name = f"{self.options.namespace}/{self.options.config_map}"
        if result.outcome is feed.ConfigOutcome.APPLIED:
            log.info("config_applied", config_map=name, scheduler=self.feed.scheduler_name)
        elif result.outcome is feed.ConfigOutcome.KEPT:
            log.warning("config_deleted_last_good_kept", config_map=name)
        elif result.outcome is feed.ConfigOutcome.REJECTED and result.error is not None:
            self.metrics.config_rejected()
            message = (
                f"Invalid device configuration ({result.error.field}: {result.error.message}); "
                "the previous configuration stays in force."
            )
            log.error(
                "config_rejected",
                config_map=name,
                field=result.error.field,
                error=result.error.message,
            )
            try:
                await self.reporter.object_event(
                    config_map, "ConfigMap", "ConfigRejected", message, kube_events.TYPE_WARNING
                )
            except Exception as exc:
                log.warning("event_write_failed", config_map=name, error=str(exc))
                self.metrics.api_error("report")

    # --- full listings ------------------------------------------------------------------
    async def resync(self) -> None:
        """List every kind the engine reads again and reconcile the books with the
        listings (the watches' own loops and handlers, ``watching.Watches.relist_all``)."""
        async with self._resync_lock:
            await self.watches.relist_all()

    async def _sync_for_opening(self) -> None:
        """What the worker waits for after the gate opens, before its first decision:
        books that hold every pod anyone bound before.

        A standalone operator's first opening waits for the first listings of its own
        watches (started with the process: nobody bound anything they could miss), so
        a restart lists the cluster once, not twice. Any other opening (a failover, where
        the previous leader may have bound pods a moment ago) lists everything afresh.
        """
        if self.options.standalone and not self._opened_before:
            self._opened_before = True
            await self.watches.all_listed()
            log.info("watches_listed")
            return
        self._opened_before = True
        await self._resync_until_done()
        heap.settle()

    async def _settle_heap_once_listed(self) -> None:
        """The collector back on (and what the listing made frozen) once the watches
        have listed everything, or after ``HEAP_HOLD_MAX_S`` if they cannot."""
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.watches.all_listed(), HEAP_HOLD_MAX_S)
        finally:
            heap.settle()  # also when stopped before the listing is in

    async def _resync_until_done(self) -> None:
        delays = iter(_RESYNC_RETRY_S)
        while True:
            try:
                await self.resync()
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                delay = next(delays, _RESYNC_RETRY_S[-1])
                log.warning("resync_failed", error=str(exc), retry_after_s=delay)
                self.metrics.api_error("resync")
                await asyncio.sleep(delay)

    async def _housekeeping(self) -> None:
        while True:
            await asyncio.sleep(_HOUSEKEEPING_S)
            for node in self.feed.check_heartbeats():
                log.warning("inventory_stale", node=node)
            for node, holder in self.feed.check_gates():
                # Its device plugin never answered: the node takes GPU pods again.
                log.warning("allocation_gate_timed_out", node=node, pod=holder)
            if self.is_leader():
                self.worker.check_nominations()  # holds that timed out with no decision
                await self._not_routed.report()
            # Pods no event helped for --resync-interval are tried again anyway (the
            # watches keep the books current, kube/watch_loop.py: no relisting).
            flushed = self.queue.flush()
            if flushed:
                log.info("unschedulable_pods_flushed", pods=flushed)

    def _queue_census(self) -> tuple[dict[str, int], dict[str, int]]:
        """For the metrics: pods per queue, parked pods per reason (read at scrape time)."""
        census = self.queue.census()
        return {str(q): n for q, n in census.pods.items()}, dict(census.unschedulable_reasons)

    def _stranded_memory(self) -> dict[str, int]:
        """For the metrics: per node, the free card memory no pending pod could use."""
        waiting = self.queue.keys()
        pending = (self.feed.pending_pod(key) for key in waiting)
        return self.state.stranded_memory_mib(pod for pod in pending if pod is not None)

    async def _read_peering(self) -> Mapping[str, Any] | None:
        return await listing.get_object(
            self.api, listing.cluster_peering_path(self.options.peering)
        )


class _ConfigHandler:
    """The device-config ConfigMap's loop hands its listing and events to the operator
    (a refused config is reported with an Event, which the feed cannot write)."""

    def __init__(self, operator: Operator) -> None:
        self._operator = operator

    async def listed(self, items: Sequence[KubeObject], version: str | None) -> None:
        for item in items:
            await self._operator.on_config(None, cast(ConfigMap, item))

    async def event(self, event_type: WatchEventType, obj: KubeObject) -> None:
        await self._operator.on_config(event_type, cast(ConfigMap, obj))
