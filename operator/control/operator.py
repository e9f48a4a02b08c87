"""The operator, assembled: the engine, its feed and watches, the queue, the worker, the
reporter, leadership, the HTTP server and housekeeping, wired together and run.

Kopf runs the process around it (``handlers/app.py``: start-up and clean-up call
``start`` and ``stop``, the webhook calls ``admit_pod``, login and peering); nothing here
knows Kopf. The kinds the engine reads (Pods, Nodes, DeviceInventories, ResourceQuotas,
PodDisruptionBudgets, the DRA kinds, cluster-wide; the node Leases in their namespace)
are watched by plain list-then-watch loops that hand each event straight to the feed
(``watching``): Kopf's per-event handler pipeline cost more than the decision itself in a
burst (``docs/architecture.md`` keeps that decision with its numbers). The device-config
ConfigMap is watched by a small watch of our own in the operator's namespace (a
cluster-wide watch would see every ConfigMap of the cluster to find one).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from vgpu_operator import config as device_config
from vgpu_operator import names
from vgpu_operator.control import (
    admission_checks,
    cel_offload,
    claim_binding,
    claims_feed,
    deferred,
    defrag,
    feed,
    heap,
    leadership,
    placeable_check,
    pod_facts,
    queue,
    reporting,
    serving,
    template_collector,
    watching,
    webhook_tls,
    worker,
)
from vgpu_operator.control.options import OperatorOptions
from vgpu_operator.kube import (
    binder,
    claims,
    client,
    defrag_actions,
    listing,
    peering,
    preemptor,
)
from vgpu_operator.kube import events as kube_events
from vgpu_operator.kube.requests import ApiClient
from vgpu_operator.metrics import DefragMetrics, OperatorMetrics, WebhookResult
from vgpu_operator.scheduling import claim_admission, claim_routing, cluster
from vgpu_operator.scheduling.allocation_gate import GateMode

log = structlog.get_logger("vgpu_operator.operator")

#: How often the housekeeping task refreshes gauges and checks inventory heartbeats.
_HOUSEKEEPING_S = 5.0
_RESYNC_RETRY_S = (1.0, 2.0, 5.0, 10.0, 30.0)
#: The longest the garbage collector stays off while the first listing comes in (the API
#: server may not answer for a while; retries make garbage of their own).
HEAP_HOLD_MAX_S = 120.0
#: How long the webhook reads a pod's claims at most (manifests/webhook.yaml's
#: timeoutSeconds is 3: the answer must come before it).
CLAIM_READ_TIMEOUT_S = 2.0


@dataclass(frozen=True, slots=True)
class AdmissionAnswer:
    """The webhook's answer for one pod: refused with ``message``, or allowed, with the
    pod as it should be created (``pod``; None: unchanged) and warnings for its creator."""

    allowed: bool = True
    message: str = ""
    pod: Mapping[str, Any] | None = None
    warnings: tuple[str, ...] = ()


def make_identity() -> str:
    """This replica's peering identity (the pod name in a cluster)."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class Operator:
    """See the module docstring. ``start`` runs in Kopf's startup handler, ``stop`` in
    its cleanup handler (``handlers/app.py``)."""

    def __init__(self, options: OperatorOptions) -> None:
        self.options = options
        self.identity = make_identity()
        self.priority = (
            options.priority
            if options.priority is not None
            else leadership.peering_priority(time.time())
        )
        self.metrics = OperatorMetrics()
        self.defrag_metrics = DefragMetrics(self.metrics)
        self.api: ApiClient | None = None
        self.state: cluster.ClusterState | None = None
        self.feed: feed.StateFeed | None = None
        self.claim_feed: claims_feed.ClaimFeed | None = None
        self.queue: queue.SchedulingQueue | None = None
        self.worker: worker.SchedulingWorker | None = None
        self.selectors: cel_offload.OffLoopSelectors | None = None
        self.reporter: reporting.KubeReporter | None = None
        self.gate: worker.Gate | None = None
        self.deferred: deferred.DeferredWrites | None = None
        self.watches: watching.FeedWatches | None = None
        self.defrag: defrag.DefragRunner | None = None
        self._config_listed = asyncio.Event()
        self._opened_before = False
        self._tasks: list[asyncio.Task[None]] = []
        self._forever: list[asyncio.Task[None]] = []  # must run as long as the process
        self._server: serving.HttpServer | None = None
        self._resync_lock = asyncio.Lock()
        self.started = asyncio.Event()
        #: uids of GPU pods already reported as left to the default scheduler.
        self._not_routed_reported: set[str] = set()

    # --- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        options = self.options
        self.api = await client.create_api_client(options.kubeconfig)
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
            notify=self._poke_worker,
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
            self.api,
            aggregator=kube_events.EventAggregator(self.identity),
            scheduled_events=options.scheduled_events,
            deferred=self.deferred,
        )
        if not options.standalone:
            await self._ensure_peering()
        if options.standalone:
            self.gate = worker.AlwaysOpen()
            self.metrics.leadership(True)
        else:
            gate = leadership.PeeringGate(
                self._read_peering,
                self.identity,
                self.priority,
                on_change=self.metrics.leadership,
            )
            self.gate = gate
            self._spawn("peering gate", gate.run())
        self.worker = worker.SchedulingWorker(
            self.state,
            self.feed,
            self.queue,
            binder.KubeBinder(
                self.api,
                lock_timeout_s=options.allocation_gate_timeout_s
                if options.allocation_gate is GateMode.HAMI_LOCK
                else None,
            ),
            self.reporter,
            self.metrics,
            resync=self._sync_for_opening,
            gate=self.gate,
            preemptor=preemptor.KubePreemptor(self.api, self.reporter),
            max_binds_in_flight=options.max_binds_in_flight,
            selectors=self.selectors,
            claims=claim_binding.ClaimBinding(
                self.state,
                claims.ApiClaimWriter(self.api),
                other_allocator_seen=self.feed.other_allocator_seen,
            ),
        )
        self.feed.on_settled = self.worker.node_settled
        self.deferred.busy = self.worker.busy
        self.metrics.read_state_from(
            self.state.device_usage,
            self.state.quota_usage,
            waiting=self._queue_census,
            stranded=self._stranded_memory,
        )
        if options.metrics_port is not None:
            self._server = serving.HttpServer(
                self.metrics, ready=self.started.is_set, leader=self._is_leader, live=self.healthy
            )
            await self._server.start(options.metrics_addr, options.metrics_port)
        self._spawn("config watch", self._watch_config())
        self.watches = watching.FeedWatches(
            self.api,
            self.feed,
            report_warnings=self._report_warnings,
            on_error=self.metrics.api_error,
            claim_feed=self.claim_feed,
        )
        heap.hold()
        self._spawn("watches", self.watches.run())
        self._spawn("heap", self._settle_heap_once_listed(), forever=False)
        webhook = options.webhook
        if webhook is not None and webhook.tls_secret is not None:
            tls = webhook_tls.SelfManagedTls(tls_target(options))
            self._spawn(
                "webhook tls",
                tls.keep_fresh(
                    self.api,
                    webhook.tls_check_interval_s,
                    on_error=lambda: self.metrics.api_error("webhook_tls"),
                ),
            )
        self._spawn("scheduling worker", self.worker.run())
        if options.defrag is not None:
            self.defrag = defrag.DefragRunner(
                self.state,
                self.feed,
                defrag_actions.KubeDefragActions(self.api, self.reporter),
                self.defrag_metrics,
                options.defrag,
                decides=lambda: self._is_leader() and self.synced,
            )
            self._spawn("defragmentation", self.defrag.run())
        if options.template_collection is not None:
            collector = template_collector.TemplateCollector(
                template_collector.ApiTemplateStore(self.api), options.template_collection
            )
            self._spawn(
                "template collector",
                collector.run(
                    decides=lambda: self._is_leader() and self.synced,
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
        assert self.api is not None
        assert self.state is not None
        assert self.feed is not None
        assert self.options.kueue_check is not None
        return admission_checks.PlaceableController(
            self.api,
            placeable_check.PlaceableCheck(self.state, hold_s=self.options.kueue_check.hold_s),
            self.options.kueue_check,
            decides=lambda: self._is_leader() and self.synced,
            on_released=self.feed.settle_releases,
            on_error=self.metrics.api_error,
        )

    async def _ensure_peering(self) -> None:
        """Create our peering object if it is missing (manifests/ ships only its CRD)."""
        assert self.api is not None
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
        if self.selectors is not None:
            await self.selectors.close()
        self._forever.clear()
        if self._server is not None:
            await self._server.stop()
        if self.api is not None:
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

    def _poke_worker(self) -> None:
        if self.worker is not None:
            self.worker.poke()

    def healthy(self) -> bool:
        """False once a background task (worker, watch, gate) has died: restart us."""
        return all(not task.done() for task in self._forever)

    def _is_leader(self) -> bool:
        return self.gate is not None and self.gate.is_open()

    @property
    def synced(self) -> bool:
        """True once the worker holds a full picture and may decide."""
        return self.worker is not None and self.worker.synced.is_set()

    async def _report_warnings(self) -> None:
        """What the feed could not use (unreadable Node annotations, refused inventories):
        a Warning Event on the object."""
        assert self.feed is not None
        for warning in self.feed.take_warnings():
            if self.reporter is None:
                continue
            try:
                await self.reporter.object_event(
                    warning.obj,
                    warning.kind,
                    warning.reason,
                    warning.message,
                    kube_events.TYPE_WARNING,
                )
            except Exception as exc:
                name = (warning.obj.get("metadata") or {}).get("name")
                log.warning("event_write_failed", kind=warning.kind, name=name, error=str(exc))

    # --- admission: the webhook's answers (handlers/app.py hands them to Kopf) ------------
    async def admit_pod(self, pod: Mapping[str, Any], *, dry_run: bool = False) -> AdmissionAnswer:
        """What the mutating webhook answers for ``pod`` (counted in the metrics); in a
        dry run (the AdmissionReview's ``dryRun``) nothing is written, the answer is the
        same."""
        started = time.monotonic()

        def answered(result: WebhookResult) -> None:
            self.metrics.webhook_answered(result, time.monotonic() - started)

        if self.state is None:
            # Not started: let the pod through unchanged (failurePolicy Ignore).
            answered(WebhookResult.NOT_READY)
            return AdmissionAnswer()
        result = self.state.admit(pod)
        if not result.handled:
            routed = await self._route_by_claims(pod)
            if routed.action is claim_routing.Action.REFUSE:
                log.info("pod_denied", pod=cluster.pod_key(pod), reason=routed.message)
                answered(WebhookResult.DENIED)
                return AdmissionAnswer(allowed=False, message=routed.message)
            if routed.action is claim_routing.Action.ROUTE:
                answered(WebhookResult.MUTATED)
                routed_pod = copy.deepcopy(dict(pod))
                routed_pod.setdefault("spec", {})["schedulerName"] = (
                    self.state.config.scheduler.scheduler_name
                )
                return AdmissionAnswer(pod=routed_pod)
            answered(WebhookResult.PASSED)
            return AdmissionAnswer()
        if not result.allowed:
            # An ordinary answer, not a fault: info (Kopf's own error line is filtered out).
            log.info("pod_denied", pod=cluster.pod_key(pod), reason=result.message)
            answered(WebhookResult.DENIED)
            return AdmissionAnswer(allowed=False, message=result.message)
        mutated: Mapping[str, Any] = result.pod
        namespace = str((mutated.get("metadata") or {}).get("namespace") or "default")
        if self.state.config.dra.converts(namespace):
            converted = await self._to_claims(mutated, dry_run=dry_run)
            if isinstance(converted, str):
                log.info("pod_denied", pod=cluster.pod_key(pod), reason=converted)
                answered(WebhookResult.DENIED)
                return AdmissionAnswer(allowed=False, message=converted)
            mutated = converted
        answered(WebhookResult.MUTATED)
        # kubectl prints the warnings to whoever created the pod (e.g. gpucores above 100).
        return AdmissionAnswer(pod=mutated, warnings=tuple(result.warnings))

    async def _route_by_claims(self, pod: Mapping[str, Any]) -> claim_routing.Routing:
        """Where a pod naming ResourceClaims goes (``claim_routing``): the claims and
        templates it names are read (bounded in count and in time: the API server waits
        ``timeoutSeconds`` for the answer)."""
        assert self.state is not None
        refs = claim_routing.claim_refs(pod)
        scheduler = self.state.config.scheduler.scheduler_name
        if not refs or claim_routing.settled_without_reading(pod, scheduler):
            return claim_routing.Routing(claim_routing.Action.PASS)
        too_many = claim_routing.too_many(refs)
        if too_many is not None:
            return claim_routing.Routing(claim_routing.Action.REFUSE, too_many)
        assert self.api is not None
        namespace = str((pod.get("metadata") or {}).get("namespace") or "default")
        try:
            async with asyncio.timeout(CLAIM_READ_TIMEOUT_S):
                found = await claims.read_pod_claims(self.api, namespace, refs)
        except Exception as exc:
            self.metrics.api_error("webhook_claims")
            return claim_routing.Routing(
                claim_routing.Action.REFUSE,
                f"the pod's ResourceClaims could not be read to route it ({exc!r}); try again",
            )
        return claim_routing.route(pod, found, scheduler)

    async def _to_claims(
        self, pod: Mapping[str, Any], *, dry_run: bool = False
    ) -> Mapping[str, Any] | str:
        """A pod of a namespace on the DRA path: its GPU containers name claims made from
        templates (``claim_admission``), which are created first (in a dry run only
        validated: ``dryRun=All``). Returns the refusal's message when the request cannot
        be a claim or a template cannot be made."""
        assert self.state is not None
        assert self.api is not None
        try:
            converted = claim_admission.convert(pod, self.state.vendors)
        except claim_admission.Unmappable as exc:
            return str(exc)
        if converted is None:
            return pod
        for template in converted.templates:
            try:
                problem = await claims.ensure_template(self.api, template, dry_run=dry_run)
            except Exception as exc:
                problem = f"the pod's ResourceClaimTemplate could not be made: {exc}"
            if problem is not None:
                return problem
        return converted.pod

    # --- config -------------------------------------------------------------------------
    async def _watch_config(self) -> None:
        path = f"/api/v1/namespaces/{self.options.namespace}/configmaps"
        selector = f"metadata.name={self.options.config_map}"
        await self._watch(
            "config", path, self.on_config, field_selector=selector, listed=self._config_listed
        )

    async def _watch(
        self,
        what: str,
        path: str,
        on_event: Callable[[str | None, Mapping[str, Any]], Awaitable[None]],
        *,
        field_selector: str | None = None,
        listed: asyncio.Event | None = None,
    ) -> None:
        """List, then watch, ``path`` forever; ``on_event(None, obj)`` for listed objects
        (then ``listed`` is set)."""
        assert self.api is not None
        version: str | None = None
        delays = iter(_RESYNC_RETRY_S)
        while True:
            try:
                if version is None:
                    found = await listing.list_all(self.api, path, field_selector=field_selector)
                    for item in found.items:
                        await on_event(None, item)
                    version = found.resource_version
                    if listed is not None:
                        listed.set()
                async for kind, obj in listing.watch(
                    self.api, path, resource_version=version, field_selector=field_selector
                ):
                    await on_event(kind, obj)
                    version = (obj.get("metadata") or {}).get("resourceVersion") or version
                delays = iter(_RESYNC_RETRY_S)
            except listing.WatchExpired:
                version = None
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                delay = next(delays, _RESYNC_RETRY_S[-1])
                log.warning(f"{what}_watch_failed", error=str(exc), retry_after_s=delay)
                self.metrics.api_error(f"{what}_watch")
                version = None
                await asyncio.sleep(delay)

    async def on_config(self, kind: str | None, config_map: Mapping[str, Any]) -> None:
        """A ConfigMap event: apply a valid config; refuse an invalid one loudly."""
        assert self.feed is not None
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
            if self.reporter is not None:
                try:
                    await self.reporter.object_event(
                        config_map, "ConfigMap", "ConfigRejected", message, kube_events.TYPE_WARNING
                    )
                except Exception as exc:
                    log.warning("event_write_failed", config_map=name, error=str(exc))
                    self.metrics.api_error("report")

    # --- full listings ------------------------------------------------------------------
    async def resync(self) -> None:
        """List every kind the engine reads and reconcile the books with the listing."""
        assert self.api is not None
        assert self.feed is not None
        async with self._resync_lock:
            started = time.monotonic()
            path = f"/api/v1/namespaces/{self.options.namespace}/configmaps"
            found = await listing.list_all(
                self.api, path, field_selector=f"metadata.name={self.options.config_map}"
            )
            for item in found.items:
                await self.on_config(None, item)
            nodes = await listing.list_all(self.api, listing.NODES)
            self.feed.nodes_listed(nodes.items, nodes.resource_version)
            await self._report_warnings()
            inventories = await listing.list_all(self.api, listing.DEVICE_INVENTORIES)
            self.feed.inventories_listed(inventories.items, inventories.resource_version)
            await self._report_warnings()
            leases = await listing.list_all(self.api, listing.NODE_LEASES)
            self.feed.leases_listed(leases.items, leases.resource_version)
            quotas = await listing.list_all(self.api, listing.RESOURCE_QUOTAS)
            self.feed.quotas_listed(quotas.items, quotas.resource_version)
            budgets = await listing.list_all(self.api, listing.POD_DISRUPTION_BUDGETS)
            self.feed.budgets_listed(budgets.items, budgets.resource_version)
            if self.claim_feed is not None:
                for kind in watching.dra_kinds_of(self.claim_feed):
                    found = await listing.list_all(self.api, kind.path)
                    kind.listed(found.items, found.resource_version)
            pods = await listing.list_all(self.api, listing.PODS)
            self.feed.pods_listed(pods.items, pods.resource_version)
            log.info(
                "resync_done",
                nodes=len(nodes.items),
                inventories=len(inventories.items),
                leases=len(leases.items),
                quotas=len(quotas.items),
                pods=len(pods.items),
                duration_s=round(time.monotonic() - started, 3),
            )

    async def _sync_for_opening(self) -> None:
        """What the worker waits for after the gate opens, before its first decision:
        books that hold every pod anyone bound before.

        A standalone operator's first opening waits for the first listings of its own
        watches (started with the process: nobody bound anything they could miss), so
        a restart lists the cluster once, not twice. Any other opening (a failover, where
        the previous leader may have bound pods a moment ago) lists everything afresh.
        """
        if self.options.standalone and not self._opened_before and self.watches is not None:
            self._opened_before = True
            await self._config_listed.wait()
            await self.watches.listed.wait()
            log.info("watches_listed")
            return
        self._opened_before = True
        await self._resync_until_done()
        heap.settle()

    async def _settle_heap_once_listed(self) -> None:
        """The collector back on (and what the listing made frozen) once the watches
        have listed everything, or after ``HEAP_HOLD_MAX_S`` if they cannot."""
        assert self.watches is not None
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.watches.listed.wait(), HEAP_HOLD_MAX_S)
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
        assert self.queue is not None
        assert self.feed is not None
        while True:
            await asyncio.sleep(_HOUSEKEEPING_S)
            for node in self.feed.check_heartbeats():
                log.warning("inventory_stale", node=node)
            for node, holder in self.feed.check_gates():
                # Its device plugin never answered: the node takes GPU pods again.
                log.warning("allocation_gate_timed_out", node=node, pod=holder)
            if self._is_leader():
                await self._report_not_routed()
            # Pods no event helped for --resync-interval are tried again anyway (the
            # watches keep the books current, control/watching.py: no relisting).
            flushed = self.queue.flush()
            if flushed:
                log.info("unschedulable_pods_flushed", pods=flushed)

    def _queue_census(self) -> tuple[dict[str, int], dict[str, int]]:
        """For the metrics: pods per queue, parked pods per reason (read at scrape time)."""
        assert self.queue is not None
        census = self.queue.census()
        return {str(q): n for q, n in census.pods.items()}, dict(census.unschedulable_reasons)

    def _stranded_memory(self) -> dict[str, int]:
        """For the metrics: per node, the free card memory no pending pod could use."""
        assert self.queue is not None
        assert self.feed is not None
        assert self.state is not None
        waiting = self.queue.keys()
        pending = (self.feed.pending_pod(key) for key in waiting)
        return self.state.stranded_memory_mib(pod for pod in pending if pod is not None)

    async def _report_not_routed(self) -> None:
        """GPU pods created while the webhook was down keep ``default-scheduler``: unbound,
        they would wait forever; bound by kube-scheduler (or by their creator), they fail
        at Allocate, as no share was booked for them. Tell their owners (once per pod) how
        to fix them.

        They cannot be adopted: a pod's scheduler name is immutable.
        """
        assert self.feed is not None
        assert self.state is not None
        assert self.reporter is not None
        waiting = self.feed.waiting_for(names.DEFAULT_SCHEDULER)
        present = {str((pod.get("metadata") or {}).get("uid") or "") for pod in waiting}
        # Each bound pod is handed out once (the feed); one reported while it waited (in
        # the set still: it is pruned below) or before a restart (its condition) is not
        # reported again.
        bound = [
            pod
            for pod in self.feed.take_bound_by_default()
            if pod_facts.condition_of(pod, reporting.CONDITION_NOT_ROUTED) is None
        ]
        for pod in [*waiting, *bound]:
            uid = str((pod.get("metadata") or {}).get("uid") or "")
            if uid in self._not_routed_reported:
                continue
            if not self._asks_for_gpu(pod):
                continue  # not a GPU pod: the default scheduler's business
            self._not_routed_reported.add(uid)
            wanted = pod_facts.extended_resources_of(pod)
            message = reporting.not_routed_message(pod, wanted, self.feed.scheduler_name)
            log.warning(
                "gpu_pod_not_routed",
                pod=cluster.pod_key(pod),
                node=pod_facts.node_name_of(pod),
            )
            self.metrics.not_routed()
            try:
                await self.reporter.not_routed(pod, message)
            except Exception as exc:
                log.warning("event_write_failed", pod=cluster.pod_key(pod), error=str(exc))
                self.metrics.api_error("report")
        self._not_routed_reported &= present

    def _asks_for_gpu(self, pod: Mapping[str, Any]) -> bool:
        """Whether the webhook would have taken the pod as a GPU pod, had it seen it
        (a bound pod is one the webhook passes unchanged: asked as if unbound)."""
        assert self.state is not None
        spec = {
            k: v
            for k, v in (pod.get("spec") or {}).items()
            if k not in ("nodeName", "schedulerName")
        }
        return self.state.admit({**pod, "spec": spec}).handled

    async def _read_peering(self) -> Mapping[str, Any] | None:
        assert self.api is not None
        return await listing.get_object(
            self.api, listing.cluster_peering_path(self.options.peering)
        )


def tls_target(options: OperatorOptions) -> webhook_tls.TlsTarget:
    """Where self-managed webhook TLS keeps its certificates (``--webhook-tls-secret``)."""
    webhook = options.webhook
    assert webhook is not None
    assert webhook.tls_secret is not None
    return webhook_tls.TlsTarget(
        namespace=options.namespace,
        secret=webhook.tls_secret,
        service=webhook.service,
        configuration=webhook.configuration,
        directory=webhook.tls_dir,
    )


async def prepare_webhook_tls(options: OperatorOptions) -> None:
    """Before Kopf starts its webhook server: the certificate files must exist."""
    if options.webhook is None or options.webhook.tls_secret is None:
        return
    tls = webhook_tls.SelfManagedTls(tls_target(options))
    delays = iter(_RESYNC_RETRY_S)
    async with client.api_client(options.kubeconfig) as api:
        while True:
            try:
                await tls.sync(api)
                return
            except Exception as exc:
                delay = next(delays, None)
                if delay is None:
                    raise
                log.warning("webhook_tls_sync_failed", error=str(exc), retry_after_s=delay)
                await asyncio.sleep(delay)
