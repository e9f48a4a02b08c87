"""One operator instance: the engine, its feed, the worker, and the Kopf handlers.

Handlers are registered on a registry of their own (``build_registry``), bound to one
``OperatorApp``, so that two operators can run in one process (tests of restarts and
peering) without sharing state. Kopf does what it does well and nothing per object: the
mutating webhook (``on.mutate``), peering, startup, cleanup and login; it stores nothing
on the objects (no progress annotations, no finalizers).

The kinds the engine reads (Pods, Nodes, DeviceInventories, ResourceQuotas,
PodDisruptionBudgets, cluster-wide; the node Leases in their namespace) are watched by
plain list-then-watch loops that hand each event straight to the feed
(``control/watching.py``): Kopf's per-event handler pipeline cost more than the decision
itself in a burst. The device-config ConfigMap is watched by our own small watch in the
operator's namespace (a cluster-wide watch would see every ConfigMap of the cluster to
find one).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, cast

import kopf
import structlog

from vgpu_operator import config as device_config
from vgpu_operator import names
from vgpu_operator.control import (
    claim_binding,
    claims_feed,
    deferred,
    defrag,
    feed,
    heap,
    leadership,
    pod_facts,
    queue,
    reporting,
    serving,
    watching,
    webhook_tls,
    worker,
)
from vgpu_operator.control.options import OperatorOptions
from vgpu_operator.handlers import admission
from vgpu_operator.kube import binding, claims, client, eviction, listing, node_lock, peering
from vgpu_operator.kube import events as kube_events
from vgpu_operator.kube.requests import ApiClient
from vgpu_operator.metrics import DefragMetrics, OperatorMetrics, WebhookResult
from vgpu_operator.scheduling import claim_admission, cluster
from vgpu_operator.scheduling.allocation_gate import GateMode

log = structlog.get_logger("vgpu_operator.operator")

#: How often the housekeeping task refreshes gauges and checks inventory heartbeats.
_HOUSEKEEPING_S = 5.0
_RESYNC_RETRY_S = (1.0, 2.0, 5.0, 10.0, 30.0)
#: The longest the garbage collector stays off while the first listing comes in (the API
#: server may not answer for a while; retries make garbage of their own).
HEAP_HOLD_MAX_S = 120.0
#: How often Kopf's webhook server re-reads its certificate files (a hash of three files).
_CERT_FILE_CHECK_S = 5.0


class KubeBinder:
    """``worker.Binder`` over the API. With ``lock_timeout_s`` (``hami-lock``) a GPU pod's
    Binding is preceded by HAMi's node lock, released again if the Binding fails."""

    def __init__(self, api: ApiClient, lock_timeout_s: float | None = None) -> None:
        self._api = api
        self._lock_timeout_s = lock_timeout_s

    async def bind(
        self, pod: Mapping[str, Any], node: str, annotations: Mapping[str, str]
    ) -> binding.BindOutcome:
        meta = pod.get("metadata") or {}
        namespace = str(meta.get("namespace") or "default")
        name = str(meta.get("name") or "")
        locking = self._lock_timeout_s is not None and names.ASSIGNED_NODE in annotations
        if locking:
            assert self._lock_timeout_s is not None
            if not await node_lock.take(self._api, node, namespace, name, self._lock_timeout_s):
                log.info("node_lock_busy", pod=f"{namespace}/{name}", node=node)
                return binding.BindOutcome.CONFLICT
        # An exception leaves the lock: the Binding may have been written (its answer
        # lost), and then HAMi's plugin needs the lock; if not, it expires.
        outcome = await binding.bind_pod(
            self._api, namespace, name, str(meta.get("uid") or ""), node, annotations
        )
        if locking and outcome is not binding.BindOutcome.BOUND:
            await node_lock.release(self._api, node, namespace, name)
        return outcome

    async def read_pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return await binding.read_pod(self._api, namespace, name)


class KubePreemptor:
    """``worker.Preemptor`` over the API: Evictions, nominatedNodeName, and the Events."""

    def __init__(self, api: ApiClient, reporter: reporting.KubeReporter) -> None:
        self._api = api
        self._reporter = reporter

    async def evict(self, victim: str, uid: str) -> eviction.EvictOutcome:
        namespace, _, name = victim.partition("/")
        return await eviction.evict_pod(self._api, namespace, name, uid)

    async def nominate(self, pod: Mapping[str, Any], node: str | None) -> None:
        meta = pod.get("metadata") or {}
        namespace = str(meta.get("namespace") or "default")
        await eviction.set_nominated_node(self._api, namespace, str(meta.get("name")), node)

    async def preempted(self, victim: str, preemptor: Mapping[str, Any], node: str) -> None:
        await self._reporter.preempted(victim, preemptor, node)

    async def preempting(self, pod: Mapping[str, Any], node: str, victims: int) -> None:
        await self._reporter.preempting(pod, node, victims)


class KubeDefragActions:
    """``defrag.DefragActions`` over the API: listings, Evictions, nominatedNodeName,
    Events."""

    def __init__(self, api: ApiClient, reporter: reporting.KubeReporter) -> None:
        self._api = api
        self._reporter = reporter

    async def list_pods(self, namespace: str | None = None) -> list[dict[str, Any]]:
        path = listing.PODS if namespace is None else f"/api/v1/namespaces/{namespace}/pods"
        return (await listing.list_all(self._api, path)).items

    async def evict(self, key: str, uid: str) -> eviction.EvictOutcome:
        namespace, _, name = key.partition("/")
        return await eviction.evict_pod(self._api, namespace, name, uid)

    async def nominate(self, pod: Mapping[str, Any], node: str | None) -> None:
        meta = pod.get("metadata") or {}
        namespace = str(meta.get("namespace") or "default")
        await eviction.set_nominated_node(self._api, namespace, str(meta.get("name")), node)

    async def event(
        self, pod: Mapping[str, Any], reason: str, message: str, warning: bool = False
    ) -> None:
        kind = kube_events.TYPE_WARNING if warning else kube_events.TYPE_NORMAL
        await self._reporter.object_event(pod, "Pod", reason, message, kind)


def make_identity() -> str:
    """This replica's peering identity (the pod name in a cluster)."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class OperatorApp:
    """See the module docstring. Created before Kopf starts; ``start`` runs in Kopf's
    startup handler, ``stop`` in its cleanup handler."""

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
            KubeBinder(
                self.api,
                lock_timeout_s=options.allocation_gate_timeout_s
                if options.allocation_gate is GateMode.HAMI_LOCK
                else None,
            ),
            self.reporter,
            self.metrics,
            resync=self._sync_for_opening,
            gate=self.gate,
            preemptor=KubePreemptor(self.api, self.reporter),
            max_binds_in_flight=options.max_binds_in_flight,
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
                KubeDefragActions(self.api, self.reporter),
                self.defrag_metrics,
                options.defrag,
                decides=lambda: self._is_leader() and self.synced,
            )
            self._spawn("defragmentation", self.defrag.run())
        self._spawn("deferred events", self.deferred.run(self._deferred_write_failed))
        self._spawn("housekeeping", self._housekeeping())
        self.started.set()
        log.info(
            "operator_started",
            identity=self.identity,
            standalone=options.standalone,
            priority=self.priority,
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

    # --- Kopf handlers (thin) -----------------------------------------------------------
    async def on_startup(self, settings: kopf.OperatorSettings, **_: Any) -> None:
        configure_kopf(settings, self.options)
        await self.start()

    async def on_cleanup(self, **_: Any) -> None:
        await self.stop()

    async def on_login(self, **_: Any) -> kopf.ConnectionInfo:
        assert self.api is not None, "login runs after startup"
        return await connection_info(self.api, self.options.namespace)

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

    async def on_pod_admission(
        self, body: kopf.Body, patch: kopf.Patch, warnings: list[str], **_: Any
    ) -> None:
        started = time.monotonic()
        if self.state is None:
            # Not started: let the pod through unchanged (failurePolicy Ignore).
            self.metrics.webhook_answered(WebhookResult.NOT_READY, time.monotonic() - started)
            return
        result = self.state.admit(_raw(body))
        if not result.handled:
            self.metrics.webhook_answered(WebhookResult.PASSED, time.monotonic() - started)
            return
        if not result.allowed:
            # An ordinary answer, not a fault: info (Kopf's own error line is filtered out).
            log.info("pod_denied", pod=cluster.pod_key(_raw(body)), reason=result.message)
            self.metrics.webhook_answered(WebhookResult.DENIED, time.monotonic() - started)
            raise kopf.AdmissionError(result.message, code=403)
        mutated = result.pod
        namespace = str((mutated.get("metadata") or {}).get("namespace") or "default")
        if self.state.config.dra.converts(namespace):
            mutated = await self._to_claims(mutated, started)
        patch.fns.append(lambda raw: admission.apply_mutation(cast(dict[str, Any], raw), mutated))
        # kubectl prints these to whoever created the pod (e.g. gpucores above 100).
        warnings.extend(result.warnings)
        self.metrics.webhook_answered(WebhookResult.MUTATED, time.monotonic() - started)

    async def _to_claims(self, pod: Mapping[str, Any], started: float) -> Mapping[str, Any]:
        """A pod of a namespace on the DRA path: its GPU containers name claims made from
        templates (``claim_admission``), which are created first. Raises the webhook's
        refusal when the request cannot be a claim or a template cannot be made."""
        assert self.state is not None
        assert self.api is not None
        try:
            converted = claim_admission.convert(pod, self.state.vendors)
        except claim_admission.Unmappable as exc:
            self.metrics.webhook_answered(WebhookResult.DENIED, time.monotonic() - started)
            raise kopf.AdmissionError(str(exc), code=403) from None
        if converted is None:
            return pod
        for template in converted.templates:
            try:
                problem = await claims.ensure_template(self.api, template)
            except Exception as exc:
                problem = f"the pod's ResourceClaimTemplate could not be made: {exc}"
            if problem is not None:
                self.metrics.webhook_answered(WebhookResult.DENIED, time.monotonic() - started)
                raise kopf.AdmissionError(problem, code=403)
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
        """GPU pods created while the webhook was down keep ``default-scheduler`` and would
        wait forever: tell their owners (once per pod) how to fix them.

        They cannot be adopted: a pod's scheduler name is immutable.
        """
        assert self.feed is not None
        assert self.state is not None
        assert self.reporter is not None
        waiting = self.feed.waiting_for(names.DEFAULT_SCHEDULER)
        present: set[str] = set()
        for pod in waiting:
            uid = str((pod.get("metadata") or {}).get("uid") or "")
            present.add(uid)
            if uid in self._not_routed_reported:
                continue
            admitted = self.state.admit(pod)
            if not admitted.handled:
                continue  # not a GPU pod: the default scheduler's business
            self._not_routed_reported.add(uid)
            wanted = pod_facts.extended_resources_of(pod)
            message = reporting.not_routed_message(pod, wanted, self.feed.scheduler_name)
            log.warning("gpu_pod_not_routed", pod=cluster.pod_key(pod))
            self.metrics.not_routed()
            try:
                await self.reporter.not_routed(pod, message)
            except Exception as exc:
                log.warning("event_write_failed", pod=cluster.pod_key(pod), error=str(exc))
                self.metrics.api_error("report")
        self._not_routed_reported &= present

    async def _read_peering(self) -> Mapping[str, Any] | None:
        assert self.api is not None
        return await listing.get_object(
            self.api, listing.cluster_peering_path(self.options.peering)
        )


def _raw(body: Any) -> dict[str, Any]:
    """The plain dict behind a Kopf body view."""
    return {key: body[key] for key in body}


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


class _DenialsAreNotErrors(logging.Filter):
    """Drops Kopf's error line for a webhook denial (``kopf.AdmissionError``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(
            message.startswith(f"{kind} {WEBHOOK_ID!r} failed permanently")
            for kind in ("Webhook", "Handler")
        )


def configure_kopf(settings: kopf.OperatorSettings, options: OperatorOptions) -> None:
    """Kopf settings for a scheduler (each with the reason)."""
    # Our own Events carry the scheduling news; Kopf's would add an Event per log line.
    settings.posting.enabled = False
    # A handler per watch event at INFO would drown the log at thousands of pods.
    objects_log = logging.getLogger("kopf.objects")
    objects_log.setLevel(logging.WARNING)
    # A webhook denial is an answer, logged by us at info; Kopf logs it as a handler error.
    if not any(isinstance(f, _DenialsAreNotErrors) for f in objects_log.filters):
        objects_log.addFilter(_DenialsAreNotErrors())
    # Reconnect quickly after an API server restart; pending pods must not wait long.
    settings.watching.reconnect_backoff = 0.5
    settings.watching.connect_timeout = 30
    settings.watching.server_timeout = 300
    # Handlers only hand objects to the feed: nothing to retry, never throttle the stream.
    settings.queueing.error_delays = (1, 5, 10)
    settings.peering.stealth = True
    webhook = options.webhook
    if webhook is not None:
        certfile, pkeyfile = webhook.certfile, webhook.pkeyfile
        if webhook.tls_secret is not None:
            target = tls_target(options)
            certfile, pkeyfile = target.certfile, target.keyfile
        settings.admission.server = kopf.WebhookServer(
            addr=webhook.addr,
            port=webhook.port,
            host=webhook.host,
            certfile=str(certfile) if certfile else None,
            pkeyfile=str(pkeyfile) if pkeyfile else None,
            cafile=str(webhook.cafile) if webhook.cafile else None,
            # Renewed certificates (cert-manager's Secret, or our own) are picked up soon.
            file_check_interval=_CERT_FILE_CHECK_S,
        )
        if webhook.managed_name:
            settings.admission.managed = webhook.managed_name


async def connection_info(api: ApiClient, namespace: str) -> kopf.ConnectionInfo:
    """Kopf's credentials, taken from our client's configuration (one source of truth)."""
    config = api.configuration
    maybe_header: Any = config.get_api_key_with_prefix("BearerToken")
    header = await maybe_header if asyncio.iscoroutine(maybe_header) else maybe_header
    scheme: str | None = None
    token: str | None = None
    if header:
        parts = str(header).split(" ", 1)
        scheme, token = (parts[0], parts[1]) if len(parts) == 2 else (None, parts[0])
    return kopf.ConnectionInfo(
        server=str(config.host),
        ca_path=config.ssl_ca_cert,
        insecure=not config.verify_ssl,
        scheme=scheme,
        token=token,
        certificate_path=config.cert_file,
        private_key_path=config.key_file,
        default_namespace=namespace,
    )


WEBHOOK_ID = "mutate-pods"


def build_registry(app: OperatorApp) -> kopf.OperatorRegistry:
    """A Kopf registry whose handlers all go to ``app``."""
    registry = kopf.OperatorRegistry()
    kopf.on.startup(registry=registry, id="startup")(app.on_startup)
    kopf.on.cleanup(registry=registry, id="cleanup")(app.on_cleanup)
    kopf.on.login(registry=registry, id="login")(app.on_login)
    if app.options.webhook is not None:
        kopf.on.mutate(
            "v1",
            "pods",
            operations=["CREATE"],
            registry=registry,
            id=WEBHOOK_ID,
            ignore_failures=True,
        )(app.on_pod_admission)
    return registry


async def run(
    app: OperatorApp,
    *,
    stop_flag: Any = None,
    ready_flag: Any = None,
) -> None:
    """Run Kopf with the app's registry until ``stop_flag`` is raised (or a signal)."""
    options = app.options
    await prepare_webhook_tls(options)
    with contextlib.suppress(asyncio.CancelledError):
        await kopf.operator(
            registry=build_registry(app),
            settings=kopf.OperatorSettings(),
            clusterwide=True,
            standalone=options.standalone,
            peering_name=None if options.standalone else options.peering,
            priority=app.priority,
            identity=cast(Any, app.identity),
            stop_flag=stop_flag,
            ready_flag=ready_flag,
        )
