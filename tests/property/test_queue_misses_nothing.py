"""Nothing is lost: the queueing hints never leave a pod unschedulable that could fit.

The real feed, queue and engine run random orders of what a cluster sends: pending pods
arriving, the worker deciding some of them (those that fit are bound, the others wait
with their verdict as hint), bound pods ending or deleted, nodes appearing, cordoned,
tainted and relabelled, cards failing, healing and cordoned in their inventories, quota
limits changing, time passing. After every step, each pod in the unschedulable queue is
decided afresh by a reference engine built from the cluster as it is (every node fitted,
no verdict, no hint): none may fit. A pod that could fit must have been woken by the
event that freed room for it, or by the one that changed its node.
"""

from __future__ import annotations

import copy
import datetime
from collections.abc import Hashable
from dataclasses import dataclass, field

from builders import Json, resource_quota
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import (
    NAMESPACES,
    NODE_CHANGES,
    CardChange,
    ClusterSpec,
    NodeChange,
    QuotaChange,
    Tick,
    change_card,
    change_node,
    clusters,
    pods,
)

from vgpu_operator.control import feed as feed_module
from vgpu_operator.control import queue as queue_module
from vgpu_operator.devices import model
from vgpu_operator.scheduling.cycle.cluster import ClusterState, Decision

SCHEDULER = "vgpu-scheduler"


@dataclass(frozen=True)
class Arrive:
    """``copies`` pods alike but for their names (one shape: one verdict, one hint)."""

    pod: Json
    copies: int = 1


@dataclass(frozen=True)
class Work:
    """The worker decides up to ``pods`` due pods."""

    pods: int


@dataclass(frozen=True)
class End:
    pick: int
    how: str  # succeeded, deleted


Step = Arrive | Work | End | NodeChange | CardChange | QuotaChange | Tick

_NODE_WHAT = ("appear", *NODE_CHANGES)


@st.composite
def runs(draw: st.DrawFn) -> tuple[ClusterSpec, list[Step]]:
    spec = draw(clusters())
    uuids = sorted(spec.cards())
    plan: list[Step] = []
    for position in range(draw(st.integers(4, 40))):
        kind = draw(st.integers(0, 19))
        if kind <= 5:
            plan.append(Arrive(draw(pods(f"p{position}", uuids)), draw(st.sampled_from((1, 1, 3)))))
        elif kind <= 10:
            plan.append(Work(draw(st.integers(1, 6))))
        elif kind <= 13:
            plan.append(
                End(draw(st.integers(0, 20)), draw(st.sampled_from(("succeeded", "deleted"))))
            )
        elif kind == 14:
            plan.append(NodeChange(draw(st.integers(0, 3)), draw(st.sampled_from(_NODE_WHAT))))
        elif kind == 15:
            what = draw(st.sampled_from(("fail", "heal", "cordon", "uncordon")))
            plan.append(CardChange(draw(st.integers(0, 3)), draw(st.integers(0, 5)), what))
        elif kind == 16:
            gpumem = draw(st.sampled_from((None, 4096, 8192, 30000)))
            plan.append(QuotaChange(draw(st.sampled_from(NAMESPACES)), gpumem))
        else:
            plan.append(Tick(draw(st.sampled_from((0.5, 2.0, 20.0)))))
    return spec, plan


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Cluster:
    """The API server's view (the truth), and the operator's runtime fed from it."""

    spec: ClusterSpec
    clock: Clock = field(default_factory=Clock)
    version: int = 0
    nodes: dict[str, Json] = field(default_factory=dict)
    cards: dict[str, list[model.DeviceInfo]] = field(default_factory=dict)
    cordoned: dict[str, set[str]] = field(default_factory=dict)
    pods: dict[str, Json] = field(default_factory=dict)
    quotas: dict[str, Json] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.state = ClusterState(self.spec.config)
        self.queue = queue_module.SchedulingQueue(clock=self.clock, flush_after_s=10**9)
        self.feed = feed_module.StateFeed(
            self.state, self.queue, config=self.spec.config, wall_clock=self.clock
        )
        for node in self.spec.nodes:
            self.cards[node.name] = list(node.cards)
            self.cordoned[node.name] = set()
        # The first node is there from the start, the others appear later.
        self._appear(self.spec.nodes[0].name)
        for quota in self.spec.quotas:
            self._quota(quota)

    # --- the API server's side --------------------------------------------------------
    def _next(self) -> str:
        self.version += 1
        return str(self.version)

    def _appear(self, name: str) -> None:
        if name in self.nodes:
            return
        spec = next(n for n in self.spec.nodes if n.name == name)
        self.nodes[name] = spec.node()
        self._send_node(name)
        self._send_inventory(name)

    def _send_node(self, name: str) -> None:
        node = copy.deepcopy(self.nodes[name])
        node["metadata"]["resourceVersion"] = self._next()
        self.feed.node_event("MODIFIED", node)

    def _send_inventory(self, name: str) -> None:
        stamp = datetime.datetime.fromtimestamp(self.clock.now, datetime.UTC)
        devices = [
            {
                "uuid": card.id,
                "index": card.index,
                "model": card.type,
                "type": card.type,
                "memoryMiB": card.memory_mib,
                "cores": card.cores,
                "splitCount": card.count,
                "numaNode": card.numa,
                "health": "Healthy" if card.health else "Unhealthy",
                "mode": card.mode,
            }
            for card in self.cards[name]
        ]
        inventory = {
            "metadata": {"name": name, "resourceVersion": self._next()},
            "spec": {"cordonedDevices": sorted(self.cordoned[name])},
            "status": {
                "nodeName": name,
                "heartbeat": stamp.strftime("%Y-%m-%dT%H:%M:%SZ"),
                "devices": devices,
                "summary": {"gpuCount": len(devices), "healthyCount": 0, "totalMemoryMiB": 0},
            },
        }
        self.feed.inventory_event("MODIFIED", inventory)

    def _send_pod(self, key: str, deleted: bool = False) -> None:
        pod = self.pods[key]
        pod["metadata"]["resourceVersion"] = self._next()
        self.feed.pod_event("DELETED" if deleted else "MODIFIED", copy.deepcopy(pod))
        if deleted:
            del self.pods[key]

    def _quota(self, quota: Json) -> None:
        quota = copy.deepcopy(quota)
        quota["metadata"]["resourceVersion"] = self._next()
        self.quotas[quota["metadata"]["namespace"]] = quota
        self.feed.quota_event("MODIFIED", quota)

    # --- steps --------------------------------------------------------------------------
    def apply(self, step: Step) -> None:
        if isinstance(step, Arrive):
            for copy_number in range(step.copies):
                pod = copy.deepcopy(step.pod)
                meta = pod["metadata"]
                meta["name"] = f"{meta['name']}-{copy_number}"
                meta["uid"] = f"uid-{meta['name']}"
                pod["spec"]["schedulerName"] = SCHEDULER
                pod["status"] = {"phase": "Pending"}
                key = f"{meta['namespace']}/{meta['name']}"
                self.pods[key] = pod
                self._send_pod(key)
        elif isinstance(step, Work):
            for _ in range(step.pods):
                key = self.queue.pop()
                if key is None:
                    break
                self._decide(key)
        elif isinstance(step, End):
            placed = sorted(k for k, p in self.pods.items() if p["spec"].get("nodeName"))
            if placed:
                key = placed[step.pick % len(placed)]
                if step.how == "deleted":
                    self._send_pod(key, deleted=True)
                else:
                    self.pods[key]["status"] = {"phase": "Succeeded"}
                    self._send_pod(key)
        elif isinstance(step, NodeChange):
            self._change_node(self.spec.nodes[step.node % len(self.spec.nodes)].name, step.what)
        elif isinstance(step, CardChange):
            name = self.spec.nodes[step.node % len(self.spec.nodes)].name
            if name in self.nodes:
                self._change_card(name, step.card, step.what)
        elif isinstance(step, QuotaChange):
            self._quota(resource_quota(step.namespace, gpumem=step.gpumem))
        else:
            self.clock.now += step.seconds

    def _decide(self, key: str) -> None:
        """What the worker does with a popped pod (Bindings succeed at once here)."""
        pod = self.feed.pending_pod(key)
        if pod is None:
            self.queue.remove(key)
            return
        decision = self.state.schedule(pod, self.clock.now)
        self.feed.settle_releases()
        if decision.scheduled:
            self.feed.binding_started(key, pod["metadata"]["uid"])
            self.state.confirm(key)
            self.feed.binding_succeeded(key)
            truth = self.pods[key]
            truth["metadata"]["annotations"] = {
                **(truth["metadata"].get("annotations") or {}),
                **decision.annotations,
            }
            truth["spec"]["nodeName"] = decision.node
            truth["status"] = {"phase": "Running"}
            self._send_pod(key)
            return
        self.queue.park(key, hint=_hint(decision, pod))

    def _change_node(self, name: str, what: str) -> None:
        if what == "appear" or name not in self.nodes:
            self._appear(name)
            return
        change_node(self.nodes[name], what)
        self._send_node(name)

    def _change_card(self, name: str, index: int, what: str) -> None:
        change_card(self.cards[name], self.cordoned[name], index, what)
        self._send_inventory(name)

    # --- the oracle -------------------------------------------------------------------
    def fits_afresh(self, key: str) -> Decision:
        """The pod decided by a reference engine built from the cluster as it is."""
        fresh = ClusterState(self.spec.config)
        fresh.use_index = False
        for name, node in self.nodes.items():
            fresh.set_node(node)
            fresh.set_inventory(
                name, self.cards[name], {}, heartbeat=None, cordoned=sorted(self.cordoned[name])
            )
        for quota in self.quotas.values():
            fresh.set_quota(quota)
        for pod in self.pods.values():
            if pod["spec"].get("nodeName"):
                fresh.set_pod(pod)
        return fresh.schedule(self.pods[key], self.clock.now)


def _hint(decision: Decision, pod: Json) -> Hashable | None:
    """The hint the worker parks a pod with (``worker._decide``)."""
    if decision.rejected is not None:
        return queue_module.Refused(pod["metadata"]["namespace"])
    if decision.diagnosis is not None and decision.diagnosis.error is not None:
        return queue_module.OWN_CHANGE_ONLY
    return decision.verdict


@settings(max_examples=300, deadline=None)
@given(runs())
def test_no_pod_that_could_fit_stays_unschedulable(run: tuple[ClusterSpec, list[Step]]) -> None:
    spec, plan = run
    cluster = Cluster(spec)
    #: Waiting pods a binding made fit (below): the flush's to retry, not an event's.
    flushed: set[str] = set()
    for position, step in enumerate(plan):
        cluster.apply(step)
        waiting = {k for k in cluster.pods if cluster.queue.is_unschedulable(k)}
        flushed &= waiting
        if isinstance(step, Work):
            # A Work step only takes room (it binds pods or parks them). HAMi's Fit is not
            # monotonic in the room left, though: a pod bound elsewhere reorders a node's
            # cards, and with the quota check counting every candidate tried before the
            # chosen card (hami-semantics 14.6) a waiting pod may fit after a binding.
            # No queueing hint treats a binding as help (kube-scheduler's neither); the
            # flush retries such pods. So only events that can free room are checked, and
            # a pod a binding made fit is the flush's until it is tried again (a later
            # event that frees nothing for it, or sends nothing at all, need not wake it).
            flushed |= {k for k in waiting if cluster.fits_afresh(k).scheduled}
            continue
        for key in list(cluster.pods):
            if key in flushed:
                continue
            if cluster.queue.is_unschedulable(key):
                decision = cluster.fits_afresh(key)
                assert not decision.scheduled, (
                    f"step {position} ({step}): {key} could fit on {decision.node} "
                    "but no event woke it"
                )
